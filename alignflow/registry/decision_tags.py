"""The names under which a promotion decision is kept on a model version, and the metrics it skips.

Apart from :mod:`alignflow.registry.promotion`, which writes them, so that what reads them (the
model card, the CLI) does not import the promotion machinery.
"""

from __future__ import annotations

DECISION_TAG = "promotion.decision"
FAILED_GATES_TAG = "promotion.failed_gates"
GATES_TAG = "promotion.gates"
GATE_TAG_PREFIX = "promotion.gate."
JUDGES_TAG = "promotion.judges"
JUDGE_AUDIT_TAG = "promotion.judge_audit"
REASON_TAG = "promotion.reason"
PREVIOUS_CHAMPION_TAG = "champion.previous"
PROMOTED_AT_TAG = "champion.promoted_at"
# the decision in a few short tags, for the version page and search (beside the promotion.* ones)
OUTCOME_TAG = "decision"
OUTCOME_REASON_TAG = "decision.reason"
OUTCOME_FAILED_TAG = "decision.failed_gates"
DECIDED_AT_TAG = "decision.decided_at"
MAX_TAG_VALUE = 5000
SYSTEM_METRICS = "system/"  # MLflow's system metrics, on every run the CLI starts
