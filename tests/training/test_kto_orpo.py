"""KTO and ORPO as policy algorithms of their own: a section each, a cache key each, and they learn."""

from __future__ import annotations

import json

import pytest

from alignflow.config import ConfigError, load_config
from alignflow.plan import RunPlan
from alignflow.training.kto_config import KTOConfig
from alignflow.training.orpo_config import ORPOConfig
from alignflow.training.registry import policy_algorithms, stage_spec


@pytest.mark.parametrize(("name", "kind"), [("kto", KTOConfig), ("orpo", ORPOConfig)])
def test_each_is_a_registered_algorithm_with_its_own_section_and_cache_key(name, kind):
    assert name in policy_algorithms() and stage_spec(name).needs_pairs
    config = load_config(None, [f"policy.algorithm={name}", f"{name}.beta=0.2"])
    assert isinstance(config.section(name), kind) and config.section_as(name, kind).beta == 0.2
    plan = RunPlan(config)
    assert plan.sections("policy") == ("policy", "seed", "model", name)
    assert plan.steps[-1].stage == name
    retuned = RunPlan(load_config(None, [f"policy.algorithm={name}", f"{name}.beta=0.3"]))
    assert retuned.section_hash("policy") != plan.section_hash("policy")
    assert retuned.section_hash("sft") == plan.section_hash("sft")


@pytest.mark.parametrize("name", ["kto", "orpo"])
def test_the_old_dpo_method_switch_names_the_algorithm_to_use(name):
    with pytest.raises(ConfigError, match=rf"policy\.algorithm={name} and its settings in a {name}: section"):
        load_config(None, [f"dpo.method={name}"])
    assert load_config(None, ["dpo.method=dpo"]).dpo == load_config(None).dpo, "plain DPO needs no switch"


def test_kto_answers_are_each_pairs_two_sides_and_the_unpaired_rows():
    from alignflow.training.kto import labelled_answers

    tokenizer = None  # as a base model's: no chat template, the prompt and a newline
    pairs = [{"prompt": "2 + 2?", "chosen": "4", "rejected": "5"}]
    unpaired = [{"prompt": "1 + 1?", "completion": "3", "label": False}]
    rows = labelled_answers(pairs, unpaired, tokenizer).to_list()
    assert [(r["completion"], r["label"]) for r in rows] == [("4", True), ("5", False), ("3", False)]
    assert [r["prompt"] for r in rows] == ["2 + 2?\n", "2 + 2?\n", "1 + 1?\n"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kto", "orpo"])
def test_it_learns_on_held_out_pairs(name, demo_snapshot, tiny_model_dir, demo_config, tmp_path):
    from alignflow.training.registry import stage_spec

    steps = 30
    config = demo_config(
        f"policy.algorithm={name}", f"{name}.max_steps={steps}", f"{name}.save_steps=1000",
        f"{name}.eval_max_rows=64", f"{name}.per_device_train_batch_size=8",
    )  # fmt: skip
    result = stage_spec(name).load_runner()(config, demo_snapshot, tmp_path, tiny_model_dir)
    m = result.metrics
    assert m["global_step"] == float(steps), m
    # measured from the tiny base model: KTO loss 0.500 -> 0.437, margin 0 -> 0.53;
    # ORPO loss 5.77 -> 4.68, margin -0.004 -> 0.015 (pair accuracy 0.33 -> 0.81)
    assert m["eval/loss"] < m["eval/before_loss"], m
    assert m["eval/rewards/margins"] > m["eval/before_rewards/margins"], m  # chosen over rejected
    assert json.loads((tmp_path / "result.json").read_text())["stage"] == name
    assert (tmp_path / "model" / "model.safetensors").exists()
