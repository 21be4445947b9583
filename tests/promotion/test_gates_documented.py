"""Every gate a decision can show is in the README's gate table: a user who reads a gate's
name in the run output, the API log or the MLflow UI finds what it means."""

from __future__ import annotations

import re
from pathlib import Path

from alignflow.promotion.gates import RELEASE_GATE, SLICE_GATE, TRAINED_WEIGHTS_GATE, gates_for
from alignflow.promotion.promotion_config import PromotionConfig

README = Path(__file__).resolve().parents[2] / "README.md"
JUDGE = "<judge>"


def documented_gates() -> set[str]:
    """The names in the first column of the README's table headed ``| gate | when | passes when |``."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index("| gate | when | passes when |")
    names: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def every_gate() -> set[str]:
    """Each gate ``gates_for`` can make (every role, with and without a champion, answers, a
    judge, the human gate, every threshold that is off by default switched on) and the ones that
    decisions add themselves."""
    off_by_default = [name for name, field in PromotionConfig.model_fields.items() if field.default is None]
    config = PromotionConfig(**dict.fromkeys(off_by_default, 0.5))
    names = {SLICE_GATE, RELEASE_GATE, TRAINED_WEIGHTS_GATE}
    for role, human in (("policy", False), ("policy", True), ("reward", False)):
        for has_champion in (False, True):
            for has_answers in (True, False):
                for gate in gates_for(config, role, has_champion, [JUDGE], has_answers, human, True):
                    names.add(gate.name)
    return names


def test_the_readme_gate_table_lists_every_gate():
    missing = every_gate() - documented_gates()
    assert not missing, f"gates the README's gate table does not list: {sorted(missing)}"
