"""Per-token log-probabilities on a CPU without scoring the tokens nobody asked about.

TRL's trainers call ``model(..., labels=labels, fused_lm_head=True)`` and TRL's fused head
scores every position on a CPU (only its Triton path skips the ``-100`` labels), with the
49k-token vocabulary projected in fp32. For a DPO pair that is the whole prompt, twice; on
SmolLM2 it was over half of a training step on 2 cores. This head projects only the
labelled positions, keeps the logits in fp32 (as TRL does: log-probs of the same precision),
and works out each token's input gradient during the forward pass, as a row of ``d_model``
numbers: the backward is then a scale and a scatter, and no logits are kept or recomputed.
The vocabulary is read in blocks with a running softmax, so the head streams from memory once
per pass over up to a thousand rows, and the fp32 products go to the faster of torch's BLAS
and oneDNN on this CPU (:mod:`alignflow.models.fp32_gemm`).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from alignflow.models.fp32_gemm import bf16_valued_linear, fp32_linear
from alignflow.models.packed_rows import PackingCounts, last_hidden_state, packing_counts
from alignflow.training.model_preparation import PreparedModelsMixin

# the head is read in blocks of VOCAB_BLOCK tokens for up to ROWS_PER_PASS rows at once: a
# [1024, 2048] fp32 block of logits is 8 MB, and the head streams from memory once per pass
# instead of once per 64 rows (640 rows of SmolLM2 with their gradient: 0.47 -> ~0.2 s on a
# Zen 5, oneDNN included)
VOCAB_BLOCK = 2048
ROWS_PER_PASS = 1024
ENTROPY_GRAD_ROWS = 64  # an entropy bonus's gradient (rare) takes whole [64, vocab] blocks
# exponents are floored here before ``exp``: torch's vectorised fp32 exp falls to a path 20-30x
# slower for arguments below about -87 (results that underflow), which most of a confident
# model's vocabulary is (an AMX Xeon, 2 cores: 10-20 ms for a [896, 2048] block, 0.5 floored);
# e^-80 next to a row's largest term (e^0) changes no fp32 sum
EXP_FLOOR = -80.0


# config fields with which a model's logits are more than h @ W.T (TRL's head applies them)
LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)
EXTRAS = ("entropy", "mean_logits", "is_top1")  # what this head adds to the log-probs (TRL's names)

# frozen head weight -> ((its version, its address), its fp32 copy): a bf16 SmolLM2 head is 113 MB in fp32,
# which every forward (policy and reference alike) would otherwise allocate and convert again
_FP32_WEIGHTS: Any = WeakTensorKeyDictionary()


def _fp32_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` in fp32, converted once while it stays unchanged (an in-place update bumps its
    version, new ``.data`` moves its pointer); a weight that trains is converted on each call,
    inside the graph."""
    if weight.dtype == torch.float32 or weight.requires_grad or weight.is_inference():
        return weight.float()  # (an inference tensor keeps no version to check)
    stamp = (weight._version, weight.data_ptr())
    cached_stamp, copy = _FP32_WEIGHTS.get(weight, (None, None))
    if cached_stamp != stamp:
        copy = weight.float()
        _FP32_WEIGHTS[weight] = (stamp, copy)
    return copy


def _chunk_logits(
    rows: torch.Tensor, weight32: torch.Tensor, temperature: float, bf16_valued: bool
) -> torch.Tensor:
    """fp32 ``rows @ W.T / temperature``. ``bf16_valued``: rows and head are a bf16 model's,
    widened, so the product may run in bf16 math (exact inputs, fp32 sums) and the temperature
    scales the logits after it, keeping the rows bf16 values."""
    rows = rows.float()
    if bf16_valued:
        logits = bf16_valued_linear(rows, weight32)
        return logits if temperature == 1.0 else logits.div_(temperature)
    if temperature != 1.0:
        rows = rows / temperature
    return fp32_linear(rows, weight32)


class _OnlineSoftmax:
    """Running sums over vocabulary blocks for a set of rows, rescaled whenever a row's maximum
    grows (as flash attention does over keys): the label's logit, ``sum exp(l - max)`` over the
    other tokens, ``sum exp(l - max) * l``, and (for the gradient) ``sum exp(l - max) * W_v``
    over the other tokens. The label is kept apart so that ``1 - p_y`` is a sum of the other
    tokens' probabilities, not a difference that cancels for a confident token."""

    def __init__(self, rows: int, width: int, dtype: torch.dtype, with_grad: bool) -> None:
        self.maximum = torch.full((rows,), -torch.inf)
        self.others = torch.zeros(rows)
        self.moment = torch.zeros(rows)
        self.label_logit = torch.zeros(rows)
        self.logit_sum = torch.zeros(rows)
        self.top = torch.full((rows,), -torch.inf)
        self.top_index = torch.zeros(rows, dtype=torch.long)
        self.weighted = torch.zeros(rows, width) if with_grad else None
        self.dtype = dtype

    def add(self, logits: torch.Tensor, start: int, targets: torch.Tensor, block: torch.Tensor) -> None:
        """Fold in the logits of tokens ``start ...`` (``block``: their rows of W)."""
        block_top, block_index = logits.max(-1)
        higher = block_top > self.top  # strict: the first of tied maxima wins, as in argmax
        self.top = torch.where(higher, block_top, self.top)
        self.top_index = torch.where(higher, block_index + start, self.top_index)
        self.logit_sum += logits.sum(-1)
        maximum = torch.maximum(self.maximum, block_top)
        rescale = torch.exp(self.maximum - maximum)
        scaled = torch.sub(logits, maximum[:, None]).clamp_(min=EXP_FLOOR).exp_()
        self.moment = self.moment * rescale + torch.linalg.vecdot(scaled, logits)
        rows = torch.nonzero((targets >= start) & (targets < start + logits.shape[1]))[:, 0]
        columns = targets[rows] - start
        self.label_logit[rows] = logits[rows, columns]
        scaled[rows, columns] = 0.0
        self.others = self.others * rescale + scaled.sum(-1)
        if self.weighted is not None:
            self.weighted = self.weighted * rescale[:, None] + (scaled.to(self.dtype) @ block).float()
        self.maximum = maximum

    def scores(self, targets: torch.Tensor, vocab: int) -> dict[str, torch.Tensor]:
        label = torch.exp(self.label_logit - self.maximum)
        total = self.others + label
        log_total = self.maximum + torch.log(total)
        return {
            "log_probs": self.label_logit - log_total,
            "entropy": log_total - self.moment / total,
            "mean_logits": self.logit_sum / vocab,
            "is_top1": self.top_index == targets,
            "others": self.others / total,
            "total": total,
        }


def _score_rows(
    rows: torch.Tensor,
    weight: torch.Tensor,
    weight32: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_grad: bool,
) -> dict[str, torch.Tensor]:
    """One pass over the vocabulary for ``rows``: the head streams once, no [rows, vocab] logits."""
    state = _OnlineSoftmax(len(rows), weight.shape[1], weight.dtype, with_grad)
    bf16_valued = rows.dtype == weight.dtype == torch.bfloat16
    for start in range(0, len(weight), VOCAB_BLOCK):
        stop = start + VOCAB_BLOCK
        logits = _chunk_logits(rows, weight32[start:stop], temperature, bf16_valued)
        state.add(logits, start, targets, weight[start:stop])
    scores = state.scores(targets, len(weight))
    others, total = scores.pop("others"), scores.pop("total")
    if with_grad:
        # d logp / dh = (1 - p_y) W_y - sum_{v != y} p_v W_v, over the temperature
        assert state.weighted is not None
        label_part = others[:, None] * weight32[targets]
        scores["dlogp"] = (label_part - state.weighted / total[:, None]) / temperature
    return scores


def _score_chunks(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float, with_grad: bool
) -> dict[str, torch.Tensor]:
    """Per row: log-prob of its label, entropy, mean logit, whether the label is the top token,
    and (``with_grad``) ``d logp / dh``; :data:`ROWS_PER_PASS` rows a pass over the head."""
    weight32 = _fp32_weight(weight)
    parts = [
        _score_rows(rows, weight, weight32, targets, temperature, with_grad)
        for rows, targets in zip(hidden.split(ROWS_PER_PASS), labels.split(ROWS_PER_PASS), strict=True)
    ]
    if not parts:
        parts = [_score_rows(hidden, weight, weight32, labels, temperature, with_grad)]
    return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}


class _LabelLogProbs(torch.autograd.Function):
    """Log-probability and entropy of each labelled row under ``softmax(h @ W.T / temperature)``.

    The forward keeps ``d logp / d h`` per row, so the common backward (log-probs only) needs
    no logits; an entropy that receives a gradient (an entropy bonus) recomputes its chunk.
    Gradients reach ``h`` only: the caller keeps TRL's path where the head itself trains.
    """

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float
    ) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        scores = _score_chunks(hidden, weight, labels, temperature, with_grad=True)
        ctx.save_for_backward(scores["dlogp"], hidden, weight)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(scores["mean_logits"], scores["is_top1"])
        return scores["log_probs"], scores["entropy"], scores["mean_logits"], scores["is_top1"]

    @staticmethod
    def backward(ctx: Any, grad_logp: Any, grad_entropy: Any, *_: Any) -> Any:
        dlogp, hidden, weight = ctx.saved_tensors
        grad = dlogp * grad_logp[:, None] if grad_logp is not None else torch.zeros_like(dlogp)
        if grad_entropy is not None:
            grad += _entropy_input_grad(hidden, weight, ctx.temperature) * grad_entropy[:, None]
        return grad.to(hidden.dtype), None, None, None


def _entropy_input_grad(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """d H / dh = -sum_v p_v (log p_v + H) W_v / T, chunk by chunk."""
    weight32, parts = _fp32_weight(weight), []
    for rows in hidden.split(ENTROPY_GRAD_ROWS):
        log_softmax = torch.log_softmax(_chunk_logits(rows, weight32, temperature, False), dim=-1)
        probs = log_softmax.exp()
        entropy = -(probs * log_softmax).sum(-1, keepdim=True)
        parts.append(-((probs * (log_softmax + entropy)) @ weight32) / temperature)
    return torch.cat(parts)


def label_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> dict[str, torch.Tensor]:
    """Per row of ``hidden`` [T, d] and its label [T]: ``log_probs`` (differentiable), ``entropy``
    (differentiable), ``mean_logits`` and ``is_top1``."""
    if torch.is_grad_enabled() and hidden.requires_grad:
        outputs = _LabelLogProbs.apply(hidden, weight, labels, temperature)
        return dict(zip(("log_probs", *EXTRAS), outputs, strict=True))
    scores = _score_chunks(hidden, weight, labels, temperature, with_grad=False)
    return {name: scores[name] for name in ("log_probs", *EXTRAS)}


def _at_mask(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row values back at their positions, zero elsewhere (still connected to the graph)."""
    return values.new_zeros(mask.shape).masked_scatter(mask, values)


def _head_is_plain(model: Any) -> bool:
    """True when the logits are just ``h @ W.T``: no bias, scale or soft-capping."""
    config = model.config.get_text_config()
    head = model.get_output_embeddings()
    scaled = any(getattr(config, name, None) not in (None, 1.0) for name in LOGIT_TRANSFORMS)
    return head is not None and getattr(head, "bias", None) is None and not scaled


@dataclass
class HeadCalls:
    """Forwards the label head scored, shared by a model and the copies that run it."""

    calls: int = 0


def install_label_head(
    model: Any, temperature: float = 1.0, outputs: tuple[str, ...] = ("log_probs",)
) -> bool:
    """Route ``model(..., fused_lm_head=True)`` on a CPU through :func:`label_logprobs`.

    ``model`` is the causal LM TRL patched with ``add_fused_lm_head`` (under PEFT, its base
    model), ``temperature`` and ``outputs`` what TRL patched it with. Other devices, a head
    with a bias, scale or trainable weight, pre-shifted labels, router logits and fields this
    head does not compute keep TRL's path. Returns whether the head was installed.
    """
    if set(outputs) - {"log_probs", *EXTRAS} or not hasattr(model, "get_output_embeddings"):
        return False
    if not _head_is_plain(model):
        return False
    from trl.trainer.utils import FusedCausalLMOutput

    trl_forward = model.forward
    # the counters exist before any forward: accelerate's regional compilation runs a copy of
    # each module on the way to the layers, their attributes copied shallowly, and a counter
    # first set on the copy was never seen by the stage's tags (``torch_compile: true``)
    model.label_head_counter = HeadCalls()
    packing_counts(model.base_model)

    def forward(self: Any, *args: Any, fused_lm_head: bool = False, labels: Any = None, **kwargs: Any) -> Any:
        head = self.get_output_embeddings()
        if (
            not fused_lm_head
            or labels is None
            or head.weight.device.type != "cpu"
            or head.weight.requires_grad
            or kwargs.get("shift_labels") is not None
            or kwargs.get("output_router_logits")
        ):
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels, **kwargs)
        self.label_head_counter.calls += 1
        num_items = kwargs.pop("num_items_in_batch", None)
        kwargs.pop("shift_labels", None)
        kwargs["use_cache"] = False
        body = self.base_model  # padding-free where the call allows (alignflow.models.packed_rows)
        hidden = body(*args, **kwargs).last_hidden_state if args else last_hidden_state(body, **kwargs)
        hidden = hidden[:, :-1]
        targets = labels[:, 1:]
        mask = targets != -100
        scores = label_logprobs(hidden[mask], head.weight, targets[mask], temperature)
        fields = {name: _at_mask(scores[name], mask) for name in outputs}
        count = mask.sum().clamp(min=1) if num_items is None else num_items
        return FusedCausalLMOutput(loss=-fields["log_probs"].sum() / count, label_mask=mask, **fields)

    model.forward = types.MethodType(forward, model)
    return True


class LabelHeadMixin(PreparedModelsMixin):
    """For TRL trainers that patch the fused head: after TRL's ``__init__``, the policy (and a
    separate reference) score only the labelled positions on a CPU. ``label_head`` says
    whether it is in use (TRL's head stays for WPO's weights, which need ``log_sum_sq_probs``)."""

    label_head: bool = False
    model: Any
    ref_model: Any
    _label_head_model: Any = None

    def prepare_models(self) -> None:
        """Install the head on the policy (and a separate reference), once, over the head TRL
        patched in (DPO's early reference pass runs after that patch)."""
        super().prepare_models()
        if self._label_head_model is not None or getattr(self, "use_weighting", False):
            return
        temperature = float(getattr(self, "temperature", 1.0))
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        self.label_head = install_label_head(base, temperature, outputs=("log_probs", *EXTRAS))
        self._label_head_model = base
        reference = getattr(self, "ref_model", None)
        if reference is not None:
            install_label_head(reference, temperature, outputs=("log_probs", *EXTRAS))

    @property
    def packing(self) -> PackingCounts:
        """What the policy's packed forwards saved (nothing where the head is TRL's)."""
        if self._label_head_model is None:
            return PackingCounts()
        return packing_counts(self._label_head_model.base_model)

    @property
    def label_head_calls(self) -> int:
        """Forwards of the policy that this head scored (0 where TRL's head ran them all)."""
        counter = getattr(self._label_head_model, "label_head_counter", None)
        return counter.calls if counter is not None else 0
