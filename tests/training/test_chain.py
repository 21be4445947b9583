"""The training chain's plan: which steps run, what each starts from, what its policy is judged on."""

import pytest

from alignflow.training.chain import ChainStep, chain_steps, held_out_prompts, run_chain
from alignflow.training.stage import StageResult


def plan(**choices) -> list[tuple[str, str, bool]]:
    return [(s.role, s.stage, s.starts_from_sft) for s in chain_steps(**choices)]


def test_sft_first_and_the_reward_model_on_the_policys_backbone_starts_from_it():
    assert plan(run_sft=True, algorithm="dpo") == [
        ("sft", "sft", False),
        ("reward", "reward", True),
        ("policy", "dpo", True),
    ]


@pytest.mark.parametrize(
    "choices",
    [
        {"reward_backbone": "minilm"},  # its own encoder: nothing of the SFT weights fits it
        {"reward_data": "disjoint"},  # the SFT model has read the policy's half of the prompts
    ],
)
def test_the_reward_model_starts_from_its_base_when_sft_weights_do_not_fit_it(choices):
    assert plan(run_sft=True, algorithm="grpo", **choices)[1] == ("reward", "reward", False)


def test_without_sft_every_step_starts_from_its_base():
    assert plan(run_sft=False, algorithm="ppo") == [("reward", "reward", False), ("policy", "ppo", False)]


def test_run_chain_hands_each_step_the_sft_model_and_the_results_before_it():
    calls = []

    def execute(step: ChainStep, start, done):
        calls.append((step.role, start, sorted(done)))
        return StageResult(step.role, f"/out/{step.role}", f"/out/{step.role}/model")

    results = run_chain(chain_steps(True, "dpo"), execute)
    assert calls == [
        ("sft", None, []),
        ("reward", "/out/sft/model", ["sft"]),
        ("policy", "/out/sft/model", ["reward", "sft"]),
    ]
    assert results["policy"].model_dir == "/out/policy/model"
    # a flow task's result is a dict: the chain reads its model folder the same way
    dicts = run_chain(
        chain_steps(True, "dpo"), lambda step, start, done: {"model_dir": f"{step.role}:{start}"}
    )
    assert dicts["policy"] == {"model_dir": "policy:sft:None"}


def test_held_out_prompts_are_the_eval_splits_distinct_prompts_else_the_train_splits(tmp_path, monkeypatch):
    from alignflow.data import snapshot

    splits = {"eval": ["q1", "q2", "q1", "q3"], "train": ["t1"]}
    monkeypatch.setattr(
        snapshot,
        "load_split",
        lambda data_dir, split, kind=None: [
            {"prompt": p, "metadata": {"i": i}} for i, p in enumerate(splits[split])
        ],
    )
    rows = held_out_prompts(tmp_path)
    assert [r["prompt"] for r in rows] == ["q1", "q2", "q3"]
    assert rows[0]["metadata"] == {"i": 0}  # the first record's metadata (its answer)
    assert [r["prompt"] for r in held_out_prompts(tmp_path, limit=2)] == ["q1", "q2"]
    splits["eval"] = []
    assert [r["prompt"] for r in held_out_prompts(tmp_path)] == ["t1"]
