"""Shared cases for the label check's tests (#47): a stand-in for the demo's champion reward
model and the issue's twelve correct near-miss pairs.

The demo's reward model was trained and audited on tier pairs (formatted vs sloppy, sloppy vs a
far-off number): it reads the format, not the arithmetic. :func:`tier_scorer` does the same.
"""

from __future__ import annotations

import re


def tier_scorer(prompts, completions):
    """Formatted answers first whatever their number (larger a little higher), then a right
    sloppy one, then a wrong one: right on every tier pair, wrong on most same-format near misses."""
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        said = [int(x) for x in re.findall(r"-?\d+", completion)]
        right = sum(int(x) for x in re.findall(r"\d+", prompt))
        if "The answer is" in completion:
            scores.append(3.0 + 0.01 * said[0])
        else:
            scores.append(1.0 if said[:1] == [right] else 0.0)
    return scores


def near_misses():
    """The issue's 12 correct pairs: best format on both sides, the rejected one off by one."""
    return [
        {
            "prompt": f"What is {a} plus 2?",
            "chosen": f"The answer is {a + 2}.",
            "rejected": f"The answer is {a + 3}.",
        }
        for a in range(12)
    ]


def stand_in_champion(monkeypatch) -> None:
    """A champion reward model (``tier_scorer``) for ``data add`` and the flow to ask, without
    training one."""
    import alignflow.cli.data as cli_data
    import alignflow.flows.retrain as retrain
    import alignflow.models.reward_scorer as reward_scorer

    monkeypatch.setattr(cli_data, "_registry_exists", lambda uri: True)
    monkeypatch.setattr(
        retrain, "label_judge", lambda plan, pipeline_run=None: {"model_dir": "champion", "accuracy": 0.94}
    )
    monkeypatch.setattr(reward_scorer, "load_reward_scorer", lambda *a, **k: tier_scorer)
