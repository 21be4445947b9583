"""A/B serving: which arm a request goes to, and what people said of each served version.

Assignment is sticky without memory: a user key hashes to a fixed point in [0, 1), and the
challenger serves the keys below its share. The same key always lands on the same arm for
a given share (restarts included, since the share lives in the database), and raising the
share only moves champion users over, never back. A request without a key is assigned at
random. Ratings reach a version through the ``runId`` that ``generate`` returned.
"""

from __future__ import annotations

import hashlib
import random
from typing import TYPE_CHECKING

from alignflow.evaluation.intervals import bootstrap_mean, welch_difference
from alignflow.service.schemas import OnlineOut

if TYPE_CHECKING:  # the promotion code loads only when a verdict is asked for
    from alignflow.promotion.gates import PromotionDecision
    from alignflow.promotion.promotion_config import PromotionConfig

CHAMPION, CHALLENGER = "champion", "challenger"
HUMAN_JUDGE = "human"  # the judge name a live A/B verdict is recorded under


def hashed_user(agent_id: str, user_key: str) -> str:
    """What is stored of a user key: its hash within the agent, never the key itself."""
    return hashlib.sha256(f"{agent_id}\x1f{user_key}".encode()).hexdigest()[:32]


def user_point(hashed: str) -> float:
    return int(hashed[:16], 16) / 16**16


def assign_arm(hashed_key: str | None, challenger_share: float, rng: random.Random | None = None) -> str:
    """``challenger`` for keys below the share (random without a key), else ``champion``."""
    point = user_point(hashed_key) if hashed_key else (rng or random).random()
    return CHALLENGER if point < challenger_share else CHAMPION


def online_out(scores: list[float]) -> OnlineOut:
    """Ratings of one version's served completions: count, mean and its 95% interval."""
    estimate = bootstrap_mean(scores)
    return OnlineOut(count=len(scores), mean_score=estimate.value, low=estimate.low, high=estimate.high)


def human_metrics(scores: dict[str, list[float]], challenger: str, champion: str) -> dict[str, float]:
    """The human gate's metric (with its bounds and n) for ``challenger`` against ``champion``."""
    from alignflow.evaluation.intervals import put_estimate
    from alignflow.evaluation.metric_names import HUMAN_SCORE_GAIN

    metrics: dict[str, float | None] = {}
    gain = welch_difference(scores.get(challenger, []), scores.get(champion, []))
    put_estimate(metrics, HUMAN_SCORE_GAIN, gain)  # challenger's mean rating minus the champion's
    return {k: float(v) for k, v in metrics.items() if v is not None}


class AliasCache:
    """The agent's champion and challenger version numbers, read from the registry at most
    once per ``ttl_s`` (serving asks on every request; a promotion shows within seconds)."""

    def __init__(self, tracking_uri: str, ttl_s: float = 5.0):
        self.tracking_uri, self.ttl_s = tracking_uri, ttl_s
        self._cache: dict[str, tuple[float, dict[str, str | None]]] = {}

    def versions(self, agent_id: str) -> dict[str, str | None]:
        import time

        from alignflow.registry.models import alias_version, registered_name

        now = time.monotonic()
        cached = self._cache.get(agent_id)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        name = registered_name(agent_id, "policy")
        versions = {arm: alias_version(self.tracking_uri, name, arm) for arm in (CHAMPION, CHALLENGER)}
        self._cache[agent_id] = (now, versions)
        return versions


def human_verdict(
    agent_id: str,
    database_url: str,
    tracking_uri: str,
    config: PromotionConfig,
    version: str | None = None,
    dry_run: bool = False,
) -> PromotionDecision:
    """Judge the agent's challenger (or ``version``) against its champion on live ratings alone.

    Returns the :class:`~alignflow.promotion.gates.PromotionDecision`; unless ``dry_run``
    the decision is tagged on the version and ``champion`` moves when the human gate passes.
    Raises :class:`LookupError` when there is no champion or no challenger to compare.
    """
    from alignflow.promotion import gates
    from alignflow.registry import models, promotion
    from alignflow.service.storage import Store, make_engine

    name = models.registered_name(agent_id, "policy")
    champion = models.alias_version(tracking_uri, name, models.CHAMPION)
    version = version or models.alias_version(tracking_uri, name, models.CHALLENGER)
    if champion is None or version is None or version == champion:
        raise LookupError(f"{name}: the human gate needs a champion and a different challenger")
    engine = make_engine(database_url)
    try:
        scores = Store(engine).online_scores(agent_id)
    finally:
        engine.dispose()
    metrics = human_metrics(scores, challenger=version, champion=champion)
    if dry_run:
        return gates.decide(name, version, metrics, config, "policy", champion, [HUMAN_JUDGE], human=True)
    return promotion.promote(
        tracking_uri, name, version, metrics, config, "policy", [HUMAN_JUDGE], human=True
    )
