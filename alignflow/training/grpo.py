"""GRPO with TRL's GRPOTrainer and pluggable reward functions.

Reward functions (``grpo.reward_functions``) are built by :func:`build_reward_function`:
the demo task's verifiers (correctness, format; they read each prompt's ``answer``), a
trained reward model through :func:`alignflow.models.reward_scorer.load_reward_scorer`
(it re-tokenises the text with its own tokenizer), or user code named ``module:attribute``
(a function ``f(prompts, completions, **columns) -> list[float]``, or a class built with
no arguments whose instances are such functions).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig as TRLGRPOConfig
from trl import GRPOTrainer

from alignflow.data.answers import correctness_reward, format_reward
from alignflow.data.halves import rows_for
from alignflow.data.pairing import require_rows
from alignflow.data.snapshot import load_split
from alignflow.errors import InputError
from alignflow.evaluation.metric_names import eval_key
from alignflow.models.decoding import cpu_decoding
from alignflow.models.factory import inference_device, peft_config, trl_model_init_kwargs
from alignflow.models.merged_copy import MergedCopy, can_merge
from alignflow.models.positions import prompt_token_budget
from alignflow.models.prompting import completion_text, cut_prompt_text, format_prompt, generate
from alignflow.models.reward_scorer import load_reward_scorer
from alignflow.models.shared_prefill import sharing_prefills
from alignflow.registry.trainer_callback import TrackingCallback
from alignflow.training.checkpoints import StageTrainerMixin
from alignflow.training.grpo_config import GRPOConfig
from alignflow.training.held_out_best import HeldOutBest, HeldOutCurve
from alignflow.training.logprob_head import LabelHeadMixin
from alignflow.training.run_settings import RunSettings
from alignflow.training.stage import (
    StageResult,
    begin_stage,
    filter_known_args,
    resolve_start_model,
    train_and_finish,
    trainer_arguments,
)

RewardFn = Callable[..., list[float]]

HELD_OUT = eval_key("reward")  # the greedy held-out reward every eval_every steps: what "best" means


class AlignflowGRPOTrainer(StageTrainerMixin, LabelHeadMixin, GRPOTrainer):
    """TRL's GRPOTrainer with atomic checkpoints; with ``merged_generation``, a LoRA policy
    samples from a copy with its adapters folded in (:mod:`alignflow.models.merged_copy`)."""

    def __init__(self, *args: Any, merged_generation: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        usable = merged_generation and not self.use_vllm and can_merge(self.model)
        self.merged_copy = MergedCopy(self.model) if usable else None

    def sampling_model(self) -> Any:
        """The model to decode with now: the merged copy refreshed to the current adapters when
        there is one, else the policy itself."""
        return self.model if self.merged_copy is None else self.merged_copy.refresh(self.model)

    def _generate_single_turn(self, *args: Any, **kwargs: Any):
        """TRL's sampling, from the merged copy when there is one (TRL generates with the
        model it unwraps from ``model_wrapped``, so the copy stands in for that one call),
        each prompt of a group prefilled once (:mod:`alignflow.models.shared_prefill`), with
        :func:`~alignflow.models.decoding.cpu_decoding` on a CPU."""
        sampler, wrapped = self.sampling_model(), self.model_wrapped
        if self.merged_copy is not None:
            self.model_wrapped = sampler
        try:
            # cpu_decoding's generate goes first, and hands what it cannot take to the sharing one
            with sharing_prefills(self.accelerator.unwrap_model(self.model_wrapped)), cpu_decoding(sampler):
                return super()._generate_single_turn(*args, **kwargs)
        finally:
            self.model_wrapped = wrapped


def load_attribute(path: str) -> Any:
    """``package.module:attribute`` -> the attribute, with an error naming what is missing."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"{path}: cannot import module {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        raise InputError(f"{path}: module {module_name!r} has no attribute {attribute!r}") from exc


def _answers(kwargs: dict[str, Any], n: int) -> list[Any]:
    answers = kwargs.get("answer")
    if answers is None:
        raise InputError(
            "demo reward functions need an 'answer' per prompt (metadata.answer in the snapshot)"
        )
    return list(answers)[:n]


def correctness(prompts, completions, **kwargs) -> list[float]:
    """Demo verifier: 1 when the completion's number is the sum."""
    answers = _answers(kwargs, len(completions))
    return [correctness_reward(completion_text(c), a) for c, a in zip(completions, answers, strict=True)]


def answer_format(prompts, completions, **kwargs) -> list[float]:
    """Demo verifier: 1 when the completion says ``The answer is N.``."""
    return [format_reward(completion_text(c)) for c in completions]


def reward_model_function(path: str, normalize: bool = True) -> RewardFn:
    """A trained reward model as a reward function over the *original* prompts' text."""
    scorer = load_reward_scorer(path, normalize=normalize, device=inference_device())

    def reward_model(prompts, completions, **kwargs) -> list[float]:
        originals = [_decode_prompt(p) for p in kwargs.get("raw_prompt", prompts)]
        return scorer(originals, [completion_text(c) for c in completions])

    return reward_model


def build_reward_function(spec: Any) -> RewardFn:
    if spec.kind == "correctness":
        return correctness
    if spec.kind == "format":
        return answer_format
    if spec.kind == "reward_model":
        return reward_model_function(spec.path, spec.normalize)
    target = load_attribute(spec.path)
    if isinstance(target, type):
        target = target()
    if not callable(target):
        raise InputError(f"{spec.path}: a reward function must be callable, got {type(target).__name__}")
    if not hasattr(target, "__name__"):
        target.__name__ = spec.path.rsplit(":", 1)[-1]  # TRL names its reward metrics after it
    return target


def _encode_prompt(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def _decode_prompt(prompt: str) -> Any:
    return json.loads(prompt) if prompt.startswith("[") else prompt


def _original_prompt(row: dict[str, Any]) -> Any:
    return _decode_prompt(row["raw_prompt"])


def prompt_rows(data_dir: str | Path, split: str) -> list[dict[str, Any]]:
    """Distinct prompts of a split (prompt rows first, then those of pairs/scored rows)."""
    try:
        records = load_split(data_dir, split)
    except FileNotFoundError:
        return []
    records.sort(key=lambda r: r["kind"] != "prompt")
    seen, rows = set(), []
    for record in records:
        key = _encode_prompt(record["prompt"])
        if key in seen:
            continue
        seen.add(key)
        answer = (record.get("metadata") or {}).get("answer")
        rows.append({"raw_prompt": key, "answer": answer})
    return rows


def mean_reward(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], fns: list[RewardFn], weights, n_tokens
):
    """Greedy completions' weighted reward, averaged over ``rows``."""
    prompts = [_decode_prompt(r["raw_prompt"]) for r in rows]
    completions = generate(model, tokenizer, prompts, max_new_tokens=n_tokens)
    columns = {"raw_prompt": [r["raw_prompt"] for r in rows], "answer": [r["answer"] for r in rows]}
    total = [0.0] * len(rows)
    for fn, w in zip(fns, weights, strict=True):
        for i, value in enumerate(fn(prompts, completions, **columns)):
            total[i] += w * (value or 0.0)
    return sum(total) / max(len(total), 1)


def cut_train_prompts(trainer: Any, tokenizer: Any, stage: Any) -> int:
    """Cut the training prompts from the left so that each leaves ``max_completion_length``
    positions in a policy with a position table (GPT-2, OPT); how many were cut.

    TRL's GRPO generates from the whole prompt: one longer than the table allows crashed
    the first generation with ``IndexError``.
    """
    key = "grpo.max_completion_length"
    budget = prompt_token_budget(tokenizer, stage.max_completion_length, trainer.model, key=key)
    if budget is None:
        return 0
    prompts = trainer.train_dataset["prompt"]
    cut = [cut_prompt_text(tokenizer, prompt, budget) for prompt in prompts]
    changed = sum(a != b for a, b in zip(prompts, cut, strict=True))
    if changed:
        trainer.train_dataset = trainer.train_dataset.remove_columns("prompt").add_column("prompt", cut)
    return changed


def trl_grpo_args(
    config: RunSettings, stage: GRPOConfig, output_dir: str | Path, seed: int, weights: list[float]
) -> TRLGRPOConfig:
    """TRL's GRPOConfig as the stage builds it from ``config`` (its ``grpo`` section ``stage``)."""
    kwargs = trainer_arguments(stage, output_dir, config.model, seed, has_eval=False)
    kwargs.update(
        num_generations=stage.num_generations,
        max_completion_length=stage.max_completion_length,
        temperature=stage.temperature,
        beta=stage.beta,
        loss_type=stage.loss_type,
        scale_rewards=stage.scale_rewards,
        reward_weights=weights,
        model_init_kwargs=trl_model_init_kwargs(config.model),
        log_completions=False,
        cache_implementation=stage.cache_implementation,
    )
    return TRLGRPOConfig(**filter_known_args(TRLGRPOConfig, kwargs))


def allow_compiled_decoding(trainer: Any, stage: GRPOConfig) -> bool:
    """With ``grpo.compile_generation``, lift the ``disable_compile=True`` TRL puts in the
    GenerationConfig it generates with: transformers' ``generate`` then compiles its decoding
    step when the cache is static and the model on CUDA (it decides per call). Whether it did."""
    generation_config = getattr(trainer, "generation_config", None)
    if not stage.compile_generation or generation_config is None:  # vLLM: TRL builds none
        return False
    generation_config.disable_compile = False
    return True


def run_grpo(
    config: RunSettings, data_dir: str | Path, output_dir: str | Path, model_path: str | Path | None = None
) -> StageResult:
    """Optimise the policy on the snapshot's prompts; metrics: greedy eval reward before/after."""
    stage = config.section_as("grpo", GRPOConfig)
    seed, output_dir = begin_stage(stage, config.seed, output_dir)
    rows = rows_for(prompt_rows(data_dir, "train"), config.policy.reward_data, "policy", _original_prompt)
    require_rows(rows, data_dir, "train", "prompt")
    eval_rows = prompt_rows(data_dir, "eval")[: stage.eval_max_rows or None]
    start = resolve_start_model(config.model, load_split(data_dir, "train"), output_dir, model_path)
    tokenizer = AutoTokenizer.from_pretrained(start)
    fns = [build_reward_function(spec) for spec in stage.reward_functions]
    weights = [spec.weight for spec in stage.reward_functions]

    def dataset(items: list[dict[str, Any]]) -> Dataset:
        return Dataset.from_list(
            [dict(r, prompt=format_prompt(tokenizer, _decode_prompt(r["raw_prompt"]))) for r in items]
        )

    extra = {}
    if stage.environment:
        extra["environment_factory"] = load_attribute(stage.environment)
    trainer = AlignflowGRPOTrainer(
        model=start,
        reward_funcs=fns,
        args=trl_grpo_args(config, stage, output_dir, seed, weights),
        train_dataset=dataset(rows),
        processing_class=tokenizer,
        peft_config=peft_config(config.model),
        callbacks=[TrackingCallback({"grpo": stage.model_dump(), "model": config.model.model_dump()})],
        merged_generation=stage.merged_generation,
        **extra,
    )
    allow_compiled_decoding(trainer, stage)
    prompts_cut = {"prompts_cut": float(cut_train_prompts(trainer, tokenizer, stage))}

    measured: list[float] = []

    def held_out() -> dict[str, float]:  # the reward functions' mean on the eval prompts
        if not eval_rows:
            return {}
        n = stage.max_completion_length
        measured.append(mean_reward(trainer.sampling_model(), tokenizer, eval_rows, fns, weights, n))
        return {HELD_OUT: measured[-1]}

    curve = None
    if stage.eval_every and eval_rows:
        best = HeldOutBest(output_dir) if stage.hand_on == "best" else None
        curve = HeldOutCurve(
            stage.eval_every, lambda: held_out()[HELD_OUT], HELD_OUT, trainer.model, best, lambda: measured[0]
        )
        trainer.add_callback(curve)
    return train_and_finish("grpo", trainer, output_dir, stage.resume, prompts_cut, held_out, curve)
