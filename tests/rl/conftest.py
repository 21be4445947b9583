"""What the research trainers' tests share."""

from __future__ import annotations

import pytest
from transformers import TrainerCallback


class LogsSeen(TrainerCallback):
    """A caller's callback: every log the loop hands its callbacks, in order."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append(dict(logs or {}))


@pytest.fixture
def logs_seen() -> LogsSeen:
    return LogsSeen()
