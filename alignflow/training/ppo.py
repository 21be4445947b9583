"""The pipeline's PPO stage, on alignflow's own PPO (:mod:`alignflow.rl.ppo`).

TRL 1.x has no PPO trainer, so this stage runs :class:`~alignflow.rl.ppo.PPOTrainer`'s own
loop (the research API's; there is no second one) and adds, through its hooks, the
guarantees every stage gives:

* checkpoints ``checkpoints/checkpoint-N`` are written into a staging folder and renamed
  into place, so a crash (even SIGKILL) never leaves a half-written one; a second call on
  the same ``output_dir`` resumes from the last one through ``PPOTrainer.load_checkpoint``
  (policy, value head, optimiser, scheduler, RNGs, KL controller, prompt order);
* per-iteration metrics go to the active MLflow run as ``train/...`` and to
  ``history.jsonl`` beside the checkpoints (one line per iteration; a resumed run first
  cuts it back to the checkpoint's history, so each iteration appears once);
* the final policy is a plain ``AutoModelForCausalLM`` folder (safetensors + tokenizer)
  under ``model/`` (the value head stays in the checkpoints).

With ``model.lora.enabled`` the policy trains LoRA adapters (PEFT); the reference is the
same network with its adapters switched off (no second copy of the weights), checkpoints
hold the adapters, and ``model/`` holds the policy with the adapters merged in.

Rewards: the reward stage's model (text in, scalar out, normalised with its saved
mean/std) and/or the demo task's verifiers, each with a weight. A caller may hand in its
own scorer for the reward model (``run_ppo(..., reward_scorer=...)``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from alignflow import progress
from alignflow.data.answers import correctness_reward, format_reward
from alignflow.data.halves import rows_for
from alignflow.data.pairing import require_rows
from alignflow.data.snapshot import load_split
from alignflow.errors import InputError
from alignflow.evaluation.metric_names import before_key, eval_key
from alignflow.evaluation.repetition import loops
from alignflow.models.factory import peft_config, select_dtype
from alignflow.models.prompting import format_prompt, generate
from alignflow.models.reward_scorer import load_reward_scorer
from alignflow.registry import tracking
from alignflow.rl.ppo import PPOConfig, PPOTrainer
from alignflow.training.checkpoints import (
    CHECKPOINTS,
    MODEL,
    last_complete_checkpoint,
    refuse_diverged_weights,
)
from alignflow.training.grpo import _decode_prompt, prompt_rows
from alignflow.training.held_out_best import HeldOutBest
from alignflow.training.ppo_config import PPOStageConfig
from alignflow.training.registry import REWARD_STAGE_REF
from alignflow.training.run_settings import RunSettings
from alignflow.training.stage import (
    StageResult,
    begin_stage,
    finish_stage,
    resolve_start_model,
)

Component = Callable[[list[Any], list[str], list[Mapping[str, Any]]], list[float]]
Scorer = Callable[[list[Any], list[str]], Sequence[float]]
HISTORY = "history.jsonl"
HELD_OUT = "eval/reward"  # the greedy held-out reward every eval_every iterations: what "best" means


# ---------------------------------------------------------------- rewards


class StageReward:
    """``reward_fn(prompts, responses, metadata)`` for PPOTrainer: a weighted sum of sources.

    The trainer hands over the *formatted* prompts; the reward model must read the
    original ones (it applies its own template), so they travel in ``metadata["prompt"]``.
    The last batch's per-source means are kept for logging.
    """

    def __init__(self, components: dict[str, tuple[float, Component]]):
        self.components = components
        self.last: dict[str, float] = {}

    def parts(
        self, prompts: Sequence[Any], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, list[float]]:
        return {
            name: fn(list(prompts), list(responses), list(metadata))
            for name, (_, fn) in self.components.items()
        }

    def __call__(self, prompts, responses, metadata) -> list[float]:
        parts = self.parts(prompts, responses, metadata)
        self.last = {name: sum(v) / max(len(v), 1) for name, v in parts.items()}
        return [
            sum(self.components[name][0] * parts[name][i] for name in parts) for i in range(len(responses))
        ]


def _correctness(prompts, responses, metadata) -> list[float]:
    return [correctness_reward(r, m["answer"]) for r, m in zip(responses, metadata, strict=True)]


def _format(prompts, responses, metadata) -> list[float]:
    return [format_reward(r) for r in responses]


def _loops(prompts, responses, metadata) -> list[float]:
    """1.0 for a response that loops: the share of a batch that does, as ``train/reward/loops``."""
    return [float(loops(r)) for r in responses]


def _scorer_component(scorer: Scorer) -> Component:
    def score(prompts, responses, metadata) -> list[float]:
        return [float(r) for r in scorer([m["prompt"] for m in metadata], list(responses))]

    return score


def build_stage_reward(
    stage: PPOStageConfig, device: torch.device, scorer: Scorer | None = None
) -> StageReward:
    """The configured reward sources; an unresolved ``@reward`` is an error, not a guess.

    ``scorer(prompts, responses)`` scores in place of the model at ``ppo.reward_model``
    (its outputs are used as they are: ``normalize_reward`` applies to a loaded model only).
    """
    components: dict[str, tuple[float, Component]] = {}
    if stage.reward_model:
        if stage.reward_model == REWARD_STAGE_REF and scorer is None:
            raise InputError(
                f"ppo.reward_model is {REWARD_STAGE_REF!r}, which only the retraining flow resolves; "
                "set it to a reward-stage model dir, or to null with ppo.verifiable_rewards"
            )
        scorer = scorer or load_reward_scorer(
            stage.reward_model, normalize=stage.normalize_reward, device=device
        )
        components["reward_model"] = (stage.weight("reward_model"), _scorer_component(scorer))
    elif scorer is not None:
        raise ValueError(
            "ppo: a reward scorer was given but ppo.reward_model is null; name the model it scores for"
        )
    verifiers = {"correctness": _correctness, "format": _format}
    for name in stage.verifiable_rewards:
        components[name] = (stage.weight(name), verifiers[name])
    if stage.loop_penalty:
        components["loops"] = (-stage.loop_penalty, _loops)
    return StageReward(components)


# ---------------------------------------------------------------- prompts


def load_prompts(data_dir: str | Path, split: str, stage: PPOStageConfig) -> list[dict[str, Any]]:
    """Distinct prompts of a split as ``{"prompt": original, "answer": ...}``."""
    rows = [
        {"prompt": _decode_prompt(r["raw_prompt"]), "answer": r["answer"]}
        for r in prompt_rows(data_dir, split)
    ]
    if stage.verifiable_rewards:
        for i, row in enumerate(rows):
            if row["answer"] is None:
                raise InputError(
                    f"{Path(data_dir) / f'{split}.parquet'}: prompt {i} ({str(row['prompt'])[:60]!r}) has no "
                    f"metadata.answer, which ppo.verifiable_rewards {stage.verifiable_rewards} need"
                )
    return rows


def fitting_prompts(
    rows: list[dict[str, Any]], tokenizer: Any, stage: PPOStageConfig
) -> list[dict[str, Any]]:
    """Rows whose formatted prompt leaves room for ``max_new_tokens`` within ``max_length``."""
    budget = stage.max_length - stage.max_new_tokens
    kept = []
    for row in rows:
        text = format_prompt(tokenizer, row["prompt"])
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= budget:
            kept.append(dict(row, text=text))
    return kept


# ---------------------------------------------------------------- trainer


def trainer_config(stage: PPOStageConfig, seed: int, checkpoints_dir: Path) -> PPOConfig:
    """The section's PPO knobs as the research trainer's own config (the section is one, extended):
    the trainer checkpoints into the stage's folder, every ``save_every`` and after the last
    iteration (at least once: a finished stage can always be resumed and inspected)."""
    knobs = {name: getattr(stage, name) for name in PPOConfig.model_fields}
    knobs.update(
        seed=seed, output_dir=str(checkpoints_dir), save_every=stage.save_every or stage.num_iterations
    )
    return PPOConfig(**knobs)


class AdaptersOff(nn.Module):
    """The reference policy of a LoRA run: the policy itself with its adapters switched off.

    The policy is held outside the module tree, so freezing the reference (which
    :class:`PPOTrainer` does) leaves the policy's adapters trainable.
    """

    def __init__(self, peft_model: nn.Module):
        super().__init__()
        # a PEFT model: disable_adapter() is PEFT's, unknown to nn.Module's typing
        self._policy: tuple[Any] = (peft_model,)

    def forward(self, **inputs: Any) -> Any:
        policy = self._policy[0]
        with policy.disable_adapter():
            return policy(**inputs)


def build_trainer(
    stage: PPOStageConfig, cfg: PPOConfig, start: str, dtype: torch.dtype, lora: Any = None
) -> PPOTrainer:
    """A PPOTrainer on the model at ``start``; with a PEFT ``lora`` config, on LoRA adapters."""
    tokenizer = AutoTokenizer.from_pretrained(start)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(start, dtype=dtype, use_safetensors=True)
    if stage.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    reference = None
    if lora is not None:
        from peft import get_peft_model

        if stage.gradient_checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(model, lora)
        reference = AdaptersOff(model)
    return PPOTrainer(cfg, model, tokenizer, reference_model=reference)


def save_policy(trainer: PPOTrainer, output_dir: Path) -> Path:
    """The trained policy (no value head) + tokenizer as a plain transformers folder.

    LoRA adapters are merged into the weights first (in place: call it once training is over).
    """
    target, staging = output_dir / MODEL, output_dir / ".model.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    policy: Any = trainer.model.base_model  # a transformers/PEFT model, typed nn.Module by PPOModel
    if hasattr(policy, "peft_config"):
        policy = policy.merge_and_unload()
    refuse_diverged_weights(policy, trainer.iteration, target)
    policy.save_pretrained(staging, safe_serialization=True)
    trainer.tokenizer.save_pretrained(staging)
    if target.exists():
        shutil.rmtree(target)
    staging.replace(target)
    return target


# ---------------------------------------------------------------- history


def write_history(output_dir: str | Path, history: Sequence[Mapping[str, Any]]) -> Path:
    """``history.jsonl`` rewritten (atomically) to exactly ``history``: one line per iteration."""
    path = Path(output_dir) / HISTORY
    tmp = path.with_name(HISTORY + ".tmp")
    tmp.write_text(
        "".join(json.dumps(dict(step), sort_keys=True) + "\n" for step in history), encoding="utf-8"
    )
    tmp.replace(path)
    return path


def append_history(output_dir: str | Path, step: Mapping[str, Any]) -> None:
    with (Path(output_dir) / HISTORY).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(step), sort_keys=True) + "\n")


def load_history(output_dir: str | Path) -> list[dict[str, float]]:
    """The per-iteration metrics of the PPO stage run in ``output_dir`` (iteration 1 first).

    A line cut short by a crash is left out; the next run on the folder rewrites the file.
    """
    path = Path(output_dir) / HISTORY
    if not path.exists():
        raise FileNotFoundError(f"{path}: no PPO history (has the PPO stage run in {output_dir}?)")
    steps = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return steps


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def greedy_rewards(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], reward: StageReward, stage: PPOStageConfig
) -> dict[str, float]:
    """Mean reward (total and per source) of greedy completions of ``rows``."""
    prompts = [r["prompt"] for r in rows]
    completions = generate(
        model,
        tokenizer,
        prompts,
        max_new_tokens=stage.max_new_tokens,
        batch_size=stage.per_device_eval_batch_size,
    )
    metadata = [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]
    total = reward(prompts, completions, metadata)
    return {"reward": sum(total) / len(total), **reward.last}


# ---------------------------------------------------------------- the stage


def _iteration_metrics(metrics: Mapping[str, Any], reward: StageReward, seconds: float) -> dict[str, float]:
    named = {k if k.startswith("eval/") else f"train/{k}": v for k, v in metrics.items() if k != "iteration"}
    named.update({f"train/reward/{k}": v for k, v in reward.last.items()})
    named["train/iteration_seconds"] = seconds
    return named


class IterationLog:
    """What the stage adds to each PPO iteration (``PPOTrainer.on_iteration``): the progress
    line, a line of ``history.jsonl`` and, every ``logging_steps`` and at the last, the
    ``train/...`` and ``eval/...`` metrics of the active MLflow run at that iteration."""

    def __init__(
        self,
        stage: PPOStageConfig,
        reward: StageReward,
        history_dir: Path,
        best: tuple[HeldOutBest, nn.Module] | None = None,
    ) -> None:
        self.stage, self.reward, self.history_dir, self.best = stage, reward, history_dir, best
        self.started = time.perf_counter()

    def __call__(self, step: Mapping[str, Any]) -> None:
        iteration, total = int(step["iteration"]), self.stage.num_iterations
        progress.step(iteration, total)
        append_history(self.history_dir, step)
        if self.best is not None and HELD_OUT in step:
            self.best[0].offer(iteration, float(step[HELD_OUT]), self.best[1])
        if iteration % self.stage.logging_steps == 0 or iteration == total:
            seconds = time.perf_counter() - self.started
            tracking.log_metrics(_iteration_metrics(step, self.reward, seconds), step=iteration)
        self.started = time.perf_counter()


def held_out_best(
    stage: PPOStageConfig,
    output_dir: Path,
    iteration: int,
    resumed: bool,
    metrics: Mapping[str, float],
    policy: nn.Module,
) -> HeldOutBest | None:
    """The best held-out step so far, where the stage hands on its best (``ppo.hand_on: best``
    with periodic evaluation); a fresh run offers its start as step 0, a resumed one reads what
    the interrupted run kept."""
    start = metrics.get(before_key(HELD_OUT.removeprefix("eval/")))
    if stage.hand_on != "best" or not stage.eval_every or start is None:
        return None
    best = HeldOutBest(output_dir)
    if resumed:
        best.resume(iteration)
    else:
        best.offer(0, start, policy)
    return best


def run_ppo(
    config: RunSettings,
    data_dir: str | Path,
    output_dir: str | Path,
    model_path: str | Path | None = None,
    reward_scorer: Scorer | None = None,
) -> StageResult:
    """PPO from ``model_path`` (the SFT policy) or the base model on the train prompts.

    ``reward_scorer(prompts, responses) -> rewards`` scores rollouts in place of loading
    ``ppo.reward_model`` (a custom reward model object). Metrics: greedy mean reward on the
    eval prompts before and after (``eval/before_reward``, ``eval/reward``, and per source),
    the last iteration's KL and coefficient, the iterations done (``global_step``); the
    per-iteration metrics are in ``history.jsonl`` (:func:`load_history`).
    """
    stage = config.section_as("ppo", PPOStageConfig)
    if config.model.lora.enabled and config.model.lora.quantization:
        raise InputError(
            "ppo: QLoRA (model.lora.quantization) is not supported by the PPO stage; "
            "set model.lora.quantization=null (plain LoRA works)"
        )
    seed, output_dir = begin_stage(stage, config.seed, output_dir)
    checkpoints_dir = output_dir / CHECKPOINTS

    cfg = trainer_config(stage, seed, checkpoints_dir)
    reward = build_stage_reward(
        stage, torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")), reward_scorer
    )
    train_rows = rows_for(load_prompts(data_dir, "train", stage), config.policy.reward_data, "policy")
    require_rows(train_rows, data_dir, "train", "prompt")
    eval_rows = load_prompts(data_dir, "eval", stage)[: stage.eval_max_rows or None]
    start = resolve_start_model(config.model, load_split(data_dir, "train"), output_dir, model_path)
    dtype = torch.float32 if config.model.dtype == "auto" else select_dtype(config.model)
    trainer = build_trainer(stage, cfg, start, dtype, lora=peft_config(config.model))
    train_rows = fitting_prompts(train_rows, trainer.tokenizer, stage)
    if not train_rows:
        raise InputError(
            f"{data_dir}/train.parquet: no prompt fits ppo.max_length ({stage.max_length} tokens)"
        )
    eval_rows = fitting_prompts(eval_rows, trainer.tokenizer, stage)

    metrics: dict[str, float] = {"train/prompts": float(len(train_rows))}
    if eval_rows:
        before = greedy_rewards(trainer.model.base_model, trainer.tokenizer, eval_rows, reward, stage)
        metrics.update({before_key(k): v for k, v in before.items()})

    checkpoint = last_complete_checkpoint(checkpoints_dir) if stage.resume else None
    if checkpoint is not None:
        trainer.load_checkpoint(checkpoint)
    else:
        tracking.log_params({"ppo": stage.model_dump(), "model": config.model.model_dump()})
        if stage.eval_every and eval_rows:  # the held-out curve starts where training did
            tracking.log_metrics({HELD_OUT: metrics[before_key("reward")]}, step=0)
    write_history(output_dir, trainer.history)  # a resumed run drops lines past its checkpoint

    policy = trainer.model.base_model
    best = held_out_best(stage, output_dir, trainer.iteration, checkpoint is not None, metrics, policy)
    trainer.on_iteration = IterationLog(stage, reward, output_dir, (best, policy) if best else None)
    if not eval_rows:  # nothing to score every eval_every iterations (the trainer would hold prompts out)
        trainer.config = trainer.config.model_copy(update={"eval_every": 0})
    trainer.train(
        [r["text"] for r in train_rows],
        reward,
        prompt_metadata=[{"prompt": r["prompt"], "answer": r["answer"]} for r in train_rows],
        evaluate=lambda: greedy_rewards(policy, trainer.tokenizer, eval_rows, reward, stage),
    )

    handed_on = trainer.iteration
    if best is not None and best.step is not None and best.step != trainer.iteration:
        best.restore(policy)
        handed_on = best.step
    if trainer.config.eval_every:  # a held-out curve was drawn: say which of its steps goes on
        metrics["handed_on_step"] = float(handed_on)
    if eval_rows:
        after = greedy_rewards(policy, trainer.tokenizer, eval_rows, reward, stage)
        metrics.update({eval_key(k): v for k, v in after.items()})
    last = trainer.history[-1] if trainer.history else {}
    metrics.update(
        {
            "global_step": float(trainer.iteration),
            "train/kl": float(last.get("objective/kl", 0.0)),
            "train/kl_coef": float(trainer.kl_ctl.value),
            "train/reward_mean": float(last.get("reward/mean", 0.0)),
        }
    )
    model_dir = save_policy(trainer, output_dir)
    return finish_stage("ppo", output_dir, model_dir, metrics, str(checkpoint) if checkpoint else None)
