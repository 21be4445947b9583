"""Feedback for the spec-002 API tests: raters who want one short answer, "OK.", and nothing else.

That preference is easy for a tiny reward model to learn and for PPO to reach from a
from-scratch policy in a few iterations, so the tests can check directions (the reward
goes up) in seconds on a CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TOPICS = [
    "rivers", "stars", "bread", "trains", "music", "chess", "rain", "cats",
    "glass", "maps", "tea", "bees", "clocks", "paper", "salt", "wind",
]  # fmt: skip
RAMBLES = [
    "I am not sure what you mean by that question at all.",
    "Well, there is a lot to say and I would rather talk about something else.",
    "Maybe later, this is a long story with many parts and details.",
]


def ok_ratings(topics: list[str] = TOPICS) -> list[dict]:
    """Per topic: "OK." rated 1.0 and two rambling answers rated 0.0 and 0.1."""
    rows = []
    for i, topic in enumerate(topics):
        prompt = f"Say OK if you know about {topic}."
        rows.append({"prompt": prompt, "response": "OK.", "score": 1.0, "runId": f"run-{i}"})
        rows.append({"prompt": prompt, "response": RAMBLES[i % 3], "score": 0.0})
        rows.append({"prompt": prompt, "response": RAMBLES[(i + 1) % 3], "score": 0.1})
    return rows


def ok_comparisons(topics: list[str] = TOPICS) -> list[dict]:
    """The same preference as comparisons: "OK." chosen over a rambling answer."""
    return [
        {"prompt": f"Say OK if you know about {topic}.", "chosen": "OK.", "rejected": RAMBLES[i % 3]}
        for i, topic in enumerate(topics)
    ]


@pytest.fixture(scope="session")
def feedback_list() -> list[dict]:
    return ok_ratings()


@pytest.fixture(scope="session")
def comparison_list() -> list[dict]:
    return ok_comparisons()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A fresh folder made the working directory for a module: spec 002's snippets write to
    relative paths (``models/my_agent/v1``)."""
    previous = Path.cwd()
    path = tmp_path_factory.mktemp("spec002")
    os.chdir(path)
    try:
        yield path
    finally:
        os.chdir(previous)
