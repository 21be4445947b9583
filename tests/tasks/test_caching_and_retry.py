from types import SimpleNamespace

from alignflow.code_version import package_digest
from alignflow.config import load_config, with_reward_model
from alignflow.plan import RunPlan
from alignflow.tasks.caching import stage_cache_key
from alignflow.tasks.retry import is_transient
from alignflow.tasks.stage_inputs import StageInputs
from alignflow.training.registry import REWARD_STAGE_REF


def key(name="sft", **params):
    context = SimpleNamespace(task=SimpleNamespace(name=name))
    base = {"data_version": "d1", "config_hash": "c1", "upstream": ""}
    return stage_cache_key(context, {**base, **params})


def test_cache_key_changes_with_each_input_and_not_otherwise():
    assert key() == key(output_dir="/elsewhere", parent_run_id="another-run")
    assert len({key(), key(data_version="d2"), key(config_hash="c2"), key(upstream="u"), key("reward")}) == 5
    assert package_digest() == package_digest() and len(package_digest()) == 16


def test_a_stage_task_keys_on_the_same_fields_of_its_inputs_model():
    context = SimpleNamespace(task=SimpleNamespace(name="sft"))
    inputs = StageInputs(config_json={}, data_dir="d", output_dir="/o", data_version="d1", config_hash="c1")
    assert stage_cache_key(context, {"inputs": inputs}) == key()
    moved = inputs.model_copy(update={"output_dir": "/elsewhere", "parent_run_id": "another-run"})
    assert stage_cache_key(context, {"inputs": moved}) == key()
    built_on = inputs.model_copy(update={"upstream": "u"})
    assert stage_cache_key(context, {"inputs": built_on}) == key(upstream="u")


def test_only_the_sections_a_stage_reads_change_its_hash():
    base = load_config(None)
    policy_changed = load_config(None, ["dpo.beta=0.3"])
    assert RunPlan(base).section_hash("sft") == RunPlan(policy_changed).section_hash("sft")
    assert RunPlan(base).section_hash("reward") == RunPlan(policy_changed).section_hash("reward")
    assert RunPlan(base).section_hash("policy") != RunPlan(policy_changed).section_hash("policy")
    gates_changed = load_config(None, ["promotion.min_win_rate_vs_champion=0.7"])
    assert RunPlan(base).section_hash("policy") == RunPlan(gates_changed).section_hash("policy")
    assert RunPlan(base).section_hash("promote") != RunPlan(gates_changed).section_hash("promote")
    other_algorithm_changed = load_config(None, ["grpo.beta=0.3"])  # the demo trains with DPO
    assert RunPlan(base).section_hash("policy") == RunPlan(other_algorithm_changed).section_hash("policy")
    grpo, tuned = (load_config(None, ["policy.algorithm=grpo", *extra]) for extra in ([], ["grpo.beta=0.3"]))
    assert RunPlan(grpo).section_hash("policy") != RunPlan(tuned).section_hash("policy")


def test_reward_stage_reference_is_replaced_everywhere():
    config = {
        "grpo": {"reward_functions": [{"kind": "reward_model", "path": REWARD_STAGE_REF}]},
        "x": "@rewardy",
    }
    replaced = with_reward_model(config, "/models/reward")
    assert replaced["grpo"]["reward_functions"][0]["path"] == "/models/reward"
    assert replaced["x"] == "@rewardy"


def test_only_transient_failures_are_retried():
    assert is_transient(ConnectionResetError()) and is_transient(TimeoutError())
    assert not is_transient(FileNotFoundError("data/train.parquet"))
    assert not is_transient(ValueError("bad config")) and not is_transient(None)
