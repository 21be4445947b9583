"""DPO and GRPO on a CUDA GPU: alignflow's stages against TRL's trainers (issue #50, GPU part).

The model is SmolLM2-135M-Instruct's architecture (its ``config.json``) with RANDOM weights,
bf16, and its real tokenizer: the real weights do not fit what a call to the lent GPU
machine carries (``tools/gpu_prepare.py`` brings the config and tokenizer). Throughput, MFU
and memory are those of the real model's shapes; losses and rewards are meaningless.

Cases, each run by both sides (the runners of ``bench/real_model_trl_bench.py``, imported,
with its size knobs set here: alignflow's stage functions ``run_dpo``/``run_grpo`` called as
the pipeline calls them, with the model as ``model.name``; TRL's trainers as a user would
configure them, given TRL's documented speed settings as in the CPU bench):

- ``dpo-full``: DPO, full fine-tune, ``PAIRS`` pairs per optimizer step, every sequence
  (prompt + completion) exactly ``LENGTH`` tokens (synthetic pairs cut from the repository's
  own text, longer than ``LENGTH``, truncated by TRL's collator on both sides), reference
  log-probs precomputed on both sides (alignflow: its cache, cold in every run);
- ``dpo-lora``: the same with LoRA r16 on every linear layer (bf16 base);
- ``grpo-full``: GRPO, full fine-tune, ``COMPLETIONS`` completions per step (4 per prompt)
  of ``COMPLETION_LENGTH`` tokens (a random model rarely stops early), the word-problem
  prompts and verifiers of ``configs/smollm2-math.yaml``. alignflow's stage generates
  through TRL's GRPOTrainer, i.e. the same plain ``generate`` as the TRL side.

Timing: the train loop's steady state. Every run's first optimizer step is a warm-up,
excluded; the rate is measured from the end of step 1 to the end of the last step
(``torch.cuda.synchronize`` at each step end), rows = pairs (DPO) or completions (GRPO),
tokens = what the trainer itself counts (DPO: chosen + rejected tokens; GRPO: prompt +
completion tokens). Before any timed run, one untimed warm-up run per stage (TRL side) pays
the fresh machine's cold start. Sides alternate which goes first (ABBA over the repeats,
offset per case), ``REPEATS`` runs per side and case, all in one process (between runs:
``gc``, emptied CUDA cache, peak-memory counters reset; TRL runs get torch's defaults back:
alignflow's stages set deterministic algorithms for the process, off on a GPU unless a stage
asks, and their allocation fill off). Each run records whether deterministic algorithms were
on. Reported: medians with min-max, ratios alignflow/TRL of the medians.

MFU: model FLOPs per trained token, 6 N (full fine-tune) or 4 N (frozen base with
adapters: no weight gradients), N the model's parameters, attention's own FLOPs not
counted; against the bf16 GEMM peak measured in the same run (8192^3 matmuls). GRPO's
training MFU counts the update's FLOPs over the whole step, generation's time included; its
all-FLOPs MFU adds 2 N per prompt and completion token for sampling them, as the CPU bench does
(:data:`bench.real_model_trl_bench.FLOPS_PER_TOKEN`).

On the GPU machine (see ``tools/gpu_prepare.py``), with ``carry: [".gpu"]``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
      --target /tmp/site .gpu/wheels/*.whl || exit 3
    export PYTHONPATH=/tmp/site:$PWD TQDM_DISABLE=1 HF_DATASETS_DISABLE_PROGRESS_BARS=1 \\
      PYTHONWARNINGS=ignore::FutureWarning PYTHONUNBUFFERED=1
    timeout 395 python3 -m bench.gpu_trl_bench > $OUT/log.txt 2>&1

It writes ``$OUT/gpu_trl.json`` (when ``OUT`` is set); on an H100 (2026-11-27) the defaults
took 318 s. ``python -m bench.gpu_trl_bench --markdown FILE.json`` writes
``bench/results/gpu_trl.md`` from such a file. Knobs (environment,
``ALIGNFLOW_GPU_BENCH_``): ``REPEATS`` (3), ``PAIRS`` (64), ``LENGTH`` (512),
``DPO_STEPS`` (timed steps, 5), ``COMPLETIONS`` (64), ``COMPLETION_LENGTH`` (128),
``GRPO_STEPS`` (2), ``CASES`` (comma-separated), ``WARMUP`` (1: the untimed warm-up runs),
``MODEL_FILES`` (config + tokenizer folder), ``GRPO_CACHE`` (alignflow's side only:
``grpo.cache_implementation``, e.g. ``static``; unset: TRL's default dynamic cache),
``GRPO_COMPILE=1`` (alignflow's side only: ``grpo.compile_generation``, with ``GRPO_CACHE=static``;
TRL's side always runs as a user's script does by default), ``TINY=1`` (a 2-layer model and tiny sizes:
a CPU check that the bench runs), ``ALLOW_CPU=1`` (run without CUDA).
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import real_model_trl_bench as rmt
from bench.training_bench import REPO, RESULTS


def _knob(name: str, default: int) -> int:
    return int(os.environ.get(f"ALIGNFLOW_GPU_BENCH_{name}", default))


TINY = os.environ.get("ALIGNFLOW_GPU_BENCH_TINY") == "1"
REPEATS = _knob("REPEATS", 3)
PAIRS = _knob("PAIRS", 4 if TINY else 64)
LENGTH = _knob("LENGTH", 48 if TINY else 512)
DPO_STEPS = _knob("DPO_STEPS", 1 if TINY else 5)  # timed, after the warm-up step
COMPLETIONS = _knob("COMPLETIONS", 8 if TINY else 64)
COMPLETION_LENGTH = _knob("COMPLETION_LENGTH", 6 if TINY else 128)
GRPO_STEPS = _knob("GRPO_STEPS", 1 if TINY else 2)
WARMUP_RUNS = _knob("WARMUP", 1)
WARMUP_STEPS = 1  # per run: its first optimizer step is not timed
NUM_GENERATIONS = rmt.NUM_GENERATIONS
MODEL_FILES = Path(os.environ.get("ALIGNFLOW_GPU_BENCH_MODEL_FILES", REPO / ".gpu" / "smollm2-135m-instruct"))
SIDES = ("alignflow", "trl")
ALL_CASES = ("dpo-full", "dpo-lora", "grpo-full")
CASES = tuple(c for c in os.environ.get("ALIGNFLOW_GPU_BENCH_CASES", ",".join(ALL_CASES)).split(",") if c)
# alignflow's side only (TRL's runs as a user's script does by default: dynamic cache, no compile)
GRPO_CACHE = os.environ.get("ALIGNFLOW_GPU_BENCH_GRPO_CACHE") or None  # grpo.cache_implementation
GRPO_COMPILE = os.environ.get("ALIGNFLOW_GPU_BENCH_GRPO_COMPILE") == "1"  # grpo.compile_generation
GEMM_SIZE = 8192
RUNNERS = {
    ("dpo", "alignflow"): "run_alignflow_dpo",
    ("dpo", "trl"): "run_trl_dpo",
    ("grpo", "alignflow"): "run_alignflow_grpo",
    ("grpo", "trl"): "run_trl_grpo",
}
# the CPU bench's hooks this bench re-points (model, LoRA on/off, saving a full model)
_ORIGINAL = {name: getattr(rmt, name) for name in ("_alignflow_config", "_lora", "_merged", "smollm2_path")}


def case_spec(case: str) -> dict[str, Any]:
    stage, tuning = case.split("-")
    lora = tuning == "lora"
    if stage == "dpo":
        return {"stage": stage, "lora": lora, "batch": PAIRS, "timed_steps": DPO_STEPS, "row": "pairs"}
    return {
        "stage": stage,
        "lora": lora,
        "batch": COMPLETIONS,
        "timed_steps": GRPO_STEPS,
        "row": "completions",
    }


# ------------------------------------------------------------------ device helpers


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gemm_peak_tflops(size: int = GEMM_SIZE, repeats: int = 20) -> dict[str, float]:
    """bf16 ``size``^3 matmuls on this GPU: the best and the median of ``repeats`` timed ones."""
    import torch

    a = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    flops = 2 * size**3
    return {"best": flops / min(times) / 1e12, "median": flops / statistics.median(times) / 1e12}


def environment() -> dict[str, Any]:
    import subprocess
    from importlib import metadata

    import torch

    from bench.provenance import code_commit

    info: dict[str, Any] = {
        "code_commit": code_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    for package in ("transformers", "trl", "peft", "accelerate", "datasets", "tokenizers"):
        info[package] = metadata.version(package)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["multiprocessors"] = props.multi_processor_count
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=False,
            ).stdout.strip()  # fmt: skip
        except OSError:
            info["driver"] = None
    return info


# ------------------------------------------------------------------ inputs


def random_model(root: Path) -> tuple[Path, int]:
    """SmolLM2-135M-Instruct's architecture with random weights (bf16) and its real tokenizer,
    saved where both sides load it from; and its parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(MODEL_FILES)
    if TINY:  # a CPU check of the bench itself: SmolLM2's vocabulary, a tiny body
        config.update(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "head_dim": 16,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
            }  # fmt: skip
        )
    tokenizer = AutoTokenizer.from_pretrained(MODEL_FILES)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    target = root / "smollm2-135m-instruct-random"
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    return target, parameters


def corpus_tokens(tokenizer: Any) -> list[int]:
    """The repository's own prose and code as SmolLM2 tokens (what travels to the GPU machine)."""
    texts, chars = [], 0
    paths = [
        REPO / "README.md",
        *sorted((REPO / "docs").rglob("*.md")),
        *sorted((REPO / "alignflow").rglob("*.py")),
    ]
    for path in paths:
        if path.is_file():
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
            chars += len(texts[-1])
        if chars > 600_000:
            break
    return tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"]


def synthetic_pairs(tokenizer: Any, n: int, length: int) -> list[dict[str, Any]]:
    """``n`` pairs whose prompt (chat-templated) plus either completion is longer than
    ``length`` tokens: TRL's collator cuts every sequence to exactly ``length`` on both sides."""
    import random

    tokens = corpus_tokens(tokenizer)
    rng = random.Random(0)
    prompt_len, completion_len = max(4, length // 5), length  # the template adds ~30 more
    span = prompt_len + 2 * completion_len
    if len(tokens) <= span:
        tokens = tokens * (span // max(len(tokens), 1) + 2)

    def text(start: int, count: int) -> str:
        return tokenizer.decode(tokens[start : start + count])

    pairs = []
    for i in range(n):
        start = rng.randrange(0, len(tokens) - span)
        pairs.append(
            {
                "id": f"synthetic-{i}",
                "kind": "pair",
                "prompt": text(start, prompt_len),
                "chosen": text(start + prompt_len, completion_len),
                "rejected": text(start + prompt_len + completion_len, completion_len),
                "source": "repository text",
                "metadata": {},
            }
        )
    return pairs


def prepare(root: Path, model_dir: Path) -> dict[str, Any]:
    """The snapshots both sides read: ``root/hh`` (synthetic pairs) and ``root/math`` (the word
    problems' prompts with their answers), in the folder names the CPU bench's runners use."""
    from transformers import AutoTokenizer

    from alignflow.data import word_problems
    from alignflow.data.snapshot import write_split
    from alignflow.models.prompting import format_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    most_steps = WARMUP_STEPS + max(DPO_STEPS, GRPO_STEPS)
    pairs = synthetic_pairs(tokenizer, PAIRS * (WARMUP_STEPS + DPO_STEPS) + 1, LENGTH)
    write_split(root / "hh", "train", pairs[:-1])
    write_split(root / "hh", "eval", pairs[-1:])  # alignflow's stage evaluates 1 row before and after

    prompts_needed = COMPLETIONS // NUM_GENERATIONS * most_steps
    problems = word_problems.all_problems(prompts_needed + 8, seed=0)
    prompts = [dict(r, kind="prompt") for r in word_problems.iter_prompts(problems)]
    write_split(root / "math", "train", prompts[:prompts_needed])
    write_split(root / "math", "eval", prompts[prompts_needed:])
    lengths = [
        len(
            tokenizer(format_prompt(tokenizer, p["prompt"]) + p["chosen"], add_special_tokens=False)[
                "input_ids"
            ]
        )
        for p in pairs[:8]
    ]
    prompt_lengths = [
        len(tokenizer(format_prompt(tokenizer, p["prompt"]), add_special_tokens=False)["input_ids"])
        for p in prompts[:8]
    ]
    return {
        "dpo_pairs": len(pairs) - 1,
        "dpo_untruncated_sequence_tokens_min": min(lengths),
        "grpo_prompts": prompts_needed,
        "grpo_prompt_tokens_median": statistics.median(prompt_lengths),
    }


# ------------------------------------------------------------------ the CPU bench's runners, re-pointed


def configure(case: str, model_dir: Path, timed_steps: int | None = None) -> dict[str, Any]:
    """Set the CPU bench's knobs and hooks for ``case``: sizes, the random model, LoRA or not."""
    spec = case_spec(case)
    if timed_steps is not None:
        spec["timed_steps"] = timed_steps
    stage, lora = spec["stage"], spec["lora"]
    rmt.STEPS[stage] = WARMUP_STEPS + spec["timed_steps"]
    rmt.BATCH[stage] = spec["batch"]
    rmt.MAX_LENGTH = LENGTH
    rmt.MAX_COMPLETION = COMPLETION_LENGTH
    rmt.smollm2_path = lambda: str(model_dir)

    def alignflow_config(stage_name: str, config_file: str, seed: int):
        config = _ORIGINAL["_alignflow_config"](stage_name, config_file, seed)
        config.model.name = str(model_dir)  # the pipeline's start model (no SFT stage before)
        config.model.lora.enabled = lora
        if stage_name == "grpo":
            config.grpo.cache_implementation = GRPO_CACHE
            config.grpo.compile_generation = GRPO_COMPILE
            type(config.grpo).model_validate(config.grpo.model_dump())  # the stage config's own checks
        return config

    def trl_lora():
        return _ORIGINAL["_lora"]() if lora else None

    def saved(trainer: Any, tokenizer: Any, out: Path) -> Path:
        if lora:  # merged into the weights, as alignflow's stage saves its model
            return _ORIGINAL["_merged"](trainer, tokenizer, out)
        trainer.save_model(str(out / "model"))
        tokenizer.save_pretrained(out / "model")
        return out / "model"

    rmt._alignflow_config = alignflow_config
    rmt._lora = trl_lora
    rmt._merged = saved
    return spec


_INSTRUMENTS: dict[str, list[Any]] = {}


def instrument() -> dict[str, list[Any]]:
    """Once per process: the CPU bench's ``Trainer.train`` records, plus a callback in every
    training loop that marks each step's end (after a CUDA sync) with the tokens trained so far."""
    if _INSTRUMENTS:
        return _INSTRUMENTS
    from transformers import Trainer, TrainerCallback

    from alignflow.training.compilation import follow_mode

    records = rmt._trainer_records()
    marks: list[list[tuple[float, int, int]]] = []

    class StepMarks(TrainerCallback):
        def __init__(self, trainer: Any) -> None:
            self.trainer, self.marks = trainer, []

        def _mark(self, state: Any) -> None:
            _sync()
            # DPO counts in _total_train_tokens, GRPO in state.num_input_tokens_seen
            tokens = max(
                getattr(self.trainer, "_total_train_tokens", 0) or 0, state.num_input_tokens_seen or 0
            )
            self.marks.append((time.perf_counter(), state.global_step, int(tokens)))

        def on_train_begin(self, args, state, control, **kwargs):
            self._mark(state)

        def on_step_begin(self, args, state, control, **kwargs):
            # TRL files a step's tokens under train only while the trainer's own model is in train
            # mode, which a compiled copy's never reaches: alignflow's stages keep the two in step
            # themselves, TRL's side gets the same here, for its own count
            follow_mode(self.trainer.model, training=True)

        def on_step_end(self, args, state, control, **kwargs):
            self._mark(state)

    inner = Trainer.train

    def train(self, *args, **kwargs):
        callback = StepMarks(self)
        self.add_callback(callback)
        try:
            return inner(self, *args, **kwargs)
        finally:
            marks.append(callback.marks)
            self.remove_callback(callback)
            callback.trainer = None

    Trainer.train = train
    _INSTRUMENTS.update(records=records, marks=marks)
    return _INSTRUMENTS


def _clean() -> float:
    """Free what the last run left; GiB still allocated (a leak would inflate the next peak)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**30
    return 0.0


def _user_default_torch_state() -> None:
    """What a TRL user's process has, whatever alignflow's last stage set (deterministic
    algorithms off, torch's allocation fill on)."""
    import torch

    torch.use_deterministic_algorithms(False)
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]


def _compiled_graphs() -> int:
    """How many graphs torch.compile has made in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run_one(
    case: str, side: str, root: Path, model_dir: Path, out: Path, seed: int, timed_steps: int | None = None
) -> dict[str, Any]:
    """One run of ``case`` by ``side``: steady-state train-loop rates, memory, the whole call."""
    import torch

    spec = configure(case, model_dir, timed_steps)
    tools = instrument()
    leftover = _clean()
    if side == "trl":
        _user_default_torch_state()
    runner = getattr(rmt, RUNNERS[(spec["stage"], side)])
    graphs = _compiled_graphs()
    started = time.perf_counter()
    runner(root, out, seed)
    _sync()
    call_s = time.perf_counter() - started
    graphs = _compiled_graphs() - graphs
    marks, record = tools["marks"][-1], tools["records"][-1]
    (t_begin, _, _), (t_first, step_first, tokens_first), (t_last, step_last, tokens_last) = (
        marks[0],
        marks[WARMUP_STEPS],
        marks[-1],
    )
    timed_steps = step_last - step_first
    seconds = t_last - t_first
    rows = timed_steps * spec["batch"]
    steps_s = [round(b[0] - a[0], 4) for a, b in zip(marks, marks[1:], strict=False)]
    result = {
        "case": case,
        "side": side,
        "seed": seed,
        "timed_steps": timed_steps,
        "timed_s": seconds,
        "rows_per_s": rows / seconds,
        "tokens_per_s": (tokens_last - tokens_first) / seconds,
        "tokens_per_row": (tokens_last - tokens_first) / rows,
        "step_s_median": statistics.median(steps_s[WARMUP_STEPS:]),
        "warmup_step_s": t_first - t_begin,
        "step_s": steps_s,
        "train_call_s": record["seconds"],
        "call_s": call_s,
        "call_rows_per_s": record["steps"] * spec["batch"] / call_s,
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if torch.cuda.is_available() else None,
        "allocated_before_gib": leftover,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "compiled_graphs": graphs,  # torch.compile graphs new in this run (generate's decoding step)
    }
    if spec["stage"] == "grpo":
        result["mean_reward"] = statistics.fmean(record["rewards"]) if record["rewards"] else None
    else:
        result["final_train_loss"] = record["losses"][-1] if record["losses"] else None
    return result


def order(repeat: int, case_index: int) -> tuple[str, ...]:
    """ABBA: which side goes first alternates over the repeats, offset per case."""
    return SIDES if (repeat + case_index) % 2 == 0 else SIDES[::-1]


def _spread(runs: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def flops_per_token(case: str) -> dict[str, int]:
    """Model FLOPs per token over N, by phase: the update's (6 full, 4 with adapters: no weight
    gradients for the frozen base) and, for GRPO, sampling's (a forward per token)."""
    spec = case_spec(case)
    phases = {"training": 4 if spec["lora"] else 6}
    if spec["stage"] == "grpo":
        phases["sampling"] = rmt.FLOPS_PER_TOKEN["grpo"]["sampling"]
    return phases


def summarise(runs: list[dict[str, Any]], parameters: int, peak_tflops: float | None) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for case in CASES:
        phases = flops_per_token(case)
        for side in SIDES:
            mine = [r for r in runs if r["case"] == case and r["side"] == side]
            if not mine:
                continue
            for r in mine:
                share = parameters * r["tokens_per_s"] / (peak_tflops * 1e12) if peak_tflops else None
                r["mfu"] = phases["training"] * share if share is not None else None
                r["mfu_all"] = sum(phases.values()) * share if share is not None else None
            keys = ("rows_per_s", "tokens_per_s", "mfu", "mfu_all", "peak_gpu_gib", "call_rows_per_s",
                    "step_s_median", "warmup_step_s")  # fmt: skip
            cases[f"{case}:{side}"] = {"runs": len(mine), **{k: _spread(mine, k) for k in keys}}
    ratios = {}
    for case in CASES:
        ours, theirs = cases.get(f"{case}:alignflow"), cases.get(f"{case}:trl")
        if not ours or not theirs:
            continue
        for key in ("rows_per_s", "tokens_per_s", "peak_gpu_gib", "call_rows_per_s"):
            a, b = ours[key]["median"], theirs[key]["median"]
            ratios[f"{case} {key}"] = a / b if a is not None and b else None
    return {"cases": cases, "ratios": ratios}


def run(repeats: int = REPEATS) -> dict[str, Any]:
    import torch

    allow_cpu = TINY or os.environ.get("ALIGNFLOW_GPU_BENCH_ALLOW_CPU") == "1"
    if not torch.cuda.is_available() and not allow_cpu:
        return {
            "name": "gpu_trl",
            "skipped": "no CUDA device (ALIGNFLOW_GPU_BENCH_ALLOW_CPU=1 runs it on the CPU)",
        }
    started = time.perf_counter()
    env = environment()
    print("environment:", json.dumps(env), flush=True)
    print(f"alignflow GRPO: cache_implementation={GRPO_CACHE} compile_generation={GRPO_COMPILE}", flush=True)
    peak = gemm_peak_tflops() if torch.cuda.is_available() else None
    print("bf16 GEMM TFLOP/s:", peak, flush=True)
    runs: list[dict[str, Any]] = []
    warmups: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="alignflow-gpu-trl-") as tmp:
        root = Path(tmp)
        model_dir, parameters = random_model(root)
        inputs = prepare(root, model_dir)
        print("model:", model_dir.name, parameters, "inputs:", json.dumps(inputs), flush=True)
        if WARMUP_RUNS:  # the fresh machine's cold start, once per stage, untimed
            for case in dict.fromkeys(c for c in CASES if c != "dpo-lora"):
                warm = run_one(case, "trl", root, model_dir, root / f"warmup-{case}", seed=0, timed_steps=1)
                warmups.append({k: warm[k] for k in ("case", "side", "step_s", "call_s")})
                print("warm-up", json.dumps(warmups[-1]), flush=True)
        for repeat in range(repeats):
            for index, case in enumerate(CASES):
                for side in order(repeat, index):
                    out = root / f"{case}-{side}-{repeat}"
                    result = run_one(case, side, root, model_dir, out, seed=repeat)
                    result["repeat"] = repeat
                    runs.append(result)
                    shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()}
                    print("run", json.dumps(shown), flush=True)
    summary = summarise(runs, parameters, peak["best"] if peak else None)
    result = {
        "name": "gpu_trl",
        "model": "SmolLM2-135M-Instruct architecture, RANDOM weights (bf16), real tokenizer"
        + (" [TINY: 2-layer body]" if TINY else ""),
        "parameters": parameters,
        "environment": env,
        "bf16_gemm_tflops": peak,
        "sizes": {
            "dpo_pairs_per_step": PAIRS,
            "dpo_tokens_per_sequence": LENGTH,
            "dpo_timed_steps": DPO_STEPS,
            "grpo_completions_per_step": COMPLETIONS,
            "grpo_generations_per_prompt": NUM_GENERATIONS,
            "grpo_completion_tokens": COMPLETION_LENGTH,
            "grpo_timed_steps": GRPO_STEPS,
            "warmup_steps_per_run": WARMUP_STEPS,
            "warmup_runs": [w["case"] for w in warmups],
            "lora": rmt.LORA,
            "alignflow_grpo_cache_implementation": GRPO_CACHE,
            "alignflow_grpo_compile_generation": GRPO_COMPILE,
        },
        "inputs": inputs,
        "repeats": repeats,
        "order": [f"{r['case']}:{r['side']}" for r in runs],
        "warmups": warmups,
        **summary,
        "runs": runs,
        "wall_s": time.perf_counter() - started,
    }
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_trl.json").write_text(json.dumps(result, indent=2, default=str))
    print(markdown(result), flush=True)
    return result


# ------------------------------------------------------------------ the report


def _fmt(s: dict[str, Any], scale: float = 1.0, digits: int = 1, pct: bool = False) -> str:
    if s is None or s.get("median") is None:
        return "n/a"
    if pct:
        return f"{s['median']:.1%} ({s['min']:.1%}–{s['max']:.1%})"
    m, lo, hi = (s[k] * scale for k in ("median", "min", "max"))
    return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def markdown(r: dict[str, Any]) -> str:
    env, sizes = r["environment"], r["sizes"]
    peak = r.get("bf16_gemm_tflops") or {}
    lines = [
        "# DPO and GRPO on a GPU: alignflow vs TRL",
        "",
        f"Code: {env.get('code_commit', 'not recorded')}.",
        f"GPU: {env.get('gpu', 'none (CPU)')} ({env.get('gpu_memory_gib', '?')} GiB, driver "
        f"{env.get('driver', '?')}); torch {env['torch']} (CUDA {env['cuda']}), transformers "
        f"{env['transformers']}, trl {env['trl']}, peft {env['peft']}, accelerate {env['accelerate']}, "
        f"datasets {env['datasets']}; Python {env['python']}.",
        f"Model: {r['model']}, {r['parameters'] / 1e6:.1f}M parameters: throughput, MFU and memory are "
        "the real model's shapes; losses and rewards mean nothing.",
        f"bf16 GEMM peak measured in this run ({GEMM_SIZE}³ matmuls): best "
        f"{peak.get('best', float('nan')):.0f} TFLOP/s, median {peak.get('median', float('nan')):.0f}.",
        f"Sizes: DPO {sizes['dpo_pairs_per_step']} pairs/step × {sizes['dpo_tokens_per_sequence']} tokens "
        f"per sequence (prompt + completion), {sizes['dpo_timed_steps']} timed steps; GRPO "
        f"{sizes['grpo_completions_per_step']} completions/step ({sizes['grpo_generations_per_prompt']} per "
        f"prompt) × {sizes['grpo_completion_tokens']} tokens, {sizes['grpo_timed_steps']} timed steps. "
        f"LoRA: r {sizes['lora']['r']}, alpha {sizes['lora']['lora_alpha']}, every linear layer.",
        f"GRPO generation: alignflow's side cache_implementation "
        f"{sizes.get('alignflow_grpo_cache_implementation') or 'TRL default (dynamic)'}, compile_generation "
        f"{bool(sizes.get('alignflow_grpo_compile_generation'))}; TRL's side its defaults (dynamic cache, "
        "TRL's disable_compile=True).",
        f"Repeats: {r['repeats']} per side and case, in one process, order ABBA (the side that goes first "
        "alternates over repeats, offset per case): " + ", ".join(r["order"]) + ".",
        f"Warm-up: every run's first optimizer step is excluded from its rate; before the timed runs, one "
        f"untimed TRL run of each stage ({', '.join(sizes['warmup_runs']) or 'none'}) paid the cold start.",
        "",
        "Medians (min–max) over the repeats; train-loop rates in steady state (step 1's end to the last "
        "step's end).",
        "",
        "| case | side | rows/s (train loop) | tokens/s | MFU (training) | MFU (all model FLOPs) | "
        "peak GPU GiB | rows/s (whole call) | warm-up step s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in r["cases"].items():
        case, side = name.split(":")
        unit = "pairs" if case.startswith("dpo") else "compl."
        lines.append(
            f"| {case} | {side} | {_fmt(c['rows_per_s'])} {unit}/s | {_fmt(c['tokens_per_s'], 1e-3)}k | "
            f"{_fmt(c['mfu'], pct=True)} | {_fmt(c.get('mfu_all'), pct=True)} | {_fmt(c['peak_gpu_gib'])} | "
            f"{_fmt(c['call_rows_per_s'])} | "
            f"{_fmt(c['warmup_step_s'], digits=2)} |"
        )
    lines += ["", "Ratios alignflow/TRL of the medians (above 1: alignflow faster, or more memory):", ""]
    for key, value in r["ratios"].items():
        lines.append(f"- {key}: {value:.2f}×" if value is not None else f"- {key}: n/a")
    lines += [
        "",
        "Rows: pairs (DPO) or completions (GRPO). Tokens: the trainer's own count (DPO: chosen + rejected "
        "tokens; GRPO: prompt + completion tokens). MFU: 6 N FLOPs per token for a full fine-tune, 4 N "
        "with LoRA (no weight gradients for the frozen base), N the parameters, attention's own FLOPs not "
        "counted, against the best GEMM time above; GRPO's training MFU counts the update only, over the "
        "whole step (generation included in the time), its all-FLOPs MFU adds 2 N per prompt and completion "
        "token for sampling them. Whole call: the stage function / the user's script from "
        "loading the model to the saved model (alignflow: its held-out evaluation before and after, on "
        "1 row here, and its cold reference-log-prob cache; TRL: its reference pass). alignflow's GRPO "
        "stage generates through TRL's GRPOTrainer: the same plain `generate` as TRL's side.",
        f"Wall: {r['wall_s']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--markdown"]:
        data = json.loads(Path(sys.argv[2]).read_text())
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "gpu_trl.md").write_text(markdown(data), encoding="utf-8")
        print(RESULTS / "gpu_trl.md")
    else:
        result = run()
        if result.get("skipped"):
            print(result["skipped"])
