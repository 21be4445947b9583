"""Disjoint training data for the reward model and the policy (``policy.reward_data: disjoint``).

A reward model trained on the pairs a policy was optimised on shares that policy's view of
them: as a judge of that policy it is not independent. Splitting the train prompts in two,
by a hash of the prompt's text, gives the reward model one half and every policy stage
(SFT, DPO family, GRPO, PPO) the other, so the run's own reward model judges a policy that
never saw its pairs. The hash depends on the prompt alone: every stage, run and machine
puts a prompt in the same half, and all rows of one prompt stay together.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any, Literal

from alignflow.data.checks import as_text

Role = Literal["reward", "policy"]
HALF_OF: dict[Role, int] = {"reward": 0, "policy": 1}


def prompt_half(prompt: Any) -> int:
    """0 or 1, from the prompt's text (whitespace-trimmed); chat prompts by their rendered text."""
    text = prompt if isinstance(prompt, str) else as_text(prompt)
    return hashlib.sha256(text.strip().encode("utf-8")).digest()[0] & 1


def rows_for(
    rows: Iterable[Any], reward_data: str, role: Role, prompt_of: Callable[[Any], Any] = itemgetter("prompt")
) -> list[Any]:
    """The rows ``role`` trains on: all of them (``reward_data`` "shared"), or those of its half
    ("disjoint")."""
    rows = list(rows)
    if reward_data != "disjoint":
        return rows
    return [row for row in rows if prompt_half(prompt_of(row)) == HALF_OF[role]]
