"""Direct Preference Optimisation (Rafailov et al. 2023): the research API's face (spec 001).

Training runs TRL's DPOTrainer, the engine of the pipeline's DPO stage, on the token ids a
:class:`PreferenceDataset` holds. :func:`dpo_loss`, ``compute_loss`` and ``evaluate`` score
with :mod:`alignflow.losses.dpo_losses`: the policy is pushed to raise
``beta * (log pi/pi_ref)(chosen) - (same)(rejected)``, with sequence log-probs summed over
completion tokens as in TRL, so these equal TRL's loss on identical log-probs (checked in
tests/rl/test_dpo.py against TRL's own ``_compute_loss``). Loss types:

- ``sigmoid``: ``-(1-e) log s(b*d) - e log s(-b*d)``; with label smoothing ``e > 0``
  this is conservative DPO (labels flipped with probability ``e``); ``e = 0`` is DPO;
- ``robust``: the unbiased noisy-label estimator (Chowdhury et al. 2024);
- ``hinge``: ``relu(1 - b*d)`` (SLiC);
- ``ipo``: ``(d_avg - 1/(2b))^2`` with per-token averaged log-ratios (Azar et al. 2023).

``reference_free=True`` drops the reference model (its log-probs are taken as 0).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from alignflow.losses.dpo_loss_types import DPO_LOSS_TYPES
from alignflow.losses.dpo_losses import PairLogps, dpo_family_loss
from alignflow.losses.functional import sequence_logprobs
from alignflow.rl.trainer_loop import (
    history_from_log,
    last_train_log,
    loop_arguments,
    optimizer_steps,
    output_folder,
    without_eval_prefix,
)


@dataclass
class DPOConfig:
    """DPO hyper-parameters, sequence limits and checkpointing."""

    model_name: str | None = None
    learning_rate: float = 1e-6
    batch_size: int = 8
    gradient_accumulation_steps: int = 2
    beta: float = 0.1
    label_smoothing: float = 0.0
    reference_free: bool = False
    loss_type: str = "sigmoid"
    num_epochs: int = 1
    max_grad_norm: float = 1.0
    warmup_ratio: float = 0.1
    max_length: int = 512
    max_prompt_length: int = 256
    eval_every: int = 100
    save_every: int = 500
    output_dir: str | None = None
    seed: int = 0
    device: str | None = None

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"DPOConfig.beta must be positive, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"DPOConfig.label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"DPOConfig.loss_type must be one of {DPO_LOSS_TYPES}, got {self.loss_type!r}")
        if self.max_prompt_length >= self.max_length:
            raise ValueError("DPOConfig.max_prompt_length must be smaller than max_length")
        if self.batch_size < 1 or self.gradient_accumulation_steps < 1:
            raise ValueError("DPOConfig.batch_size and gradient_accumulation_steps must be >= 1")


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor | None = None,
    ref_rejected_logps: torch.Tensor | None = None,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    loss_type: str = "sigmoid",
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
):
    """Per-pair losses and the implicit rewards ``beta * log(pi/pi_ref)`` of both sides.

    ``loss_type`` is any name of :data:`~alignflow.losses.dpo_loss_types.DPO_LOSS_TYPES`, the
    list the pipeline's DPO stage takes too. Missing reference log-probs mean reference-free
    DPO; the length-normalised losses (``ipo``, ``sigmoid_norm``, ``sft``) need the
    completions' token counts.
    """
    zeros = torch.zeros_like(policy_chosen_logps)
    pairs = PairLogps(
        chosen=policy_chosen_logps,
        rejected=policy_rejected_logps,
        ref_chosen=zeros if ref_chosen_logps is None else ref_chosen_logps,
        ref_rejected=zeros if ref_rejected_logps is None else ref_rejected_logps,
        chosen_tokens=chosen_lengths,
        rejected_tokens=rejected_lengths,
    )
    losses = dpo_family_loss(loss_type, pairs, beta, label_smoothing)
    return losses, beta * pairs.chosen_ratio.detach(), beta * pairs.rejected_ratio.detach()


def _check_texts(name: str, texts: Sequence[str]) -> None:
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text:
            raise ValueError(f"PreferenceDataset: {name}[{i}] must be a non-empty string, got {text!r}")


class PreferenceDataset(Dataset):
    """Tokenised (prompt, chosen, rejected) triples with completion masks.

    The prompt keeps its last ``max_prompt_length`` tokens (the end of a prompt matters
    most); each response is cut to fit ``max_length`` and ends with EOS when it fits.
    """

    def __init__(
        self,
        prompts: Sequence[str],
        chosen: Sequence[str],
        rejected: Sequence[str],
        tokenizer,
        max_length: int = 512,
        max_prompt_length: int = 256,
    ):
        if not len(prompts) == len(chosen) == len(rejected):
            raise ValueError(
                f"PreferenceDataset: prompts, chosen and rejected differ in length "
                f"({len(prompts)}, {len(chosen)}, {len(rejected)})"
            )
        if not prompts:
            raise ValueError("PreferenceDataset: no preference pairs given")
        for name, texts in (("prompts", prompts), ("chosen", chosen), ("rejected", rejected)):
            _check_texts(name, texts)
        if max_prompt_length >= max_length:
            raise ValueError("PreferenceDataset: max_prompt_length must be smaller than max_length")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.max_prompt_length = max_prompt_length
        self.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self.items = [self._encode(p, c, r) for p, c, r in zip(prompts, chosen, rejected, strict=True)]

    def _encode(self, prompt: str, chosen: str, rejected: str) -> dict[str, list[int]]:
        prompt_ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"][-self.max_prompt_length :]
        item = {}
        for side, text in (("chosen", chosen), ("rejected", rejected)):
            response = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if self.tokenizer.eos_token_id is not None:
                response = response + [self.tokenizer.eos_token_id]
            response = response[: self.max_length - len(prompt_ids)]
            item[f"{side}_input_ids"] = prompt_ids + response
            item[f"{side}_completion_mask"] = [0] * len(prompt_ids) + [1] * len(response)
        return item

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.items[index]

    def collate(self, batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        """Right-pad chosen and rejected sequences to one common length."""
        width = max(len(item[f"{side}_input_ids"]) for item in batch for side in ("chosen", "rejected"))
        out: dict[str, torch.Tensor] = {}
        for side in ("chosen", "rejected"):
            ids, attention, completion = [], [], []
            for item in batch:
                seq, comp = item[f"{side}_input_ids"], item[f"{side}_completion_mask"]
                pad = width - len(seq)
                ids.append(seq + [self.pad_token_id] * pad)
                attention.append([1] * len(seq) + [0] * pad)
                completion.append(comp + [0] * pad)
            out[f"{side}_input_ids"] = torch.tensor(ids)
            out[f"{side}_attention_mask"] = torch.tensor(attention)
            out[f"{side}_completion_mask"] = torch.tensor(completion)
        return out


def completion_logps(model, batch: dict[str, torch.Tensor]):
    """Summed completion log-probs of chosen and rejected, from one concatenated forward."""
    ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])
    attention = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])
    completion = torch.cat([batch["chosen_completion_mask"], batch["rejected_completion_mask"]])
    token_logps = sequence_logprobs(model, ids, attention)
    logps = (token_logps * completion[:, 1:].to(token_logps.dtype)).sum(-1)
    return logps.chunk(2)


class ZeroReferenceMixin:
    """DPO against a uniform reference: every reference log-probability is zero.

    Mixed into a TRL ``DPOTrainer`` run with ``precompute_ref_log_probs``, so TRL keeps no
    reference model in memory and reads the (zero) reference log-probs from the dataset;
    the pipeline's reference-free stage and the research trainer both use it.
    """

    def _precompute_ref_logps(self, dataset, name, batch_size):
        zeros = [0.0] * len(dataset)
        return dataset.add_column("ref_chosen_logps", zeros).add_column("ref_rejected_logps", zeros)

    def compute_ref_log_probs(self, model, inputs):
        zeros = torch.zeros(inputs["input_ids"].shape[0] // 2, device=inputs["input_ids"].device)
        return zeros, zeros.clone()


def trl_rows(dataset: PreferenceDataset):
    """The dataset's own token ids as TRL's tokenised rows (``prompt_ids``, ``chosen_ids``,
    ``rejected_ids``), so TRL trains on exactly what :meth:`DPOTrainer.evaluate` scores."""
    from datasets import Dataset as HFDataset

    rows = []
    for item in dataset.items:
        prompt_len = item["chosen_completion_mask"].index(1)
        rows.append(
            {
                "prompt_ids": item["chosen_input_ids"][:prompt_len],
                "chosen_ids": item["chosen_input_ids"][prompt_len:],
                "rejected_ids": item["rejected_input_ids"][prompt_len:],
            }
        )
    return HFDataset.from_list(rows)


def _engine_class(reference_free: bool) -> type:
    """TRL's DPOTrainer, the engine of the pipeline's DPO stage, fed rows tokenised already."""
    from trl import DPOTrainer as TRLDPOTrainer

    class TokenisedDPOTrainer(TRLDPOTrainer):
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset  # trl_rows: tokenised, truncated and EOS-terminated by PreferenceDataset

    if not reference_free:
        return TokenisedDPOTrainer

    class ReferenceFreeTokenisedDPOTrainer(ZeroReferenceMixin, TokenisedDPOTrainer):
        pass

    return ReferenceFreeTokenisedDPOTrainer


class DPOTrainer:
    """Trains a causal LM on a :class:`PreferenceDataset` with the DPO family of losses.

    ``train`` runs TRL's DPOTrainer (the pipeline's DPO engine) on the dataset's token ids;
    ``compute_loss`` and ``evaluate`` score a batch or a dataset with :func:`dpo_loss`, which
    equals TRL's loss on identical log-probs.
    """

    def __init__(
        self,
        config: DPOConfig,
        tokenizer=None,
        model=None,
        ref_model=None,
        callbacks: Sequence[TrainerCallback] = (),
    ):
        """``callbacks``: transformers ``TrainerCallback``s that receive the loop's logs (MLflow:
        :class:`~alignflow.registry.trainer_callback.TrackingCallback`)."""
        if model is None and not config.model_name:
            raise ValueError("DPOTrainer needs a model or DPOConfig.model_name")
        self.config = config
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if model is None:
            assert config.model_name  # checked above
            model = AutoModelForCausalLM.from_pretrained(config.model_name, use_safetensors=True)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(config.model_name)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        if config.reference_free:
            self.ref_model = None
        else:
            self.ref_model = (ref_model if ref_model is not None else copy.deepcopy(model)).to(self.device)
            self.ref_model.eval().requires_grad_(False)
        self.callbacks = list(callbacks)
        self.global_step = 0
        self.history: list[dict[str, float]] = []

    def make_dataset(self, prompts, chosen, rejected) -> PreferenceDataset:
        cfg = self.config
        return PreferenceDataset(
            prompts, chosen, rejected, self.tokenizer, cfg.max_length, cfg.max_prompt_length
        )

    def _to_device(self, batch):
        return {k: v.to(self.device) for k, v in batch.items()}

    def compute_loss(self, batch: dict[str, torch.Tensor]):
        """Mean DPO loss of a collated batch and its metrics."""
        batch = self._to_device(batch)
        chosen, rejected = completion_logps(self.model, batch)
        ref_chosen = ref_rejected = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_chosen, ref_rejected = completion_logps(self.ref_model, batch)
        losses, chosen_rewards, rejected_rewards = dpo_loss(
            chosen,
            rejected,
            ref_chosen,
            ref_rejected,
            beta=self.config.beta,
            label_smoothing=self.config.label_smoothing,
            loss_type=self.config.loss_type,
            chosen_lengths=batch["chosen_completion_mask"].sum(-1),
            rejected_lengths=batch["rejected_completion_mask"].sum(-1),
        )
        metrics = {
            "rewards/chosen": chosen_rewards.mean().item(),
            "rewards/rejected": rejected_rewards.mean().item(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
            "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
            "logps/chosen": chosen.detach().mean().item(),
            "logps/rejected": rejected.detach().mean().item(),
        }
        return losses.mean(), metrics

    def _loader(self, dataset: PreferenceDataset) -> DataLoader:
        return DataLoader(
            dataset, batch_size=self.config.batch_size, shuffle=False, collate_fn=dataset.collate
        )

    @torch.no_grad()
    def evaluate(self, dataset: PreferenceDataset) -> dict[str, float]:
        """Loss and implicit-reward metrics averaged over ``dataset`` (pair-weighted)."""
        was_training = self.model.training
        self.model.eval()
        totals: dict[str, float] = {}
        count = 0
        try:
            for batch in self._loader(dataset):
                loss, metrics = self.compute_loss(batch)
                n = batch["chosen_input_ids"].size(0)
                for key, value in {"loss": loss.item(), **metrics}.items():
                    totals[key] = totals.get(key, 0.0) + value * n
                count += n
        finally:
            self.model.train(was_training)
        return {key: value / count for key, value in totals.items()}

    def _engine_arguments(self, output_dir: str, train_size: int, has_eval: bool):
        from trl import DPOConfig as TRLDPOConfig

        cfg = self.config
        steps = optimizer_steps(train_size, cfg.batch_size, cfg.gradient_accumulation_steps, cfg.num_epochs)
        evaluates = has_eval and cfg.eval_every > 0
        saves = bool(cfg.output_dir) and cfg.save_every > 0
        return TRLDPOConfig(
            output_dir=output_dir,
            **loop_arguments(
                device=self.device,
                batch_size=cfg.batch_size,
                gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                learning_rate=cfg.learning_rate,
                max_grad_norm=cfg.max_grad_norm,
                seed=cfg.seed,
                num_epochs=cfg.num_epochs,
            ),
            lr_scheduler_type="linear",
            warmup_steps=int(cfg.warmup_ratio * steps),
            beta=cfg.beta,
            label_smoothing=cfg.label_smoothing,
            loss_type=[cfg.loss_type],
            max_length=cfg.max_length,
            precompute_ref_log_probs=cfg.reference_free,
            eval_strategy="steps" if evaluates else "no",
            eval_steps=cfg.eval_every if evaluates else None,
            save_strategy="steps" if saves else "no",
            save_steps=cfg.save_every if saves else 500,
        )

    def train(self, dataset: PreferenceDataset, eval_dataset: PreferenceDataset | None = None) -> dict:
        """Run ``num_epochs`` over ``dataset``; returns the last train and eval metrics and the history,
        all read from the engine's own log and state."""
        with output_folder(self.config.output_dir) as output_dir:
            engine = _engine_class(self.config.reference_free)(
                model=self.model,
                ref_model=self.ref_model,
                args=self._engine_arguments(output_dir, len(dataset), eval_dataset is not None),
                train_dataset=trl_rows(dataset),
                eval_dataset=trl_rows(eval_dataset) if eval_dataset is not None else None,
                processing_class=self.tokenizer,
                callbacks=self.callbacks,
            )
            engine.train()
            eval_metrics = without_eval_prefix(engine.evaluate()) if eval_dataset is not None else {}
        self.model = engine.model
        self.global_step += engine.state.global_step
        self.history.extend(history_from_log(engine.state.log_history))
        return {
            "train": last_train_log(engine.state.log_history),
            "eval": eval_metrics,
            "history": self.history,
            "steps": engine.state.global_step,
        }

    def save_model(self, path: str | Path) -> Path:
        """``save_pretrained`` (safetensors) of the policy and its tokenizer."""
        path = Path(path)
        self.model.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        return path
