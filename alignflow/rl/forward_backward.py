"""A forward-backward training loop the researcher drives, one call at a time, asynchronously.

Calls return futures at once and run on a thread pool, so a caller can queue the next
batch, score samples or run the frozen reference model while a backward pass is in
flight (torch releases the GIL inside its kernels, so the work really overlaps). Order is
kept where it matters: an optimiser step waits for every forward-backward queued before
it, and everything queued after a step waits for that step. Forward-backward passes
between two steps may run concurrently; their gradients add up in ``.grad`` (autograd
locks gradient accumulation), which is exactly gradient accumulation.

State is saved as safetensors + JSON (model, optimiser tensors, scheduler, RNG); nothing
is unpickled on load.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from alignflow.errors import InputError
from alignflow.losses import CustomLoss, ImportanceSamplingLoss, PPOLoss
from alignflow.losses.functional import logprobs_from_logits
from alignflow.models.positions import position_limit

CustomLossFn = Callable[..., torch.Tensor]
BUILTIN_LOSSES = ("cross_entropy", "importance_sampling", "ppo")


@dataclass
class ForwardBackwardOutput:
    """What one forward(-backward) pass reports. ``loss`` is before accumulation scaling."""

    loss: float
    logits: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    gradients: dict[str, torch.Tensor] | None = None


@dataclass
class OptimStepOutput:
    """What one optimiser step reports; ``metrics['applied']`` is 0 when it was skipped."""

    step: int
    learning_rate: float
    grad_norm: float
    metrics: dict[str, float] = field(default_factory=dict)


class AsyncTrainingFuture:
    """A handle on queued work: ``result`` blocks, ``done`` polls, ``cancel`` withdraws it."""

    def __init__(self, future: Future):
        self._future = future

    def result(self, timeout: float | None = None) -> Any:
        return self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> bool:
        """Withdraw the work if it has not started; True when it will not run."""
        return self._future.cancel()

    def cancelled(self) -> bool:
        return self._future.cancelled()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout)


def _wait_quietly(futures: Sequence[Future]) -> None:
    """Wait for earlier work; its failure or cancellation is reported by its own future."""
    for fut in futures:
        with contextlib.suppress(CancelledError, Exception):
            fut.result()


# ---- state files: safetensors for tensors, JSON for the rest ------------------------------


def save_optimizer_state(
    state_dict: Mapping[str, Any], directory: str | Path, prefix: str = "optimizer"
) -> Path:
    """Write an optimiser ``state_dict`` as ``<prefix>.safetensors`` + ``<prefix>.json``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    state: dict[str, dict[str, Any]] = {}
    for param_id, entry in state_dict["state"].items():
        state[str(param_id)] = {}
        for key, value in entry.items():
            if torch.is_tensor(value):
                name = f"{param_id}.{key}"
                tensors[name] = value.detach().cpu().contiguous()
                state[str(param_id)][key] = {"tensor": name}
            else:
                state[str(param_id)][key] = {"value": value}
    save_file(tensors, directory / f"{prefix}.safetensors")
    meta = {"state": state, "param_groups": state_dict["param_groups"]}
    (directory / f"{prefix}.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return directory / f"{prefix}.safetensors"


def load_optimizer_state(directory: str | Path, prefix: str = "optimizer") -> dict[str, Any]:
    """Read back what :func:`save_optimizer_state` wrote, as a ``state_dict``."""
    directory = Path(directory)
    tensors = load_file(directory / f"{prefix}.safetensors")
    meta = json.loads((directory / f"{prefix}.json").read_text(encoding="utf-8"))
    state = {
        int(pid): {k: tensors[v["tensor"]] if "tensor" in v else v["value"] for k, v in entry.items()}
        for pid, entry in meta["state"].items()
    }
    return {"state": state, "param_groups": meta["param_groups"]}


def save_json_state(obj: Any, path: str | Path, what: str) -> None:
    try:
        text = json.dumps(obj, indent=1)
    except TypeError as exc:
        raise TypeError(f"{what} state cannot be saved as JSON ({exc}); it holds non-plain values") from exc
    Path(path).write_text(text, encoding="utf-8")


def capture_rng_state(directory: str | Path) -> None:
    """Save torch (CPU and CUDA), NumPy and Python RNG states: tensors to safetensors, rest to JSON."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # the legacy global generator (MT19937) gives the tuple form
    tensors["numpy_keys"] = torch.from_numpy(np_state[1].astype(np.int64))
    save_file(tensors, directory / "rng.safetensors")
    py_version, py_state, py_gauss = random.getstate()
    meta = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    (directory / "rng.json").write_text(json.dumps(meta), encoding="utf-8")


def restore_rng_state(directory: str | Path) -> None:
    directory = Path(directory)
    tensors = load_file(directory / "rng.safetensors")
    meta = json.loads((directory / "rng.json").read_text(encoding="utf-8"))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, state, gauss = meta["python"]
    random.setstate((version, tuple(state), gauss))
    name, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, tensors["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached))


def save_model_weights(model: torch.nn.Module, directory: str | Path) -> Path:
    """``save_pretrained`` (safetensors) when the model has it, else a plain safetensors file."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        # a transformers method; nn.Module types unknown attributes as Tensor | Module
        cast(Any, model).save_pretrained(directory, safe_serialization=True)
    else:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, directory / "model.safetensors")
    return directory


def load_model_weights(model: torch.nn.Module, directory: str | Path) -> None:
    """Load weights saved by :func:`save_model_weights` into ``model`` (all shards, strictly)."""
    directory = Path(directory)
    if hasattr(model, "load_weights"):  # models with extra heads (PPOModel) know their own layout
        cast(Any, model).load_weights(directory)  # nn.Module types it as Tensor | Module
        return
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no safetensors weights to load")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied embeddings are stored once; anything else missing is a real mismatch
    tied = (
        {"lm_head.weight"} if getattr(getattr(model, "config", None), "tie_word_embeddings", False) else set()
    )
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise ValueError(
            f"{directory}: weights do not fit the model (missing {missing}, unexpected {unexpected})"
        )
    if tied and hasattr(model, "tie_weights"):
        cast(Any, model).tie_weights()  # a transformers method, typed by nn.Module as Tensor | Module


# ---- built-in losses --------------------------------------------------------------------


def _token_mask(attention_mask: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    return (loss_mask if loss_mask is not None else attention_mask[:, 1:]).to(torch.float32)


def cross_entropy_loss(logits, input_ids, attention_mask, labels=None) -> torch.Tensor:
    """Next-token cross-entropy; padding (and labels of -100) are ignored."""
    if labels is None:
        labels = input_ids.masked_fill(attention_mask == 0, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1))


class ForwardBackwardPipeline:
    """Queue forward-backward passes and optimiser steps on a thread pool (see module doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device | str | None = None,
        max_workers: int = 2,
        gradient_accumulation_steps: int = 1,
        reference_model: torch.nn.Module | None = None,
        checkpoint_dir: str | Path = "checkpoints",
    ):
        if gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        # a transformers model: nn.Module would type its methods (generate) as Tensor | Module
        self.model: Any = model.to(self.device)
        # a GPT-2/OPT-style table of absolute positions bounds prompt + sampled tokens (None: no table)
        self.position_limit = position_limit(model, None)
        self.reference_model = reference_model
        if reference_model is not None:
            reference_model.to(self.device).eval().requires_grad_(False)
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.checkpoint_dir = Path(checkpoint_dir)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None
        self.step_count = 0
        self.accumulated = 0
        self._pending_optimizer_state: dict[str, Any] | None = None
        self._pending_scheduler_state: dict[str, Any] | None = None
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="alignflow-fb")
        self._lock = threading.Lock()  # guards the queue bookkeeping and the counters
        self._last_step: Future | None = None
        self._since_step: list[Future] = []

    # ---- scheduling ---------------------------------------------------------------------
    def _submit_pass(self, fn: Callable[[], Any]) -> AsyncTrainingFuture:
        """Work that reads the weights: waits for the last optimiser step queued before it."""
        with self._lock:
            barrier = self._last_step

            def run():
                if barrier is not None:
                    _wait_quietly([barrier])
                return fn()

            fut = self._executor.submit(run)
            self._since_step.append(fut)
        return AsyncTrainingFuture(fut)

    def _submit_step(self, fn: Callable[[], Any]) -> AsyncTrainingFuture:
        """Work that changes the weights: waits for all earlier work, blocks all later work."""
        with self._lock:
            earlier = [*self._since_step, *([self._last_step] if self._last_step else [])]

            def run():
                _wait_quietly(earlier)
                return fn()

            fut = self._executor.submit(run)
            self._last_step, self._since_step = fut, []
        return AsyncTrainingFuture(fut)

    def wait(self) -> None:
        """Block until everything queued so far has finished."""
        with self._lock:
            pending = [*self._since_step, *([self._last_step] if self._last_step else [])]
        _wait_quietly(pending)

    # ---- passes -------------------------------------------------------------------------
    def _to_device(self, value):
        return value.to(self.device) if torch.is_tensor(value) else value

    def _prepare(self, input_ids, attention_mask):
        input_ids = torch.as_tensor(input_ids, dtype=torch.long)
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        attention_mask = (
            torch.ones_like(input_ids) if attention_mask is None else torch.as_tensor(attention_mask)
        )
        if attention_mask.dim() == 1:
            attention_mask = attention_mask.unsqueeze(0)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} "
                f"differs from input_ids {tuple(input_ids.shape)}"
            )
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _builtin_loss(self, name, outputs, input_ids, attention_mask, labels, kwargs):
        if name == "cross_entropy":
            return cross_entropy_loss(outputs.logits, input_ids, attention_mask, labels), {}
        if name == "importance_sampling":
            loss_fn = ImportanceSamplingLoss(
                clip_is_ratio=kwargs.get("clip_is_ratio", 5.0),
                normalize_advantages=kwargs.get("normalize_advantages", True),
            )
        else:
            loss_fn = PPOLoss(
                clip_param=kwargs.get("clip_param", 0.2),
                value_clip=kwargs.get("value_clip"),
                entropy_coef=kwargs.get("entropy_coef", 0.0),
                value_loss_coef=kwargs.get("value_loss_coef", 0.5),
            )
        return self._object_loss(loss_fn, outputs, input_ids, attention_mask, kwargs)

    def _object_loss(self, loss_fn: CustomLoss, outputs, input_ids, attention_mask, kwargs):
        """A loss object (``PPOLoss()``, a composite...) on the tokens' log-probs under the model.

        ``old_logprobs`` (or ``old_log_probs``) are its targets; ``advantages``,
        ``ref_log_probs``, ``returns``/``old_values`` (with a PPOModel's value head) are
        passed on; the loss takes what it needs.
        """
        logits = outputs.logits
        logprobs = logprobs_from_logits(logits[:, :-1], input_ids[:, 1:])
        mask = _token_mask(attention_mask, kwargs.get("loss_mask"))
        old = kwargs.get("old_logprobs", kwargs.get("old_log_probs"))
        if isinstance(loss_fn, (PPOLoss, ImportanceSamplingLoss)) and (
            old is None or kwargs.get("advantages") is None
        ):
            raise ValueError(f"loss_fn={type(loss_fn).__name__} needs old_logprobs and advantages")
        values = getattr(outputs, "value", None)
        values = values[:, :-1] if values is not None and kwargs.get("returns") is not None else None
        passed = {
            k: v
            for k, v in kwargs.items()
            if k in ("advantages", "ref_log_probs", "old_values") and v is not None
        }
        out = loss_fn(
            logprobs,
            old,
            mask=mask,
            values=values,
            returns=kwargs.get("returns") if values is not None else None,
            logits=logits[:, :-1] if getattr(loss_fn, "entropy_coef", 0.0) else None,
            return_dict=True,
            **passed,
        )
        metrics = {k: v for k, v in out.items() if k != "loss" and isinstance(v, float)}
        return out["loss"], metrics

    def _forward_backward(self, input_ids, attention_mask, labels, loss_fn, kwargs, return_gradients):
        input_ids, attention_mask = self._prepare(input_ids, attention_mask)
        labels = self._to_device(labels)
        kwargs = {k: self._to_device(v) for k, v in kwargs.items()}
        with torch.enable_grad():
            if isinstance(loss_fn, CustomLoss):
                outputs = self.model(input_ids=input_ids, attention_mask=attention_mask)
                loss, metrics = self._object_loss(loss_fn, outputs, input_ids, attention_mask, kwargs)
            elif callable(loss_fn):
                inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
                outputs = self.model(**inputs)
                loss, metrics = loss_fn(self.model, inputs, outputs, **kwargs), {}
            else:
                outputs = self.model(input_ids=input_ids, attention_mask=attention_mask)
                loss, metrics = self._builtin_loss(
                    loss_fn, outputs, input_ids, attention_mask, labels, kwargs
                )
            if not torch.is_tensor(loss) or loss.dim() != 0:
                raise ValueError(
                    f"the loss must be a scalar tensor, got {getattr(loss, 'shape', type(loss))}"
                )
            (loss / self.gradient_accumulation_steps).backward()
        with self._lock:
            self.accumulated += 1
        logits = outputs.logits.detach()
        grads = None
        if return_gradients:
            grads = {
                n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None
            }
        return ForwardBackwardOutput(
            loss=float(loss.detach()),
            logits=logits,
            logprobs=logprobs_from_logits(logits[:, :-1], input_ids[:, 1:]),
            metrics=metrics,
            gradients=grads,
        )

    def forward_backward(
        self,
        input_ids,
        attention_mask=None,
        labels=None,
        loss_fn: str | CustomLossFn = "cross_entropy",
        return_gradients: bool = False,
        **loss_kwargs,
    ) -> AsyncTrainingFuture:
        """Queue a forward pass and backward of ``loss_fn`` (a built-in name or a custom function).

        Built-ins: ``cross_entropy``; ``importance_sampling`` and ``ppo``, which need
        ``old_logprobs`` and ``advantages`` aligned with ``input_ids[:, 1:]`` (optional
        ``loss_mask``, ``returns``/``old_values`` for the value head of a PPOModel).
        """
        if isinstance(loss_fn, str) and loss_fn not in BUILTIN_LOSSES:
            raise ValueError(
                f"unknown loss_fn {loss_fn!r}; built-ins are {BUILTIN_LOSSES} or pass a callable"
            )
        return self._submit_pass(
            lambda: self._forward_backward(
                input_ids, attention_mask, labels, loss_fn, loss_kwargs, return_gradients
            )
        )

    def forward_backward_async(self, batch: Mapping[str, Any], loss_fn: str | CustomLossFn = "cross_entropy"):
        """``forward_backward`` with the inputs (and loss kwargs) in one mapping."""
        batch = dict(batch)
        return self.forward_backward(batch.pop("input_ids"), loss_fn=loss_fn, **batch)

    def forward_backward_custom(self, input_ids, custom_loss_fn: CustomLossFn, attention_mask=None, **kwargs):
        """Queue a pass whose loss is ``custom_loss_fn(model, inputs, outputs, **kwargs)``."""
        if not callable(custom_loss_fn):
            raise TypeError("custom_loss_fn must be callable as fn(model, inputs, outputs, **kwargs)")
        return self.forward_backward(
            input_ids, attention_mask=attention_mask, loss_fn=custom_loss_fn, **kwargs
        )

    def _forward(self, input_ids, attention_mask, use_reference):
        model = self.reference_model if use_reference else self.model
        if model is None:
            raise ValueError("use_reference=True but the pipeline has no reference_model")
        input_ids, attention_mask = self._prepare(input_ids, attention_mask)
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
            loss = cross_entropy_loss(logits, input_ids, attention_mask)
        return ForwardBackwardOutput(
            loss=float(loss), logits=logits, logprobs=logprobs_from_logits(logits[:, :-1], input_ids[:, 1:])
        )

    def forward(self, input_ids, attention_mask=None, use_reference: bool = False) -> AsyncTrainingFuture:
        """Queue a forward-only pass (no gradients); the frozen reference model never waits for steps."""
        if use_reference:
            return AsyncTrainingFuture(self._executor.submit(self._forward, input_ids, attention_mask, True))
        return self._submit_pass(lambda: self._forward(input_ids, attention_mask, False))

    # ---- optimiser ----------------------------------------------------------------------
    def _attach(self, optimizer, scheduler):
        self.optimizer, self.scheduler = optimizer, scheduler if scheduler is not None else self.scheduler
        if self._pending_optimizer_state is not None:
            optimizer.load_state_dict(self._pending_optimizer_state)
            self._pending_optimizer_state = None
        if self._pending_scheduler_state is not None and self.scheduler is not None:
            self.scheduler.load_state_dict(self._pending_scheduler_state)
            self._pending_scheduler_state = None

    def _optim_step(self, optimizer, scheduler, max_grad_norm, force):
        self._attach(optimizer, scheduler)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        learning_rate = float(optimizer.param_groups[0]["lr"])
        with self._lock:
            accumulated = self.accumulated
        if not params or (accumulated < self.gradient_accumulation_steps and not force):
            return OptimStepOutput(
                self.step_count, learning_rate, 0.0, {"applied": 0.0, "accumulated": float(accumulated)}
            )
        if accumulated < self.gradient_accumulation_steps:  # forced early: use the true mean
            for p in params:
                p.grad.mul_(self.gradient_accumulation_steps / max(accumulated, 1))
        limit = float("inf") if max_grad_norm is None else max_grad_norm
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
        optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        with self._lock:
            self.accumulated = 0
            self.step_count += 1
            step = self.step_count
        return OptimStepOutput(
            step, learning_rate, grad_norm, {"applied": 1.0, "accumulated": float(accumulated)}
        )

    def optim_step(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler=None,
        max_grad_norm: float | None = None,
        force: bool = False,
    ) -> AsyncTrainingFuture:
        """Queue an optimiser step after every pass queued so far.

        The update is applied once ``gradient_accumulation_steps`` passes have accumulated;
        an earlier call reports ``applied=0`` and keeps the gradients, unless ``force``.
        """
        return self._submit_step(lambda: self._optim_step(optimizer, scheduler, max_grad_norm, force))

    optim_step_async = optim_step

    # ---- sampling -----------------------------------------------------------------------
    def _sample(self, prompt, max_tokens, temperature, top_k, top_p, stop, seed):
        prompt_ids = torch.as_tensor(prompt, dtype=torch.long).reshape(1, -1).to(self.device)
        limit = self.position_limit
        if limit is not None and prompt_ids.size(1) + max_tokens > limit:
            # the ids are the caller's: cutting them would sample from another prompt than given
            raise InputError(
                f"a prompt of {prompt_ids.size(1)} tokens plus max_tokens {max_tokens} exceeds the "
                f"{limit} positions of the model; shorten the prompt or lower max_tokens"
            )
        stop_ids = list(stop) if stop else None
        gen_kwargs = {"do_sample": temperature > 0, "max_new_tokens": max_tokens}
        if temperature > 0:
            gen_kwargs.update(temperature=temperature, top_k=top_k or 0, top_p=top_p or 1.0)
        if seed is not None:
            torch.manual_seed(seed)
        generation_config = getattr(self.model, "generation_config", None)
        pad = getattr(generation_config, "pad_token_id", None)
        with torch.no_grad():
            out = self.model.generate(
                prompt_ids,
                attention_mask=torch.ones_like(prompt_ids),
                eos_token_id=stop_ids,
                pad_token_id=pad if pad is not None else (stop_ids[0] if stop_ids else 0),
                return_dict_in_generate=True,
                output_logits=True,
                **gen_kwargs,
            )
        tokens = out.sequences[0, prompt_ids.size(1) :]
        logits = torch.stack(out.logits, dim=1)[0]
        logprobs = logprobs_from_logits(logits, tokens)
        n = len(tokens)
        if stop_ids:
            hits = [i for i, t in enumerate(tokens.tolist()) if t in stop_ids]
            n = hits[0] + 1 if hits else n
        return {
            "tokens": tokens[:n].tolist(),
            "logprobs": logprobs[:n].tolist(),
            "prompt": prompt_ids[0].tolist(),
        }

    def sample_async(
        self, prompt, max_tokens=100, temperature=1.0, top_k=None, top_p=None, stop=None, seed=None
    ) -> AsyncTrainingFuture:
        return self._submit_pass(
            lambda: self._sample(prompt, max_tokens, temperature, top_k, top_p, stop, seed)
        )

    def sample(self, prompt, max_tokens=100, temperature=1.0, top_k=None, top_p=None, stop=None, seed=None):
        """Generate from the current weights: ``{"tokens", "logprobs", "prompt"}``.

        ``logprobs`` are the model's own (temperature 1, untruncated) log-probabilities of
        the sampled tokens, the same numbers a forward pass gives, so they can serve as
        ``old_logprobs`` for the importance-sampling and PPO losses.
        """
        return self.sample_async(prompt, max_tokens, temperature, top_k, top_p, stop, seed).result()

    # ---- checkpoints --------------------------------------------------------------------
    def save_state(self, name: str | Path) -> dict[str, str]:
        """Save model, optimiser, scheduler, counters and RNG under ``checkpoint_dir/name``."""
        self.wait()
        path = Path(name) if Path(name).is_absolute() else self.checkpoint_dir / name
        model_path = save_model_weights(self.model, path / "model")
        info = {"path": str(path), "model_path": str(model_path), "optimizer_path": "", "state_path": ""}
        if self.optimizer is not None:
            info["optimizer_path"] = str(save_optimizer_state(self.optimizer.state_dict(), path))
        if self.scheduler is not None:
            save_json_state(self.scheduler.state_dict(), path / "scheduler.json", "scheduler")
        capture_rng_state(path)
        state = {"step": self.step_count, "accumulated": self.accumulated}
        save_json_state(state, path / "state.json", "pipeline")
        info["state_path"] = str(path / "state.json")
        return info

    def load_state(self, path: str | Path, optimizer=None, scheduler=None) -> dict[str, Any]:
        """Restore what ``save_state`` wrote. Optimiser state goes into ``optimizer`` (or the
        one already attached); without one it is applied at the next ``optim_step``."""
        self.wait()
        path = Path(path)
        if not (path / "state.json").exists():
            raise FileNotFoundError(f"{path}: not a pipeline checkpoint (state.json missing)")
        load_model_weights(self.model, path / "model")
        optimizer = optimizer or self.optimizer
        if (path / "optimizer.json").exists():
            opt_state = load_optimizer_state(path)
            if optimizer is not None:
                optimizer.load_state_dict(opt_state)
                self.optimizer = optimizer
            else:
                self._pending_optimizer_state = opt_state
        scheduler = scheduler or self.scheduler
        if (path / "scheduler.json").exists():
            sched_state = json.loads((path / "scheduler.json").read_text(encoding="utf-8"))
            if scheduler is not None:
                scheduler.load_state_dict(sched_state)
                self.scheduler = scheduler
            else:
                self._pending_scheduler_state = sched_state
        restore_rng_state(path)
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        self.step_count, self.accumulated = state["step"], state["accumulated"]
        return state

    def shutdown(self, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=not wait)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


class AsyncTrainingClient:
    """The high-level face of the pipeline: batches as mappings, a reference model beside the policy."""

    def __init__(
        self,
        model: torch.nn.Module,
        reference_model: torch.nn.Module | None = None,
        device: torch.device | str | None = None,
        gradient_accumulation_steps: int = 1,
        max_workers: int = 2,
        checkpoint_dir: str | Path = "checkpoints",
    ):
        self.pipeline = ForwardBackwardPipeline(
            model,
            device=device,
            max_workers=max_workers,
            gradient_accumulation_steps=gradient_accumulation_steps,
            reference_model=reference_model,
            checkpoint_dir=checkpoint_dir,
        )

    @property
    def model(self) -> torch.nn.Module:
        return self.pipeline.model

    @staticmethod
    def _split(batch: Mapping[str, Any] | torch.Tensor) -> dict[str, Any]:
        if torch.is_tensor(batch):
            return {"input_ids": batch}
        if "input_ids" not in batch:
            raise KeyError(f"batch needs 'input_ids'; got keys {sorted(batch)}")
        return dict(batch)

    def forward_backward(self, batch, loss_fn: str | CustomLossFn = "cross_entropy", **loss_kwargs):
        batch = {**self._split(batch), **loss_kwargs}
        return self.pipeline.forward_backward(batch.pop("input_ids"), loss_fn=loss_fn, **batch)

    def forward(self, batch, use_reference: bool = False) -> AsyncTrainingFuture:
        batch = self._split(batch)
        return self.pipeline.forward(
            batch["input_ids"], batch.get("attention_mask"), use_reference=use_reference
        )

    def optim_step(self, optimizer, scheduler=None, max_grad_norm: float | None = None, force: bool = False):
        return self.pipeline.optim_step(optimizer, scheduler, max_grad_norm=max_grad_norm, force=force)

    def sample(self, prompt, **kwargs) -> dict[str, list]:
        return self.pipeline.sample(prompt, **kwargs)

    def save_state(self, name: str | Path) -> dict[str, str]:
        return self.pipeline.save_state(name)

    def load_state(self, path: str | Path, optimizer=None, scheduler=None) -> dict[str, Any]:
        return self.pipeline.load_state(path, optimizer, scheduler)

    def shutdown(self, wait: bool = True) -> None:
        self.pipeline.shutdown(wait)
