"""A run's plan, decided from its config alone: steps, cache keys, start models, reference, judge."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.config import load_config
from alignflow.plan import RunPlan
from alignflow.training.registry import REWARD_STAGE_REF
from alignflow.training.stage import StageResult

AFTER_TRAINING = ["evaluate", "register", "promote"]


def plan_of(*overrides: str, repo: Path | str = ".") -> RunPlan:
    return RunPlan(load_config(None, list(overrides)), repo)


def built_base_model(output_dir: Path) -> None:
    """What a stage that built its own tiny model leaves beside its outputs."""
    (output_dir / "base-model").mkdir(parents=True)
    (output_dir / "base-model" / "config.json").write_text("{}")


def test_the_steps_come_from_the_policy_and_reward_sections():
    plan = plan_of("policy.algorithm=grpo", "policy.reward_data=disjoint")
    assert [(s.role, s.stage, s.starts_from_sft) for s in plan.steps] == [
        ("sft", "sft", False),
        ("reward", "reward", False),
        ("policy", "grpo", True),
    ]
    assert plan.stage_names == ["data", "sft", "reward", "policy", *AFTER_TRAINING]
    assert plan_of("policy.run_sft=false").stage_names == ["data", "reward", "policy", *AFTER_TRAINING]


def test_the_live_view_lists_the_plans_stages():
    from alignflow.cli.pipeline import planned_stages

    config = load_config(None, ["policy.run_sft=false"])
    assert planned_stages(config) == RunPlan(config).stage_names


def test_each_step_is_keyed_by_the_sections_it_reads():
    base, retuned = plan_of(), plan_of("dpo.beta=0.3")
    assert base.sections("policy") == ("policy", "seed", "model", "dpo")
    assert base.section_hash("sft") == retuned.section_hash("sft")
    assert base.section_hash("policy") != retuned.section_hash("policy")
    assert base.output_dir("sft", "d1", "") == retuned.output_dir("sft", "d1", "")
    assert base.output_dir("policy", "d1", "") != retuned.output_dir("policy", "d1", "")
    assert base.output_dir("policy", "d1", "") != base.output_dir("policy", "d2", ""), (
        "the data version keys it"
    )
    assert base.output_dir("policy", "d1", "a") != base.output_dir("policy", "d1", "b"), (
        "so do upstream models"
    )
    gates = plan_of("promotion.min_win_rate_vs_champion=0.7")
    assert base.section_hash("policy") == gates.section_hash("policy")
    assert base.section_hash("promote") != gates.section_hash("promote")


def test_a_relative_output_dir_lives_in_the_repo_the_run_works_on(tmp_path):
    plan = plan_of("project=demo", repo=tmp_path)
    assert plan.out_root == tmp_path.resolve() / "outputs" / "demo"
    assert plan.output_dir("sft", "d1", "").parent == plan.out_root


def _fake_step(step, tmp_path: Path) -> StageResult:
    out = tmp_path / step.role
    return StageResult(step.role, str(out), str(out / "model"))


def test_each_planned_step_gets_its_start_its_config_and_its_upstream_key(tmp_path):
    plan = plan_of("policy.algorithm=ppo", f"ppo.reward_model='{REWARD_STAGE_REF}'")
    seen = {}

    def run_step(step):
        seen[step.role] = step
        return _fake_step(step, tmp_path)

    trained = plan.run_chain(run_step)
    assert list(trained) == ["sft", "reward", "policy"]
    sft_model = str(tmp_path / "sft" / "model")
    assert seen["sft"].start is None and seen["sft"].upstream == ""
    assert seen["reward"].start == sft_model and seen["reward"].upstream == f"init={sft_model}"
    assert seen["policy"].start == sft_model
    assert seen["policy"].upstream == f"sft={sft_model}|reward={tmp_path / 'reward'}"
    # only the policy's config points @reward at this run's reward model; the plan's stays as written
    assert seen["policy"].config().ppo.reward_model == str(tmp_path / "reward" / "model")
    assert seen["reward"].config_json == plan.config_json
    assert plan.config.ppo.reward_model == REWARD_STAGE_REF


def test_disjoint_reward_rows_key_the_sft_and_reward_steps(tmp_path):
    seen = {}
    plan_of("policy.reward_data=disjoint").run_chain(
        lambda step: seen.setdefault(step.role, step) and _fake_step(step, tmp_path)
    )
    assert seen["sft"].upstream == "|rows=disjoint-halves"
    assert seen["reward"].start is None, "the SFT model read the policy's half"
    assert seen["reward"].upstream == "init=|rows=disjoint-halves"


def test_the_policy_is_judged_against_its_sft_model_or_the_base_model_as_configured(tmp_path):
    sft_out = tmp_path / "sft"
    built_base_model(sft_out)
    trained = {
        "sft": {"model_dir": str(sft_out / "model"), "output_dir": str(sft_out)},
        "policy": {"model_dir": str(tmp_path / "policy" / "model"), "output_dir": str(tmp_path / "policy")},
    }
    assert plan_of().evaluation_reference(trained) == str(sft_out / "model")
    assert plan_of("evaluation.reference=base").evaluation_reference(trained) == str(sft_out / "base-model")
    built_base_model(tmp_path / "policy")
    no_sft = {"policy": trained["policy"]}
    assert plan_of("policy.run_sft=false").evaluation_reference(no_sft) == str(
        tmp_path / "policy" / "base-model"
    )
    named = plan_of("evaluation.reference=base", "model.name=minilm")
    elsewhere = {**trained, "sft": {**trained["sft"], "output_dir": str(tmp_path)}}
    assert named.evaluation_reference(elsewhere).endswith("model"), "no tiny model built: the named one"
    assert not named.evaluation_reference(elsewhere).startswith(str(tmp_path))


def test_the_rl_step_started_from_its_sft_model_else_from_the_chains_start(tmp_path):
    built_base_model(tmp_path / "policy")
    policy = {"model_dir": str(tmp_path / "policy" / "model"), "output_dir": str(tmp_path / "policy")}
    sft = {"model_dir": str(tmp_path / "sft" / "model"), "output_dir": str(tmp_path / "sft")}
    base = plan_of("evaluation.reference=base")
    assert base.rl_start({"sft": sft, "policy": policy}) == sft["model_dir"], "whatever the reference"
    no_sft = plan_of("policy.run_sft=false")
    assert no_sft.rl_start({"policy": policy}) == str(tmp_path / "policy" / "base-model")
    assert no_sft.rl_start({"policy": policy}) == no_sft.evaluation_reference({"policy": policy})


def test_the_evaluation_is_keyed_by_the_models_it_compares_and_the_pinned_set():
    trained = {"policy": {"model_dir": "/p"}, "reward": {"model_dir": "/r"}}
    plan = plan_of()
    key = plan.evaluation_upstream(trained, "3", "2", "g1")
    assert key == "policy=/p|reward=/r|champion=3|champion_reward=2|golden=g1"
    assert key != plan.evaluation_upstream(trained, "4", "2", "g1"), "a new champion re-evaluates"


@pytest.mark.parametrize(("overrides", "role"), [((), "reward"), (("data.label_check_max_gap=null",), None)])
def test_new_data_needs_a_label_judge_only_when_the_label_check_is_on(overrides, role):
    assert plan_of(*overrides).label_judge_role == role


def test_the_data_is_the_configured_source_or_the_demo_written_into_the_repo(tmp_path):
    assert plan_of("data.source=pairs.jsonl").data_source(tmp_path) == "pairs.jsonl"
    demo = Path(plan_of().data_source(tmp_path))
    assert demo.exists() and demo.resolve().is_relative_to(tmp_path.resolve())
    assert plan_of().data_source(tmp_path) == str(demo), "written deterministically: the same path"
