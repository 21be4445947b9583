"""The pipeline's PPO stage: config, reward sources, learning, tracking, crash-safe resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from alignflow.config import ConfigError
from alignflow.training.ppo import (
    StageReward,
    build_stage_reward,
    load_history,
    load_prompts,
    run_ppo,
    trainer_config,
)
from tests.training.held_out_checks import assert_hands_on_the_best_step

REPO = Path(__file__).resolve().parents[2]
VERIFIERS = ["ppo.reward_model=null", "ppo.verifiable_rewards=[correctness,format]"]


# ---------------------------------------------------------------- config and rewards (fast)


def test_the_ppo_section_is_the_research_ppo_config_under_any_of_its_names(demo_config):
    from alignflow.rl import PPOConfig

    by_ppo = demo_config(*VERIFIERS, "ppo.num_iterations=7", "ppo.batch_size=12", "ppo.save_every=3").ppo
    by_spec = demo_config(*VERIFIERS, "ppo.iterations=7", "ppo.batch_size=12", "ppo.save_every=3").ppo
    by_stage = demo_config(
        *VERIFIERS, "ppo.max_steps=7", "ppo.per_device_train_batch_size=12", "ppo.save_steps=3"
    )
    assert isinstance(by_ppo, PPOConfig) and by_ppo == by_spec == by_stage.ppo
    assert (by_ppo.max_steps, by_ppo.per_device_train_batch_size, by_ppo.save_every) == (7, 12, 3)
    spec_names = demo_config(*VERIFIERS, "ppo.clip_ratio=0.3", "ppo.lam=0.9", "ppo.kl_penalty_coef=0.2").ppo
    assert (spec_names.clip_param, spec_names.gae_lambda, spec_names.kl_coef) == (0.3, 0.9, 0.2)
    cfg = trainer_config(by_ppo.model_copy(update={"mini_batch_size": 4}), seed=5, checkpoints_dir=Path("x"))
    assert type(cfg) is PPOConfig
    assert (cfg.num_iterations, cfg.batch_size, cfg.mini_batch_size, cfg.seed) == (7, 12, 4, 5)
    # the research trainer's own loop checkpoints into the stage's folder, keeping the stage's limit,
    # and builds the stage's optimiser schedule itself (nothing is replaced from outside)
    assert (cfg.save_every, cfg.output_dir, cfg.save_total_limit) == (3, "x", by_ppo.save_total_limit)
    assert (cfg.lr_scheduler_type, cfg.warmup_ratio, cfg.weight_decay) == ("constant", 0.0, 0.0)
    never = trainer_config(by_ppo.model_copy(update={"save_every": 0}), seed=5, checkpoints_dir=Path("x"))
    assert never.save_every == 7  # saved once, after the last iteration: a finished stage can resume


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("ppo.reward_model=null", "no reward source"),
        ("ppo.reward_weights={bogus: 1.0}", "unknown source"),
        ("ppo.verifiable_rewards=[length]", "verifiable_rewards"),
        ("ppo.max_new_tokens=300", "max_new_tokens"),
        ("ppo.clip_rnge=0.1", "clip_rnge"),
        ("ppo.model_name=gpt2", "set by the pipeline"),
    ],
)
def test_bad_ppo_config_is_rejected_naming_the_key(demo_config, override, message):
    with pytest.raises(ConfigError, match=message):
        demo_config(override)


def test_pipeline_defaults_apply_only_where_no_name_of_the_field_is_given(demo_config):
    from alignflow.training.ppo_config import PPOStageConfig

    assert PPOStageConfig(reward_model="m").num_epochs == 2  # the pipeline's, not the spec's 4
    assert PPOStageConfig(reward_model="m", ppo_epochs=3).num_epochs == 3
    assert trainer_config(demo_config(*VERIFIERS, "ppo.top_k=5").ppo, 0, Path("x")).top_k == 5


def test_unresolved_reward_stage_reference_is_an_error(demo_config, demo_snapshot, tmp_path):
    config = demo_config()
    assert config.ppo.reward_model == "@reward"
    with pytest.raises(ValueError, match="only the retraining flow resolves"):
        run_ppo(config, demo_snapshot, tmp_path)
    assert not (tmp_path / "model").exists()


def test_verifiers_need_each_prompts_answer(demo_config, tmp_path):
    from alignflow.data.snapshot import write_split

    rows = [
        {"id": "a", "kind": "prompt", "prompt": "What is 1 plus 2?", "metadata": {"answer": 3}},
        {"id": "b", "kind": "prompt", "prompt": "Say hello", "metadata": {}},
    ]
    write_split(tmp_path, "train", rows)
    stage = demo_config(*VERIFIERS).ppo
    with pytest.raises(ValueError, match=r"train\.parquet: prompt 1 \('Say hello'\) has no metadata\.answer"):
        load_prompts(tmp_path, "train", stage)
    only_format = stage.model_copy(update={"verifiable_rewards": []})
    assert [r["answer"] for r in load_prompts(tmp_path, "train", only_format)] == [3, None]


def test_stage_reward_is_the_weighted_sum_of_its_sources(demo_config):
    stage = demo_config(*VERIFIERS, "ppo.reward_weights={format: 0.5}").ppo
    reward = build_stage_reward(stage, torch.device("cpu"))
    assert isinstance(reward, StageReward) and list(reward.components) == ["correctness", "format"]
    meta = [{"prompt": "What is 3 plus 4?", "answer": 7}] * 3
    responses = ["The answer is 7.", "The answer is 8.", "seven"]
    assert reward(["p"] * 3, responses, meta) == pytest.approx([1.5, 0.5, 0.0])
    assert reward.last == pytest.approx({"correctness": 1 / 3, "format": 2 / 3})


def test_a_looping_response_loses_the_loop_penalty_and_the_batch_loop_share_is_logged(demo_config):
    stage = demo_config(*VERIFIERS, "ppo.loop_penalty=2.0").ppo
    reward = build_stage_reward(stage, torch.device("cpu"))
    meta = [{"prompt": "What is 3 plus 4?", "answer": 7}] * 2
    looping = "The answer is 7. I'm not sure. I'm not sure. I'm not sure. I'm not sure. I'm not sure."
    assert reward(["p"] * 2, ["The answer is 7.", looping], meta) == pytest.approx([2.0, 2.0 - 2.0])
    assert reward.last["loops"] == 0.5
    assert "loops" not in build_stage_reward(demo_config(*VERIFIERS).ppo, torch.device("cpu")).components


# ---------------------------------------------------------------- training (slow)


def _ppo_overrides(*extra: str) -> list[str]:
    return [
        *VERIFIERS,
        "ppo.batch_size=16",
        "ppo.mini_batch_size=8",
        "ppo.learning_rate=3e-4",
        "ppo.max_new_tokens=8",
        "ppo.eval_max_rows=48",
        *extra,
    ]


@pytest.mark.slow
def test_ppo_raises_the_verifiable_reward_and_logs_each_iteration(
    demo_config, demo_snapshot, sft_result, tmp_path
):
    import mlflow
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    overrides = ("ppo.iterations=40", "ppo.save_every=10", "ppo.eval_every=20", "ppo.hand_on=last")
    config = demo_config(*_ppo_overrides(*overrides))
    try:
        experiment = mlflow.create_experiment("ppo", artifact_location=(tmp_path / "art").as_uri())
        with mlflow.start_run(experiment_id=experiment) as run:
            result = run_ppo(config, demo_snapshot, tmp_path / "ppo", model_path=sft_result.model_dir)
    finally:
        mlflow.set_tracking_uri(previous)
    assert (tmp_path / "art" / run.info.run_id / "artifacts" / "ppo" / "model" / "model.safetensors").exists()

    client = MlflowClient(uri)
    history = client.get_metric_history(run.info.run_id, "train/reward/mean")
    rewards = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(1, 41))
    early, late = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert late > early + 0.15, f"sampled reward did not rise: {early:.3f} -> {late:.3f}"
    logged = client.get_run(run.info.run_id).data
    assert {"train/objective/kl", "train/reward/correctness", "train/reward/format"} <= set(logged.metrics)
    assert logged.params["ppo.num_iterations"] == "40"
    evaluated = client.get_metric_history(run.info.run_id, "eval/reward")  # every eval_every iterations
    assert sorted(m.step for m in evaluated) == [0, 20, 40], "from the start, then every eval_every"
    assert min(evaluated, key=lambda m: m.step).value == pytest.approx(result.metrics["eval/before_reward"])
    assert logged.metrics["ppo/global_step"] == 40
    # greedy eval reward is measured before and after (it is not what PPO optimises: sampled reward is)
    assert {"eval/before_reward", "eval/reward", "eval/correctness", "eval/format"} <= set(result.metrics)
    assert abs(result.metrics["train/kl"]) < 5.0

    assert json.loads((tmp_path / "ppo" / "result.json").read_text())["stage"] == "ppo"
    names = sorted(p.name for p in (tmp_path / "ppo" / "checkpoints").iterdir())
    assert names == ["checkpoint-30", "checkpoint-40"]  # save_total_limit=2, no staging leftovers
    model_dir = Path(result.model_dir)
    assert not list(model_dir.glob("value_head*")) and not list(model_dir.glob("*.bin"))
    policy = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    trained = load_file(model_dir / "model.safetensors")
    start = load_file(Path(sft_result.model_dir) / "model.safetensors")
    assert any(not torch.equal(trained[k], start[k]) for k in start)
    assert (
        policy.config.vocab_size
        == AutoModelForCausalLM.from_pretrained(sft_result.model_dir).config.vocab_size
    )


@pytest.mark.slow
def test_ppo_hands_on_its_best_held_out_step_and_says_which(demo_config, demo_snapshot, sft_result, tmp_path):
    """A learning rate that wrecks the policy: its held-out reward falls, and the stage hands on
    the best step it measured (the start, step 0, when nothing beat it), not the last."""
    wrecking = _ppo_overrides(
        "ppo.iterations=4", "ppo.eval_every=2", "ppo.learning_rate=0.05", "ppo.eval_max_rows=16"
    )
    result = run_ppo(
        demo_config(*wrecking), demo_snapshot, tmp_path / "best", model_path=sft_result.model_dir
    )
    measured = {
        h["iteration"]: h["eval/reward"] for h in load_history(tmp_path / "best") if "eval/reward" in h
    }
    scores = {0: result.metrics["eval/before_reward"], **measured}
    assert sorted(scores) == [0, 2, 4]
    start = sft_result.model_dir
    assert_hands_on_the_best_step(result.metrics, scores, result.model_dir, start, rescored="eval/reward")

    last = run_ppo(
        demo_config(*wrecking, "ppo.hand_on=last"),
        demo_snapshot,
        tmp_path / "last",
        model_path=sft_result.model_dir,
    )
    assert last.metrics["handed_on_step"] == 4 and last.metrics["eval/reward"] == pytest.approx(scores[4])


@pytest.mark.slow
def test_ppo_stage_scores_with_a_reward_stage_model(demo_config, demo_snapshot, sft_result, tmp_path):
    """What the retraining flow does: the reward stage's model dir in ppo.reward_model."""
    from alignflow.models.reward_scorer import RewardMeta
    from alignflow.training.reward import run_reward

    reward_config = demo_config("reward.max_steps=10", "reward.save_steps=1000", "reward.eval_max_rows=32")
    reward = run_reward(reward_config, demo_snapshot, tmp_path / "reward", model_path=sft_result.model_dir)
    meta = RewardMeta.load(reward.model_dir)
    config = demo_config(
        *_ppo_overrides("ppo.iterations=2", "ppo.eval_max_rows=16"),
        f"ppo.reward_model={reward.model_dir}",
        "ppo.verifiable_rewards=[format]",
    )
    result = run_ppo(config, demo_snapshot, tmp_path / "ppo", model_path=sft_result.model_dir)
    assert {"eval/before_reward_model", "eval/before_format", "eval/reward_model"} <= set(result.metrics)
    assert result.metrics["eval/before_reward"] == pytest.approx(
        result.metrics["eval/before_reward_model"] + result.metrics["eval/before_format"]
    )
    assert meta.std > 0 and result.metrics["global_step"] == 2


# ---------------------------------------------------------------- crash safety (slow)

RESUME_SCRIPT = """
import sys
from alignflow.config import load_config
from alignflow.training.ppo import run_ppo
data_dir, output_dir, model_path, *overrides = sys.argv[1:]
run_ppo(load_config({config!r}, overrides), data_dir, output_dir, model_path=model_path)
"""


def _ppo_command(data_dir: Path, output_dir: Path, model_dir: str) -> list[str]:
    overrides = _ppo_overrides(
        "ppo.iterations=6", "ppo.batch_size=8", "ppo.mini_batch_size=4", "ppo.save_every=2",
        "ppo.save_total_limit=null", "ppo.eval_max_rows=8",
    )  # fmt: skip
    script = RESUME_SCRIPT.format(config=str(REPO / "configs" / "demo.yaml"))
    return [sys.executable, "-c", script, str(data_dir), str(output_dir), model_dir, *overrides]


def _run_to_end(command: list[str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((Path(command[4]) / "result.json").read_text())


def _kill_after(command: list[str], checkpoint: Path) -> None:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    deadline = time.monotonic() + 600
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the stage finished before it could be killed"


@pytest.mark.slow
def test_sigkilled_ppo_stage_resumes_to_the_same_policy(demo_snapshot, sft_result, tmp_path):
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    _kill_after(
        _ppo_command(demo_snapshot, killed, sft_result.model_dir), killed / "checkpoints" / "checkpoint-2"
    )
    assert not (killed / "result.json").exists()
    resumed = _run_to_end(_ppo_command(demo_snapshot, killed, sft_result.model_dir))
    reference = _run_to_end(_ppo_command(demo_snapshot, straight, sft_result.model_dir))

    step = int(resumed["resumed_from"].rsplit("-", 1)[1])
    assert 2 <= step < 6 and reference["resumed_from"] is None
    assert resumed["metrics"] == pytest.approx(reference["metrics"], rel=1e-4, abs=1e-6)
    last = "checkpoints/checkpoint-6/trainer_state.json"
    history_a = json.loads((killed / last).read_text())["history"]
    history_b = json.loads((straight / last).read_text())["history"]
    assert len(history_a) == len(history_b) == 6
    for a, b in zip(history_a, history_b, strict=True):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6)
    a, b = (
        load_file(killed / "model" / "model.safetensors"),
        load_file(straight / "model" / "model.safetensors"),
    )
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


# ---------------------------------------------------------------- LoRA (slow)

LORA = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8"]


def _lora_run(demo_config, data_dir: Path, output_dir: Path, model_dir: str, iterations: int):
    overrides = _ppo_overrides(
        *LORA, f"ppo.iterations={iterations}", "ppo.batch_size=8", "ppo.mini_batch_size=4",
        "ppo.save_every=2", "ppo.save_total_limit=null", "ppo.eval_max_rows=8",
    )  # fmt: skip
    return run_ppo(demo_config(*overrides), data_dir, output_dir, model_path=model_dir)


@pytest.mark.slow
def test_lora_ppo_trains_adapters_against_the_unadapted_reference_and_saves_a_merged_policy(
    demo_config, demo_snapshot, sft_result, tmp_path
):
    from transformers import AutoModelForCausalLM

    from alignflow.models.factory import peft_config
    from alignflow.rl.ppo import PPOModel
    from alignflow.training.ppo import AdaptersOff, build_trainer

    result = _lora_run(demo_config, demo_snapshot, tmp_path / "ppo", sft_result.model_dir, iterations=2)
    checkpoint = tmp_path / "ppo" / "checkpoints" / "checkpoint-2"
    assert (checkpoint / "model" / "adapter_model.safetensors").exists()
    assert not (checkpoint / "model" / "model.safetensors").exists()  # the adapters only
    model_dir = Path(result.model_dir)
    assert not list(model_dir.glob("adapter_*")), "the final policy must be merged, not an adapter"
    start_dir = Path(sft_result.model_dir)
    merged, start = load_file(model_dir / "model.safetensors"), load_file(start_dir / "model.safetensors")
    assert merged.keys() == start.keys()
    assert any(not torch.equal(merged[k], start[k]) for k in start)
    assert [h["iteration"] for h in load_history(tmp_path / "ppo")] == [1, 2]

    # reloaded from the checkpoint: the reference is the policy with its adapters off
    config = demo_config(*VERIFIERS, *LORA)
    cfg = trainer_config(config.ppo, 0, tmp_path / "unused")
    trainer = build_trainer(config.ppo, cfg, str(start_dir), torch.float32, lora=peft_config(config.model))
    assert isinstance(trainer.ref_model, AdaptersOff) and isinstance(trainer.model, PPOModel)
    trainer.load_checkpoint(checkpoint)
    assert any(p.requires_grad for p in trainer.model.base_model.parameters())  # freezing ref left them
    trainer.model.eval()  # no LoRA dropout
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    plain = AutoModelForCausalLM.from_pretrained(start_dir, use_safetensors=True)
    saved = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    with torch.no_grad():
        torch.testing.assert_close(trainer.ref_model(input_ids=ids).logits, plain(input_ids=ids).logits)
        adapted = trainer.model.base_model(input_ids=ids).logits
        assert not torch.allclose(adapted, plain(input_ids=ids).logits)
        torch.testing.assert_close(adapted, saved(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_lora_ppo_resumes_to_the_same_policy_and_history(demo_config, demo_snapshot, sft_result, tmp_path):
    straight = _lora_run(demo_config, demo_snapshot, tmp_path / "straight", sft_result.model_dir, 4)
    _lora_run(demo_config, demo_snapshot, tmp_path / "resumed", sft_result.model_dir, 2)
    with (tmp_path / "resumed" / "history.jsonl").open("a") as fh:  # an iteration past the checkpoint
        fh.write('{"iteration": 3, "reward/mean": 99.0}\n{"iterat')  # and a line cut short by a crash
    resumed = _lora_run(demo_config, demo_snapshot, tmp_path / "resumed", sft_result.model_dir, 4)

    assert resumed.resumed_from.endswith("checkpoint-2") and straight.resumed_from is None
    assert resumed.metrics == pytest.approx(straight.metrics, rel=1e-4, abs=1e-6)
    history_a, history_b = load_history(tmp_path / "resumed"), load_history(tmp_path / "straight")
    assert [h["iteration"] for h in history_a] == [1, 2, 3, 4]
    for a, b in zip(history_a, history_b, strict=True):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6)
    a = load_file(tmp_path / "resumed" / "model" / "model.safetensors")
    b = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
