"""Disjoint reward and policy data (``policy.reward_data: disjoint``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from alignflow.data.halves import prompt_half, rows_for
from alignflow.data.normalize import normalize_row

REPO = Path(__file__).resolve().parents[2]


def _config(*overrides: str):
    from alignflow.config import load_config

    return load_config(REPO / "configs" / "demo.yaml", list(overrides))


def _demo_pairs(n: int) -> list[dict]:
    from alignflow.data.demo import iter_demo_pairs

    return [dict(r, kind="pair") for r in iter_demo_pairs(n, seed=0)]


def test_shared_data_gives_every_stage_every_row():
    rows = _demo_pairs(50)
    config = _config()
    assert (
        rows_for(rows, config.policy.reward_data, "reward")
        == rows
        == rows_for(rows, config.policy.reward_data, "policy")
    )


def test_disjoint_halves_split_the_prompts_between_reward_and_policy():
    rows = _demo_pairs(400)
    config = _config("policy.reward_data=disjoint")
    reward, policy = (
        rows_for(rows, config.policy.reward_data, "reward"),
        rows_for(rows, config.policy.reward_data, "policy"),
    )
    assert len(reward) + len(policy) == len(rows)  # every row goes to exactly one side
    reward_prompts = {json.dumps(r["prompt"]) for r in reward}
    policy_prompts = {json.dumps(r["prompt"]) for r in policy}
    assert reward_prompts and policy_prompts and not reward_prompts & policy_prompts
    assert 0.35 < len(reward) / len(rows) < 0.65  # a hash, not a bias to one side


def test_a_prompt_lands_in_the_same_half_whatever_its_rows_or_form():
    chat = [{"role": "user", "content": "How do I bake bread?"}]
    reordered = [{"content": "How do I bake bread?", "role": "user"}]
    assert prompt_half(chat) == prompt_half(reordered)
    assert prompt_half("  What is 2+2?\n") == prompt_half("What is 2+2?")
    halves = {prompt_half(f"prompt number {i}") for i in range(64)}
    assert halves == {0, 1}


def test_hh_conversations_split_near_evenly(hh_rlhf_path):
    with gzip.open(hh_rlhf_path, "rt", encoding="utf-8") as lines:
        rows = [normalize_row(json.loads(line)) for _, line in zip(range(600), lines, strict=False)]
    config = _config("policy.reward_data=disjoint")
    reward = rows_for(rows, config.policy.reward_data, "reward")
    assert 0.4 < len(reward) / len(rows) < 0.6
