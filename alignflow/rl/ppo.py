"""PPO for language models: a policy with a value head, a frozen reference, an adaptive KL penalty.

TRL 1.x no longer ships a PPO trainer, so this is the one the pipeline runs. One iteration:

1. sample responses for a batch of prompts (or environment observations);
2. score them (``reward_fn`` or the environment), and compute per-token log-probs of the
   policy, the frozen reference and the value head's estimates;
3. reward per token = ``-kl_coef * (logp - logp_ref)`` plus the score on the last token,
   advantages by GAE (Schulman et al. 2016), whitened;
4. a few epochs of minibatch updates on the clipped PPO objective (Schulman et al. 2017)
   with clipped value loss and entropy bonus (:class:`alignflow.losses.PPOLoss`);
5. the KL coefficient moves toward the target KL (Ziegler et al. 2019).

Checkpoints hold the policy and value head (safetensors), optimiser and scheduler state
(safetensors + JSON), every RNG, the KL controller and the prompt order, so a resumed run
continues exactly where the interrupted one stopped.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from alignflow.losses import CustomLoss, KLDivergenceLoss, PPOLoss
from alignflow.losses.functional import entropy_from_logits, logprobs_from_logits, masked_mean, whiten
from alignflow.models.positions import prompt_token_budget
from alignflow.models.prompting import left_padded_batch
from alignflow.rl.checkpoint_files import move_into_place, staging_folder
from alignflow.rl.environments import Observation, RLEnvironment, TextGenerationEnv
from alignflow.rl.forward_backward import (
    capture_rng_state,
    load_optimizer_state,
    restore_rng_state,
    save_json_state,
    save_optimizer_state,
)
from alignflow.rl.ppo_config import DEFAULT_OUTPUT_DIR, PPOConfig

if TYPE_CHECKING:  # transformers loads only when a model does
    from transformers import PretrainedConfig

BatchRewardFn = Callable[..., Sequence[float]]
VALUE_HEAD_FILE = "value_head.safetensors"

logger = logging.getLogger(__name__)


# ---- math: GAE and the KL controllers -------------------------------------------------------


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None = None,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns for ``[batch, time]`` rewards and values.

    Positions where ``mask`` is 0 must be trailing (padding after the response ends): they
    count as terminal, getting zero advantage and cutting the bootstrap. Computed in closed
    form, ``A_t = sum_k (gamma*lam)^k * delta_{t+k}``, as one matrix product.
    """
    rewards, values = rewards.float(), values.float()
    mask = torch.ones_like(rewards) if mask is None else mask.to(rewards.dtype)
    values = values * mask
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    deltas = (rewards + gamma * next_values - values) * mask
    steps = torch.arange(rewards.size(1), device=rewards.device)
    offset = (steps[None, :] - steps[:, None]).to(rewards.dtype)  # k = t' - t
    discount = torch.where(offset >= 0, (gamma * lam) ** offset.clamp_min(0), torch.zeros_like(offset))
    advantages = (deltas @ discount.T) * mask
    return advantages, (advantages + values) * mask


class AdaptiveKLController:
    """Ziegler et al. (2019): move the KL coefficient in proportion to the (clipped) KL error.

    ``error = clip(KL / target - 1, -0.2, 0.2)``; ``coef *= 1 + error * n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        self.value, self.target, self.horizon = float(init_kl_coef), float(target), int(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.value, self.target, self.horizon = (
            float(state["value"]),
            float(state["target"]),
            int(state["horizon"]),
        )


class FixedKLController:
    """A constant KL coefficient (``use_adaptive_kl=False``)."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.value = float(state["value"])


# ---- the model ------------------------------------------------------------------------------


class ValueHead(nn.Module):
    """hidden -> ReLU -> scalar value per position."""

    def __init__(self, hidden_size: int):
        super().__init__()
        hidden, out = nn.Linear(hidden_size, hidden_size), nn.Linear(hidden_size, 1)
        self.net = nn.Sequential(hidden, nn.ReLU(), out)
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden).squeeze(-1)


@dataclass
class PPOModelOutput:
    logits: torch.Tensor
    value: torch.Tensor


class PPOModel(nn.Module):
    """A causal LM with a value head reading its last hidden states."""

    def __init__(self, base_model: nn.Module):
        super().__init__()
        # a transformers model: nn.Module would type its attributes (config, generate) as Tensor | Module
        self.base_model: Any = base_model
        hidden = cast("PretrainedConfig", base_model.config).hidden_size
        self.value_head = ValueHead(hidden).to(next(base_model.parameters()).dtype)

    @property
    def config(self):
        return self.base_model.config

    @property
    def generation_config(self):
        return self.base_model.generation_config

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs) -> PPOModelOutput:
        out = self.base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_hidden_states=True,
            **kwargs,
        )
        return PPOModelOutput(logits=out.logits, value=self.value_head(out.hidden_states[-1]).float())

    def generate(self, *args, **kwargs):
        return self.base_model.generate(*args, **kwargs)

    def save_pretrained(self, path: str | Path, **kwargs) -> None:
        """The base model as a normal transformers folder, plus ``value_head.safetensors``."""
        path = Path(path)
        kwargs.setdefault("safe_serialization", True)
        self.base_model.save_pretrained(path, **kwargs)
        state = {k: v.detach().cpu().contiguous() for k, v in self.value_head.state_dict().items()}
        save_file(state, path / VALUE_HEAD_FILE)

    def load_weights(self, path: str | Path) -> None:
        """Load weights written by :meth:`save_pretrained` into this model.

        A PEFT-wrapped base saved only its adapter, so only the adapter is loaded back.
        """
        path = Path(path)
        if hasattr(self.base_model, "peft_config"):
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.base_model, load_file(path / "adapter_model.safetensors"))
        else:
            from transformers import AutoModelForCausalLM

            loaded = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True)
            self.base_model.load_state_dict(loaded.state_dict())
        if (path / VALUE_HEAD_FILE).exists():
            self.value_head.load_state_dict(load_file(path / VALUE_HEAD_FILE))

    @classmethod
    def from_pretrained(cls, path: str | Path) -> PPOModel:
        from transformers import AutoModelForCausalLM

        model = cls(AutoModelForCausalLM.from_pretrained(path, use_safetensors=True))
        if (Path(path) / VALUE_HEAD_FILE).exists():
            model.value_head.load_state_dict(load_file(Path(path) / VALUE_HEAD_FILE))
        return model


# ---- the trainer ----------------------------------------------------------------------------


@dataclass
class Rollout:
    """One batch of experience, response-aligned (``[batch, response_len]``)."""

    input_ids: torch.Tensor  # prompt + response
    attention_mask: torch.Tensor
    prompt_len: int
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    values: torch.Tensor
    scores: torch.Tensor
    metrics: dict[str, float]


def _positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding, matching what ``generate`` used."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def _auto_device(requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _eval_scoped(key: str) -> str:
    return key if key.startswith("eval/") else f"eval/{key}"


def optimizer_steps_per_iteration(cfg: PPOConfig) -> int:
    """Optimiser steps one iteration takes: every epoch's minibatches, over gradient accumulation."""
    micro = cfg.num_epochs * math.ceil(cfg.batch_size / cfg.mini_batch_size)
    return math.ceil(micro / cfg.gradient_accumulation_steps)


def kl_penalty_terms(loss_fn: Any) -> list[KLDivergenceLoss]:
    """The KL penalties inside a custom loss (itself, or components of a composite)."""
    if not isinstance(loss_fn, nn.Module):
        return []
    return [m for m in loss_fn.modules() if isinstance(m, KLDivergenceLoss)]


class PPOTrainer:
    """Train a causal LM with PPO on prompts + a reward function, or on an environment."""

    def __init__(
        self,
        config: PPOConfig,
        model: nn.Module | str | Path | None = None,
        tokenizer=None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler=None,
        reward_fn: BatchRewardFn | None = None,
        reference_model: nn.Module | None = None,
        on_iteration: Callable[[dict[str, float]], None] | None = None,
    ):
        """``on_iteration``: called with each iteration's metrics as :meth:`train` records them
        (to send them to MLflow or any other tracker; the research API imports none)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.device = _auto_device(config.device)
        source = model if model is not None else config.model_name
        if source is None:
            raise ValueError("PPOTrainer needs a model or config.model_name")
        if isinstance(source, (str, Path)):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(source)
            source = AutoModelForCausalLM.from_pretrained(source, use_safetensors=True)
        if tokenizer is None:
            base_config = cast("PretrainedConfig", source.config)  # nn.Module types it as Tensor | Module
            tokenizer = AutoTokenizer.from_pretrained(base_config.name_or_path)
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token first")
        self.model = (source if isinstance(source, PPOModel) else PPOModel(source)).to(self.device)
        base = self.model.base_model
        self.ref_model = reference_model if reference_model is not None else copy.deepcopy(base)
        self.ref_model.to(self.device).eval().requires_grad_(False)
        self.optimizer = optimizer or self._default_optimizer()
        self.scheduler = scheduler if scheduler is not None else self._default_scheduler()
        self.reward_fn = reward_fn
        self.on_iteration = on_iteration
        self.kl_ctl = (
            AdaptiveKLController(config.kl_coef, config.target_kl, config.kl_horizon)
            if config.use_adaptive_kl
            else FixedKLController(config.kl_coef)
        )
        self.ppo_loss = PPOLoss(
            clip_param=config.clip_param,
            value_clip=config.value_clip,
            entropy_coef=config.entropy_coef,
            value_loss_coef=config.value_loss_coef,
        )
        self.iteration = 0
        self.history: list[dict[str, float]] = []
        self._prompt_rng = random.Random(config.seed)
        self._order: list[int] = []
        self._named_default_dir = False  # the default checkpoint folder is logged once
        torch.manual_seed(config.seed)

    def _default_optimizer(self) -> torch.optim.Optimizer:
        """AdamW on the parameters that train (a LoRA run's adapters and the value head)."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(
            trainable, lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )

    def _default_scheduler(self) -> Any:
        """``config.lr_scheduler_type`` over every optimiser step of the run; None without one."""
        cfg = self.config
        if cfg.lr_scheduler_type is None:
            return None
        from transformers import get_scheduler

        total = cfg.num_iterations * optimizer_steps_per_iteration(cfg)
        return get_scheduler(
            cfg.lr_scheduler_type,
            self.optimizer,
            num_warmup_steps=math.ceil(cfg.warmup_ratio * total),
            num_training_steps=total,
        )

    # ---- experience ---------------------------------------------------------------------
    def _next_indices(self, n_prompts: int) -> list[int]:
        picked = []
        for _ in range(self.config.batch_size):
            if not self._order:
                self._order = list(range(n_prompts))
                self._prompt_rng.shuffle(self._order)
            picked.append(self._order.pop())
        return picked

    def _logprobs_values(self, model, input_ids, attention_mask, prompt_len, with_values=True):
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=_positions(attention_mask)
        )
        logits = out.logits[:, prompt_len - 1 : -1].float() / self.config.temperature
        logprobs = logprobs_from_logits(logits, input_ids[:, prompt_len:])
        values = out.value[:, prompt_len - 1 : -1] if with_values else None
        return logprobs, values, logits

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[str], do_sample: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One response per prompt: ``(sequences, prompt_attention_mask, prompt_len)``.

        Sampled in eval mode (no dropout), the mode the rollout's log-probs are computed in;
        ``do_sample=False`` decodes greedily (periodic evaluation).
        """
        self.model.eval()
        cfg = self.config
        self.tokenizer.padding_side = "left"
        # a GPT-2/OPT-style policy's position table must hold the prompt and the response
        budget = prompt_token_budget(self.tokenizer, cfg.max_new_tokens, self.model)
        enc = left_padded_batch(self.tokenizer, prompts, budget)
        enc = {k: v.to(self.device) for k, v in enc.items()}
        sequences = self.model.generate(
            **enc,
            do_sample=do_sample,
            **({"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k} if do_sample else {}),
            max_new_tokens=cfg.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        return sequences, enc["attention_mask"], enc["input_ids"].size(1)

    def _response_mask(self, responses: torch.Tensor) -> torch.Tensor:
        """1 up to and including the first EOS, 0 after it."""
        is_eos = responses == self.tokenizer.eos_token_id
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        return (~after_eos).long()

    @torch.no_grad()
    def _experience(self, sequences, prompt_mask, prompt_len, response_mask, scores, metrics) -> Rollout:
        self.model.eval()
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
        sequences = sequences.masked_fill(attention_mask == 0, self.tokenizer.pad_token_id)
        logprobs, values, _ = self._logprobs_values(self.model, sequences, attention_mask, prompt_len)
        ref_out = self.ref_model(
            input_ids=sequences, attention_mask=attention_mask, position_ids=_positions(attention_mask)
        )
        ref_logits = ref_out.logits[:, prompt_len - 1 : -1].float() / self.config.temperature
        ref_logprobs = logprobs_from_logits(ref_logits, sequences[:, prompt_len:])
        mask = response_mask.float()
        return Rollout(
            sequences,
            attention_mask,
            prompt_len,
            mask,
            logprobs * mask,
            ref_logprobs * mask,
            values * mask,
            scores,
            metrics,
        )

    def _score_prompts(self, prompts, metadata, texts, reward_fn) -> list[float]:
        try:
            scores = reward_fn(prompts, texts, metadata)
        except TypeError:
            scores = reward_fn(prompts, texts)
        scores = [float(s) for s in scores]
        if len(scores) != len(texts):
            raise ValueError(f"reward_fn returned {len(scores)} rewards for {len(texts)} responses")
        for i, s in enumerate(scores):
            if not math.isfinite(s):
                raise ValueError(f"reward_fn returned {s} for response {i} of prompt {prompts[i]!r}")
        return scores

    def _respond(
        self, prompts, metadata, reward_fn, do_sample=True
    ) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]:
        """Generate and score: ``(sequences, prompt_mask, prompt_len, response_mask, scores)``."""
        sequences, prompt_mask, prompt_len = self.generate(prompts, do_sample)
        responses = sequences[:, prompt_len:]
        response_mask = self._response_mask(responses)
        texts = self.tokenizer.batch_decode(responses * response_mask, skip_special_tokens=True)
        scores = self._score_prompts(prompts, metadata, texts, reward_fn)
        return sequences, prompt_mask, prompt_len, response_mask, torch.tensor(scores, device=self.device)

    def collect_from_prompts(self, prompts, reward_fn, prompt_metadata=None) -> Rollout:
        indices = self._next_indices(len(prompts))
        batch = [prompts[i] for i in indices]
        metadata = [dict(prompt_metadata[i]) if prompt_metadata else {} for i in indices]
        return self._experience(*self._respond(batch, metadata, reward_fn), {})

    def _env_episodes(self, env: TextGenerationEnv, do_sample: bool = True):
        observations: list[Observation] = [env.reset() for _ in range(self.config.batch_size)]
        sequences, prompt_mask, prompt_len = self.generate([o.prompt for o in observations], do_sample)
        responses = sequences[:, prompt_len:]
        results = [env.evaluate(o, r) for o, r in zip(observations, responses.cpu(), strict=True)]
        return sequences, prompt_mask, prompt_len, responses, results

    def collect_from_env(self, env: TextGenerationEnv) -> Rollout:
        sequences, prompt_mask, prompt_len, responses, results = self._env_episodes(env)
        consumed = torch.tensor([max(r.info.get("consumed", responses.size(1)), 1) for r in results])
        positions = torch.arange(responses.size(1))
        response_mask = (positions[None, :] < consumed[:, None]).long().to(self.device)
        metrics: dict[str, float] = {}
        for key in {k for r in results for k in r.metrics}:
            metrics[f"env/{key}"] = sum(r.metrics.get(key, 0.0) for r in results) / len(results)
        scores = torch.tensor([r.reward for r in results], device=self.device)
        return self._experience(sequences, prompt_mask, prompt_len, response_mask, scores, metrics)

    # ---- periodic evaluation ------------------------------------------------------------
    @torch.no_grad()
    def evaluate(
        self, source: Sequence[str] | TextGenerationEnv, reward_fn=None, prompt_metadata=None
    ) -> dict[str, float]:
        """Mean and spread of the reward of greedy responses: held-out prompts or env episodes."""
        if isinstance(source, RLEnvironment):
            rewards = [r.reward for r in self._env_episodes(source, do_sample=False)[-1]]
        else:
            prompts, rewards, reward_fn = list(source), [], reward_fn or self.reward_fn
            metadata = [dict(m) for m in prompt_metadata] if prompt_metadata else [{} for _ in prompts]
            size = self.config.batch_size
            for start in range(0, len(prompts), size):
                batch = slice(start, start + size)
                scores = self._respond(prompts[batch], metadata[batch], reward_fn, do_sample=False)[-1]
                rewards += scores.tolist()
        values = torch.tensor(rewards, dtype=torch.float32)
        return {
            "eval/reward_mean": float(values.mean()),
            "eval/reward_std": float(values.std()) if len(rewards) > 1 else 0.0,
            "eval/n": float(len(rewards)),
        }

    def _hold_out(self, prompts, metadata):
        """Split off ``eval_fraction`` of the prompts (seeded) for ``eval_every``: train, eval."""
        if len(prompts) < 2:
            raise ValueError("eval_every needs eval_prompts or at least two prompts to hold some out")
        order = list(range(len(prompts)))
        random.Random(self.config.seed).shuffle(order)
        held = set(order[: max(1, round(len(prompts) * self.config.eval_fraction))])
        pick = lambda rows, keep: [r for i, r in enumerate(rows) if (i in held) != keep]  # noqa: E731
        train_meta = pick(metadata, True) if metadata else None
        eval_meta = pick(metadata, False) if metadata else None
        logger.info("eval_every: %d of %d prompts held out for evaluation", len(held), len(prompts))
        return pick(prompts, True), train_meta, pick(prompts, False), eval_meta

    # ---- optimisation -------------------------------------------------------------------
    def _token_rewards(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        kl = (rollout.logprobs - rollout.ref_logprobs) * rollout.response_mask
        rewards = -self.kl_ctl.value * kl
        last = (rollout.response_mask.sum(-1).long() - 1).clamp_min(0)
        rewards[torch.arange(rewards.size(0)), last] += rollout.scores
        return rewards, kl

    def _loss(self, loss_fn, logprobs, values, entropy, batch: dict[str, torch.Tensor]):
        kwargs = dict(
            mask=batch["mask"],
            advantages=batch["advantages"],
            values=values,
            old_values=batch["values"],
            returns=batch["returns"],
            entropy=entropy,
        )
        if loss_fn is None:
            out = self.ppo_loss(logprobs, batch["logprobs"], return_dict=True, **kwargs)
        elif isinstance(loss_fn, CustomLoss):
            out = loss_fn(
                logprobs, batch["logprobs"], return_dict=True, ref_log_probs=batch["ref_logprobs"], **kwargs
            )
        else:
            out = loss_fn(logprobs, batch["logprobs"], ref_log_probs=batch["ref_logprobs"], **kwargs)
        if isinstance(out, Mapping):
            return out["loss"], {k: float(v) for k, v in out.items() if k != "loss" and isinstance(v, float)}
        return out, {}

    def optimize(self, rollout: Rollout, loss_fn=None) -> dict[str, float]:
        """Minibatch epochs of PPO on one rollout; returns averaged loss metrics."""
        cfg = self.config
        rewards, kl = self._token_rewards(rollout)
        advantages, returns = compute_gae(
            rewards, rollout.values, rollout.response_mask, cfg.gamma, cfg.gae_lambda
        )
        if cfg.normalize_advantages:
            advantages = whiten(advantages, rollout.response_mask) * rollout.response_mask
        data = {
            "input_ids": rollout.input_ids,
            "attention_mask": rollout.attention_mask,
            "mask": rollout.response_mask,
            "logprobs": rollout.logprobs,
            "ref_logprobs": rollout.ref_logprobs,
            "values": rollout.values,
            "advantages": advantages,
            "returns": returns,
        }
        size = rollout.input_ids.size(0)
        sums: dict[str, float] = {}
        count = micro = 0
        kl_terms = kl_penalty_terms(loss_fn)
        observed_kl: list[float] = []
        self.model.train()
        for _ in range(cfg.num_epochs):
            order = torch.randperm(size)
            for start in range(0, size, cfg.mini_batch_size):
                idx = order[start : start + cfg.mini_batch_size].to(self.device)
                batch = {k: v[idx] for k, v in data.items()}
                logprobs, values, logits = self._logprobs_values(
                    self.model, batch["input_ids"], batch["attention_mask"], rollout.prompt_len
                )
                entropy = entropy_from_logits(logits)
                loss, stats = self._loss(loss_fn, logprobs, values, entropy, batch)
                observed_kl += [term.last_metrics["kl"] for term in kl_terms if "kl" in term.last_metrics]
                (loss / cfg.gradient_accumulation_steps).backward()
                micro += 1
                if micro % cfg.gradient_accumulation_steps == 0:
                    self._step()
                stats["loss/total"] = float(loss.detach())
                for key, value in stats.items():
                    sums[key] = sums.get(key, 0.0) + value
                count += 1
        if micro % cfg.gradient_accumulation_steps:
            self._step()
        metrics = {f"ppo/{k}" if "/" not in k else k: v / max(count, 1) for k, v in sums.items()}
        seq_kl = kl.sum(-1).mean().item()
        metrics.update(
            {
                "objective/kl": seq_kl,
                "objective/kl_coef": self.kl_ctl.value,
                "objective/entropy": masked_mean(-rollout.logprobs, rollout.response_mask).item(),
                "reward/mean": rollout.scores.mean().item(),
                "reward/std": rollout.scores.std().item() if size > 1 else 0.0,
                "response/length": rollout.response_mask.sum(-1).mean().item(),
            }
        )
        self.kl_ctl.update(seq_kl, cfg.batch_size)
        if observed_kl:  # a KL term inside a custom loss moves its own coefficient toward target_kl
            mean_kl = sum(observed_kl) / len(observed_kl)
            metrics["objective/loss_kl_coef"] = [term.update(mean_kl) for term in kl_terms][-1]
        return metrics

    def _step(self) -> None:
        if self.config.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    # ---- the loop -----------------------------------------------------------------------
    def train(
        self,
        source: Sequence[str] | TextGenerationEnv,
        reward_fn: BatchRewardFn | None = None,
        loss_fn: CustomLoss | Callable[..., Any] | None = None,
        num_iterations: int | None = None,
        prompt_metadata: Sequence[Mapping[str, Any]] | None = None,
        resume_from: str | Path | None = None,
        eval_prompts: Sequence[str] | None = None,
        evaluate: Callable[[], Mapping[str, float]] | None = None,
    ):
        """Run PPO until ``num_iterations`` (total, counting resumed ones) have been done.

        This is the one PPO iteration loop: the pipeline's stage runs it too, adding its
        tracking through ``on_iteration`` and its own held-out measure through ``evaluate``.

        ``train(prompts, reward_fn)`` returns the per-iteration metrics;
        ``train(env, loss_fn=...)`` returns the trained :class:`PPOModel` (as the spec's
        examples use them). ``reward_fn(prompts, responses, metadata)`` returns one float
        per response. A custom ``loss_fn`` is called like :class:`~alignflow.losses.PPOLoss`:
        ``loss_fn(log_probs, old_log_probs, mask=, advantages=, values=, old_values=,
        returns=, entropy=, ref_log_probs=)``; a :class:`~alignflow.losses.KLDivergenceLoss`
        inside it is measured against the reference and adapts toward its ``target_kl``.

        With ``config.eval_every``, greedy responses to ``eval_prompts`` (by default a held-out
        ``eval_fraction`` of the prompts; for an environment, fresh episodes) are scored every
        that many iterations, as ``eval/reward_mean`` in the history and to ``on_iteration``;
        ``evaluate()`` replaces that measure (its figures go in under ``eval/``, and no prompt is
        held out for it). With ``config.save_every``, ``checkpoint-N`` is written every that many
        iterations and after the last one, each renamed into place only once complete.
        """
        cfg = self.config
        total = num_iterations or cfg.num_iterations
        is_env = isinstance(source, RLEnvironment)
        eval_source, eval_meta = source, None
        if not isinstance(source, RLEnvironment):  # is_env, spelled out so that it narrows source
            prompts = list(source)
            if not prompts:
                raise ValueError("train(prompts, ...) needs at least one prompt")
            reward_fn = reward_fn or self.reward_fn
            if reward_fn is None:
                raise ValueError("train(prompts) needs a reward_fn(prompts, responses, metadata)")
            eval_source = list(eval_prompts or [])
            if cfg.eval_every and not eval_source and evaluate is None:
                prompts, prompt_metadata, eval_source, eval_meta = self._hold_out(prompts, prompt_metadata)
        if resume_from is not None:
            self.load_checkpoint(self._resolve_checkpoint(resume_from))
        while self.iteration < total:
            if isinstance(source, RLEnvironment):
                rollout = self.collect_from_env(source)
            else:
                rollout = self.collect_from_prompts(prompts, reward_fn, prompt_metadata)
            metrics = {**self.optimize(rollout, loss_fn), **rollout.metrics}
            self.iteration += 1
            metrics["iteration"] = self.iteration
            if cfg.eval_every and self.iteration % cfg.eval_every == 0:
                if evaluate is not None:
                    metrics.update({_eval_scoped(k): v for k, v in evaluate().items()})
                else:
                    metrics.update(self.evaluate(eval_source, reward_fn, eval_meta))
            self.history.append(metrics)
            if self.on_iteration is not None:
                self.on_iteration(metrics)
            if cfg.save_every and (self.iteration % cfg.save_every == 0 or self.iteration == total):
                self.save_iteration()
        return self.model if is_env else self.history

    def save_iteration(self) -> Path:
        """``checkpoint-<iteration>`` under :meth:`checkpoint_root`, written under a staging name and
        renamed into place once complete; only the newest ``config.save_total_limit`` are kept."""
        root = self.checkpoint_root()
        staging = self.save_checkpoint(staging_folder(root))
        return move_into_place(staging, root / f"checkpoint-{self.iteration}", self.config.save_total_limit)

    def checkpoint_root(self) -> Path:
        """``config.output_dir``, or ``./ppo_output`` (named in the log once) when it is not set."""
        if self.config.output_dir:
            return Path(self.config.output_dir)
        root = Path(DEFAULT_OUTPUT_DIR).resolve()
        if not self._named_default_dir:
            logger.warning("PPOConfig.output_dir is not set: checkpoints go to %s", root)
            self._named_default_dir = True
        return root

    # ---- checkpoints --------------------------------------------------------------------
    def _resolve_checkpoint(self, path: str | Path) -> Path:
        if str(path) != "latest":
            return Path(path)
        root = self.checkpoint_root()
        found = sorted(root.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        if not found:
            raise FileNotFoundError(f"{root}: no checkpoint-* folders to resume from")
        return found[-1]

    def save_checkpoint(self, path: str | Path) -> Path:
        """Policy + value head, optimiser, scheduler, RNGs, KL controller and prompt order."""
        path = Path(path)
        self.model.save_pretrained(path / "model")
        self.tokenizer.save_pretrained(path / "model")
        save_optimizer_state(self.optimizer.state_dict(), path)
        if self.scheduler is not None:
            save_json_state(self.scheduler.state_dict(), path / "scheduler.json", "scheduler")
        capture_rng_state(path)
        version, state, gauss = self._prompt_rng.getstate()
        trainer_state = {
            "iteration": self.iteration,
            "kl_controller": self.kl_ctl.state_dict(),
            "prompt_rng": [version, list(state), gauss],
            "prompt_order": self._order,
            "history": self.history,
            "config": self.config.model_dump(mode="json"),
        }
        save_json_state(trainer_state, path / "trainer_state.json", "trainer")
        return path

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        path = Path(path)
        state_file = path / "trainer_state.json"
        if not state_file.exists():
            raise FileNotFoundError(f"{path}: not a PPO checkpoint (trainer_state.json missing)")
        state = json.loads(state_file.read_text(encoding="utf-8"))
        self.model.load_weights(path / "model")
        self.optimizer.load_state_dict(load_optimizer_state(path))
        if self.scheduler is not None and (path / "scheduler.json").exists():
            self.scheduler.load_state_dict(json.loads((path / "scheduler.json").read_text(encoding="utf-8")))
        restore_rng_state(path)
        self.kl_ctl.load_state_dict(state["kl_controller"])
        version, rng_state, gauss = state["prompt_rng"]
        self._prompt_rng.setstate((version, tuple(rng_state), gauss))
        self._order = list(state["prompt_order"])
        self.iteration = int(state["iteration"])
        self.history = list(state["history"])
        return state
