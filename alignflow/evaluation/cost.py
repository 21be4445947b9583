"""What a run cost: each stage's wall, CPU and GPU seconds, the tokens it trained, and the
share of this machine's measured matmul peak its training reached (MFU).

Every figure is what ran, never what the config asked for: seconds from the clocks around
the stage, tokens from the trainer's own count of the batches it stepped through, the peak
from a matmul probe in the same process, dtype and device as the model trained. The stage
runs carry ``cost/*`` metrics, the pipeline's parent run their totals, and a policy's
version page prices its improvement in GPU- or CPU-minutes (:func:`cost_line`).
"""

from __future__ import annotations

import platform
import resource
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from alignflow.models.gemm_rate import peak_gflops

COST = "cost"
WALL_SECONDS = f"{COST}/wall_seconds"
CPU_SECONDS = f"{COST}/cpu_seconds"
GPU_SECONDS = f"{COST}/gpu_seconds"
TOKENS_TRAINED = f"{COST}/tokens_trained"
MFU = f"{COST}/mfu"
PEAK_GFLOPS = f"{COST}/peak_gflops"
DEVICE_TAG = f"{COST}.device"  # the GPU's name or the CPU model the peak was measured on
DTYPE_TAG = f"{COST}.dtype"  # the dtype the training matmuls ran in, and the peak was measured in
# what adds up over the stages of a run (a rate such as MFU does not)
SUMMED = (WALL_SECONDS, CPU_SECONDS, GPU_SECONDS, TOKENS_TRAINED)
PRICED_GAIN = 0.01  # the improvement a price is quoted per

T = TypeVar("T")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all its threads) and of its children that
    have exited (``getrusage`` SELF + CHILDREN): a stage run as ``accelerate launch`` workers
    counts their CPU once they are done, which ``time.process_time`` would miss."""
    spent = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        spent += usage.ru_utime + usage.ru_stime
    return spent


def cuda_devices() -> int:
    """The CUDA devices this process can use (the trainers take every visible one); 0 where
    torch was never loaded, as a stage that did not load it used no GPU."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return 0
    return int(torch.cuda.device_count())


def timed(call: Callable[[], T]) -> tuple[T, dict[str, float]]:
    """Run ``call``; return its result and its wall, CPU and GPU seconds. GPU seconds are
    device-seconds held (wall x the CUDA devices visible), what a GPU bill charges, not busy
    time; 0 on a CPU-only machine."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = call()
    wall_spent = time.perf_counter() - wall
    return result, {
        WALL_SECONDS: wall_spent,
        CPU_SECONDS: cpu_seconds() - cpu,
        GPU_SECONDS: wall_spent * cuda_devices(),
    }


def _linear_types() -> tuple[Any, ...]:
    import torch

    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency
        return (torch.nn.Linear,)
    return (torch.nn.Linear, Conv1D)


def matmul_weights(model: Any) -> list[tuple[Any, bool]]:
    """The weights a token is multiplied by, in the order the model registers them (its
    forward order for transformers' models): every linear layer's (LoRA's adapters and a tied
    output head included, each tensor once), each with whether a gradient reaches its input,
    i.e. whether something that trains was registered before it. Embedding tables are looked
    up, not multiplied: an encoder's vocabulary costs no FLOPs, a decoder's head does."""
    linear_types = _linear_types()
    weights: dict[int, tuple[Any, bool]] = {}
    trains_below = False
    for module in model.modules():
        if isinstance(module, linear_types):
            weights.setdefault(id(module.weight), (module.weight, trains_below))
        trains_below = trains_below or any(p.requires_grad for p in module.parameters(recurse=False))
    return list(weights.values())


def flops_per_token(model: Any) -> float:
    """Training FLOPs per token: 2 per multiplied weight forward, 2 more for the gradient of
    its input where a gradient reaches it (not below the lowest layer that trains: a reward
    model with frozen lower layers sends none down them), and 2 more per trained weight for
    its own gradient. Full fine-tuning gives the usual 6 per parameter, LoRA about 4, a
    frozen model 2."""
    weights = matmul_weights(model)
    multiplied = sum(w.numel() for w, _ in weights)
    backpropagated = sum(w.numel() for w, graded in weights if graded)
    trained = sum(w.numel() for w, _ in weights if w.requires_grad)
    return float(2 * multiplied + 2 * backpropagated + 2 * trained)


def training_flops(per_token: float, tokens: int) -> float:
    """FLOPs of training ``tokens`` at ``per_token`` (:func:`flops_per_token`). Generation
    (GRPO's rollouts) and reference passes are not counted, so an RL stage's MFU understates
    what the hardware did."""
    return float(per_token * tokens)


def mfu(per_token: float, tokens: int, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s over the measured peak FLOP/s."""
    return training_flops(per_token, tokens) / seconds / peak_flops


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's model name (``/proc/cpuinfo``, else what platform says)."""
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None:
        return str(torch.cuda.get_device_name(device))
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def tokens_trained(trainer: Any) -> int | None:
    """Tokens the trainer's last ``train()`` stepped through: transformers' count
    (``state.num_input_tokens_seen``, where GRPO keeps its own) less where that call began, a
    resumed run's earlier tokens having been paid for by the run that trained them; else TRL's
    counter for this process (``_total_train_tokens``: SFT, DPO, KTO, reward). None where the
    trainer counted none."""
    seen = trainer.state.num_input_tokens_seen or 0
    seen -= getattr(trainer, "_initial_num_input_tokens_seen", 0) or 0
    if seen > 0:
        return int(seen)
    return int(getattr(trainer, "_total_train_tokens", 0) or 0) or None


def compute_dtype(trainer: Any) -> str:
    """The dtype the trainer's matmuls ran in: its mixed precision, else the weights' own."""
    if getattr(trainer.args, "bf16", False):
        return "bfloat16"
    if getattr(trainer.args, "fp16", False):
        return "float16"
    weights = next(p for p in trainer.model.parameters() if p.is_floating_point())
    return str(weights.dtype).removeprefix("torch.")


def training_cost(trainer: Any, train_seconds: float) -> tuple[dict[str, float], dict[str, str]]:
    """A trainer's ``cost/tokens_trained``, and its ``cost/mfu`` against ``cost/peak_gflops``
    measured here (one device's peak x the devices that trained), with the device's name and
    the dtype it ran in as tags. Empty where it counted no tokens."""
    tokens = tokens_trained(trainer)
    if not tokens:
        return {}, {}
    device = str(trainer.args.device)
    devices = trainer.args.world_size * max(trainer.args.n_gpu, 1)
    dtype = compute_dtype(trainer)
    peak = peak_gflops(dtype, device) * devices
    figures = {TOKENS_TRAINED: float(tokens), PEAK_GFLOPS: peak}
    if train_seconds > 0:
        figures[MFU] = mfu(flops_per_token(trainer.model), tokens, train_seconds, peak * 1e9)
    return figures, {DEVICE_TAG: device_name(device), DTYPE_TAG: dtype}


def totals(stages: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The summed figures over a run's stages (each key only where some stage has it)."""
    summed: dict[str, float] = {}
    for figures in stages:
        for key in SUMMED:
            if key in figures:
                summed[key] = summed.get(key, 0.0) + float(figures[key])
    return summed


def _count(n: float) -> str:
    """``1.2M``, ``35.4k``, ``950``: a token count at a glance."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


def price_of_gain(seconds: float, gain: float) -> float | None:
    """Minutes (of a CPU or a GPU) per +0.01 of ``gain``; None where nothing improved."""
    return None if gain <= 0 else seconds / 60 / (gain / PRICED_GAIN)


def cost_line(spent: Mapping[str, float], gain: float | None = None, reused: Sequence[str] = ()) -> str:
    """A run's cost in one line, and (given the task accuracy ``gain`` over the reference)
    what each +0.01 of it cost, in GPU-minutes where a GPU was held (what is billed), else in
    CPU-minutes; ``reused`` names stages counted at their cost in the run that did the work."""
    cpu = spent.get(CPU_SECONDS, 0.0)
    parts = [f"{cpu / 60:.1f} CPU-minutes"]
    if spent.get(GPU_SECONDS):
        parts.append(f"{spent[GPU_SECONDS] / 60:.1f} GPU-minutes")
    if spent.get(TOKENS_TRAINED):
        parts.append(f"{_count(spent[TOKENS_TRAINED])} tokens trained")
    line = "Cost: " + ", ".join(parts)
    if reused:
        line += f" ({', '.join(reused)} reused from earlier runs, counted at what they cost there)"
    if gain is None:
        return line
    unit, seconds = ("GPU", spent[GPU_SECONDS]) if spent.get(GPU_SECONDS) else ("CPU", cpu)
    price = price_of_gain(seconds, gain)
    if price is None:
        return line + "; no improvement to price"
    return line + f"; {price:.2f} {unit}-minutes per +{PRICED_GAIN} task accuracy over the reference"
