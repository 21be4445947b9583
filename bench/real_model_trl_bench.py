"""DPO and GRPO on SmolLM2-135M-Instruct: alignflow's stages against TRL's trainers, tuned.

Both sides train the same real model the same way: weights in the dtype alignflow's
``model.dtype: fastest`` picks on this machine (bf16 where the CPU has bf16 matrix units,
fp32 where torch would emulate bf16 several times slower than fp32), LoRA adapters (r 16,
every linear layer), the same rows, steps, batch, learning rate, seed and lengths. TRL is
given its own best documented speed settings for a CPU: the reference's log-probs
precomputed once (``precompute_ref_log_probs``), no activation checkpointing (memory
allows), weights in that same dtype. Padding-free batches need FlashAttention, which a CPU lacks, and
TRL's DPO rows have no length column for transformers' length-grouped sampler, so TRL
draws random batches; here alignflow's DPO stage draws them too (``group_by_length`` off,
though it groups by default), so that with one seed both sides train on the same batches
from the same LoRA initialisation and their held-out losses can be compared repeat by
repeat. alignflow caches the reference pass, as it always does. Both sides compile each
decoder layer (transformers' ``torch_compile`` through accelerate's regional compilation,
dynamic shapes: alignflow's ``torch_compile: true``; TRL by the same flag and accelerate's
switches): measured on an AMX Xeon it took TRL's DPO from 0.51 to 0.61 pairs/s and left its GRPO
as it was (1.47 and 1.45). Each run compiles cold (its own inductor cache), in step 1: the
loop rates leave it out, the whole call includes it.

- DPO: the shared HH-RLHF harmless-base pairs (what ``configs/smollm2-hh.yaml`` trains on),
  one epoch over exactly the rows trained (so a precomputed reference pass covers no row
  twice or in vain). Reported: trained pairs/s and tokens/s over the training loop, pairs/s
  over the whole call (load, reference pass, training, saving), the held-out DPO loss of
  the trained model against SmolLM2 by TRL's own evaluation (same call both sides), MFU.
- GRPO: the word problems of ``configs/smollm2-math.yaml`` with the correctness and format
  verifiers. Reported: completions/s and tokens/s (prompt and completion tokens TRL counts
  in ``num_tokens``), the run's mean reward and the trained model's greedy reward on 40
  held-out problems, MFU over the loop's tokens and time (generation's FLOPs and time included).

MFU reads model FLOPs against this machine's GEMM peak in that dtype, measured in the same run
before the cases and after them, the higher of the two (``bench.real_model_bench.gemm_peak_gflops``:
the fastest product over 3 s, since AMX took 0.6 s to reach full speed), N the model's
parameters: 4 N per trained token for a frozen base with adapters (forward and input gradients,
no weight gradients), and for GRPO 2 N more per token for sampling it (:data:`FLOPS_PER_TOKEN`);
the training-only figure is reported beside it.

Each case runs in its own process (its peak RSS is its own), ``REPEATS`` times (default 3),
the sides' order alternating per repeat (ABBA); the train-loop rates leave out step 1
(warm-up) on both sides; ratios are alignflow/TRL of the medians.
Run: ``python -m bench real_model_trl`` (writes bench/results/real_model_trl.{json,md}).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# (importing training_bench also sets the offline and tokenizer environment defaults)
from bench.training_bench import HH_PAIRS, REPO, RESULTS, _median, cpu_name

STEPS = {
    "dpo": int(os.environ.get("ALIGNFLOW_BENCH_DPO_STEPS", 12)),
    "grpo": int(os.environ.get("ALIGNFLOW_BENCH_GRPO_STEPS", 4)),
}
BATCH = {"dpo": 8, "grpo": 16}  # GRPO: completions per step (4 prompts x 4 generations)
NUM_GENERATIONS = 4
MAX_LENGTH = 256
MAX_COMPLETION = 40
LEARNING_RATE = {"dpo": 5e-4, "grpo": 2e-4}
BETA = 0.1
HELD_OUT_PAIRS = 48
# three: one run slowed by the machine cannot move a median of three (two runs' median is their mean)
REPEATS = int(os.environ.get("ALIGNFLOW_BENCH_REPEATS", 3))
CASES = ("dpo:alignflow", "dpo:trl", "grpo:alignflow", "grpo:trl")
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}


# ------------------------------------------------------------------ shared inputs


def prepare(root: Path) -> None:
    """The HH pairs validated and split as the data stage does (train cut to the rows one
    epoch trains), and the word problems' prompts with their answers."""
    from alignflow.config import load_config
    from alignflow.data import word_problems
    from alignflow.data.pipeline import write_snapshot
    from alignflow.data.snapshot import load_split, write_split
    from alignflow.data.validation import validate_paths

    config = load_config(REPO / "configs" / "smollm2-hh.yaml", [f"data.source={HH_PAIRS}"])
    full = root / "hh-full"
    write_snapshot(validate_paths([HH_PAIRS], config.data), config.data, full, REPO)
    pairs = load_split(full, "train", kind="pair")[: STEPS["dpo"] * BATCH["dpo"]]
    write_split(root / "hh", "train", pairs)
    write_split(root / "hh", "eval", load_split(full, "eval", kind="pair")[:HELD_OUT_PAIRS])

    problems = word_problems.all_problems(200, seed=0)
    prompts = [dict(r, kind="prompt") for r in word_problems.iter_prompts(problems)]
    write_split(root / "math", "train", prompts[:160])
    write_split(root / "math", "eval", prompts[160:])


@functools.cache
def weights_dtype() -> Any:
    """The dtype alignflow's SmolLM2 configs train in here (``model.dtype: fastest``); the
    config is read once per process, not at every model load."""
    from alignflow.config import load_config
    from alignflow.models.factory import select_dtype

    return select_dtype(load_config(REPO / "configs" / "smollm2-hh.yaml").model)


def smollm2_path() -> str:
    from alignflow.models.factory import resolve_model_source
    from alignflow.models.model_config import SMOLLM2

    return str(resolve_model_source(SMOLLM2))


def _alignflow_config(stage: str, config_file: str, seed: int):
    from alignflow.config import load_config

    overrides = [
        f"{stage}.max_steps={STEPS[stage]}",
        f"{stage}.per_device_train_batch_size={BATCH[stage]}",
        f"{stage}.learning_rate={LEARNING_RATE[stage]}",
        f"{stage}.save_steps=1000",
        f"{stage}.eval_max_rows=1",
        f"seed={seed}",
        "policy.reward_data=shared",
        f"{stage}.torch_compile=true",
    ]
    if stage == "dpo":
        overrides += [f"dpo.max_length={MAX_LENGTH}", "dpo.precompute_reference=true", f"dpo.beta={BETA}"]
        # TRL's DPO rows cannot be length-grouped, so both sides draw the same random batches:
        # with the same seed the two runs of a repeat see the same pairs in the same order, and
        # their held-out losses differ by the implementations alone, not by the draw
        overrides += ["dpo.group_by_length=false"]
    else:
        overrides += [
            f"grpo.max_completion_length={MAX_COMPLETION}",
            f"grpo.num_generations={NUM_GENERATIONS}",
        ]
    return load_config(REPO / "configs" / config_file, overrides)


def _trl_common(out: Path, stage: str, seed: int) -> dict[str, Any]:
    import torch

    dtype = weights_dtype()
    # transformers' torch_compile, compiled layer by layer with dynamic shapes as alignflow's
    # stages do: accelerate's documented switches, read when the Trainer builds its plugin
    os.environ["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "true"
    os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"] = "true"
    return {
        "torch_compile": True,
        "output_dir": str(out),
        "max_steps": STEPS[stage],
        "per_device_train_batch_size": BATCH[stage],
        "learning_rate": LEARNING_RATE[stage],
        "seed": seed,
        "report_to": [],
        "save_strategy": "no",
        "use_cpu": not torch.cuda.is_available(),
        "bf16": dtype == torch.bfloat16,
        "gradient_checkpointing": False,
        "model_init_kwargs": {"dtype": dtype},
    }


def _lora():
    from peft import LoraConfig

    return LoraConfig(**LORA)


# ------------------------------------------------------------------ the cases


def run_alignflow_dpo(root: Path, out: Path, seed: int) -> Path:
    from alignflow.training.dpo import run_dpo

    config = _alignflow_config("dpo", "smollm2-hh.yaml", seed)
    config.dpo.reference_cache_dir = str(out / "reference-cache")
    return Path(run_dpo(config, root / "hh", out).model_dir)


def run_trl_dpo(root: Path, out: Path, seed: int) -> Path:
    from transformers import AutoTokenizer, set_seed
    from trl import DPOConfig, DPOTrainer

    from alignflow.data.pairing import load_pairs
    from alignflow.training.dpo import pair_dataset

    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    set_seed(seed)  # as alignflow's stage seeds before its trainer: the same LoRA initialisation
    args = DPOConfig(
        beta=BETA, max_length=MAX_LENGTH, precompute_ref_log_probs=True, **_trl_common(out, "dpo", seed)
    )
    trainer = DPOTrainer(
        model=path,
        args=args,
        train_dataset=pair_dataset(load_pairs(root / "hh", "train"), tokenizer),
        processing_class=tokenizer,
        peft_config=_lora(),
    )
    trainer.train()
    return _merged(trainer, tokenizer, out)


def _correctness_and_format():
    from alignflow.training.grpo import answer_format, correctness

    return [correctness, answer_format]


def run_alignflow_grpo(root: Path, out: Path, seed: int) -> Path:
    from alignflow.training.grpo import run_grpo

    return Path(run_grpo(_alignflow_config("grpo", "smollm2-math.yaml", seed), root / "math", out).model_dir)


def run_trl_grpo(root: Path, out: Path, seed: int) -> Path:
    from datasets import Dataset
    from transformers import AutoTokenizer, set_seed
    from trl import GRPOConfig, GRPOTrainer

    from alignflow.data.snapshot import load_split
    from alignflow.models.prompting import format_prompt

    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    set_seed(seed)
    rows = [
        {"prompt": format_prompt(tokenizer, r["prompt"]), "answer": r["metadata"]["answer"]}
        for r in load_split(root / "math", "train")
    ]
    args = GRPOConfig(
        num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION,
        beta=0.0,
        reward_weights=[1.0, 0.2],
        **_trl_common(out, "grpo", seed),
    )
    trainer = GRPOTrainer(
        model=path,
        reward_funcs=_correctness_and_format(),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=_lora(),
    )
    trainer.train()
    return _merged(trainer, tokenizer, out)


def _merged(trainer: Any, tokenizer: Any, out: Path) -> Path:
    """The adapters merged into the weights and saved, as alignflow's stage saves its model."""
    model = trainer.model.merge_and_unload()
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    return out / "model"


RUNNERS = {
    "dpo:alignflow": run_alignflow_dpo,
    "dpo:trl": run_trl_dpo,
    "grpo:alignflow": run_alignflow_grpo,
    "grpo:trl": run_trl_grpo,
}


def held_out_dpo_loss(trained: Path, root: Path, out: Path) -> float:
    """The trained policy's DPO loss on the held-out pairs against SmolLM2, by TRL's evaluation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from alignflow.data.pairing import load_pairs
    from alignflow.training.dpo import pair_dataset

    start = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(start)
    pairs = pair_dataset(load_pairs(root / "hh", "eval"), tokenizer)
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(trained, dtype=weights_dtype()),
        ref_model=AutoModelForCausalLM.from_pretrained(start, dtype=weights_dtype()),
        args=DPOConfig(
            output_dir=str(out / "held-out"),
            beta=BETA,
            max_length=MAX_LENGTH,
            report_to=[],
            use_cpu=True,
            per_device_eval_batch_size=BATCH["dpo"],
            bf16=weights_dtype() == torch.bfloat16,
        ),
        train_dataset=pairs,
        eval_dataset=pairs,
        processing_class=tokenizer,
    )
    return float(trainer.evaluate()["eval_loss"])


def held_out_reward(trained: Path, root: Path) -> float:
    """The trained policy's mean reward (correctness + 0.2 x format, the training weights) on the
    40 held-out word problems, greedy: the same call for both sides."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from alignflow.data.answers import correctness_reward, format_reward
    from alignflow.data.snapshot import load_split
    from alignflow.models.prompting import format_prompt

    tokenizer = AutoTokenizer.from_pretrained(trained, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(trained, dtype=weights_dtype()).eval()
    rows = load_split(root / "math", "eval")
    prompts = [format_prompt(tokenizer, r["prompt"]) for r in rows]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=MAX_COMPLETION, do_sample=False)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    scores = [
        correctness_reward(text, row["metadata"]["answer"]) + 0.2 * format_reward(text)
        for text, row in zip(texts, rows, strict=True)
    ]
    return statistics.fmean(scores)


def _trainer_records() -> list[dict[str, Any]]:
    """Every ``Trainer.train`` call of this process: its seconds, when each step ended, and the
    trainer's own state."""
    from transformers import Trainer, TrainerCallback

    records: list[dict[str, Any]] = []
    original = Trainer.train

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    def timed(self, *args, **kwargs):
        clock = StepClock()
        self.add_callback(clock)
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            history = self.state.log_history
            records.append(
                {
                    "seconds": time.perf_counter() - started,
                    "step_ends": [t - started for t in clock.ends],
                    "steps": self.state.global_step,
                    "batch": self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps,
                    "num_tokens": max((h.get("num_tokens", 0) for h in history), default=0),
                    "rewards": [h["reward"] for h in history if "reward" in h],
                    "dtype": str(self.model.get_input_embeddings().weight.dtype).removeprefix("torch."),
                    "losses": [h["loss"] for h in history if "loss" in h],
                    # alignflow's packed rows compute a shared prefix once (TRL's trainers: all)
                    "tokens_computed_share": getattr(getattr(self, "packing", None), "computed_share", 1.0),
                }
            )

    Trainer.train = timed
    return records


def _warm_rates(run: dict[str, Any]) -> tuple[float, float, float]:
    """(rows/s, tokens/s, seconds) over the steps after the first: the first step's one-off
    costs (allocations, lazy set-up) are warm-up, excluded on both sides. Tokens per step are
    the loop's mean (TRL counts them per run, not per step)."""
    ends, steps = run["step_ends"], run["steps"]
    seconds = ends[-1] - ends[0]
    warm_steps = len(ends) - 1
    tokens = run["num_tokens"] / steps * warm_steps
    return warm_steps * run["batch"] / seconds, tokens / seconds, seconds


def run_case(case: str, root: Path, out: Path, seed: int = 0) -> dict[str, Any]:
    """One case in this process; rates come from the trainer's state, not from the settings."""
    records = _trainer_records()
    started = time.perf_counter()
    trained = RUNNERS[case](root, out, seed)
    total = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    run = records[-1]  # the training loop (TRL's reference pass is no Trainer.train call)
    rows = run["steps"] * run["batch"]
    rows_per_s, tokens_per_s, warm_s = _warm_rates(run)
    result = {
        "steps": run["steps"],
        "train_s": run["seconds"],
        "warm_up_s": run["step_ends"][0],
        "warm_s": warm_s,
        "call_s": total,
        "rows_per_s": rows_per_s,
        "call_rows_per_s": rows / total,
        "tokens_per_s": tokens_per_s,
        "num_tokens": run["num_tokens"],
        "peak_rss_mb": rss,
        "seed": seed,
        "dtype": run["dtype"],  # what the loop trained in (`model.dtype: fastest` decides per process)
        "tokens_computed_share": run["tokens_computed_share"],
    }
    stage = case.split(":")[0]
    if stage == "dpo":
        result["held_out_loss"] = held_out_dpo_loss(trained, root, out)
        result["final_train_loss"] = run["losses"][-1] if run["losses"] else None
    else:
        result["mean_reward"] = statistics.fmean(run["rewards"]) if run["rewards"] else None
        result["held_out_reward"] = held_out_reward(trained, root)
    return result


# ------------------------------------------------------------------ the parent


def _child(case: str, root: Path, out: Path, seed: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.real_model_trl_bench", "--case", case]
    command += ["--root", str(root), "--out", str(out), "--seed", str(seed)]
    # a cold compile in every run: inductor's on-disk cache lives in this case's own folder
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(out / "inductor-cache"))
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{case} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# model FLOPs per token in units of N, by what a stage's loop does with the token: a frozen base
# with adapters trains at 4 N (forward and input gradients, no weight gradients); GRPO first
# samples every row, 2 N per prompt and completion token of each row (one forward pass of the
# token: the nominal work, whatever a cache or a shared prompt saves), as DeepSpeed-Chat counts
# its generation when it reports an RLHF step's throughput
FLOPS_PER_TOKEN = {"dpo": {"training": 4}, "grpo": {"sampling": 2, "training": 4}}


def mfu(
    case: str, tokens_per_s: float, n_params: int, peak_gflops: float, computed_share: float = 1.0
) -> dict[str, float]:
    """MFU of ``case`` (``stage:side``) over the loop's wall time: ``all`` counts every phase's
    model FLOPs, ``training`` only the training pass's (the figure this bench reported before
    GRPO's sampling was counted), ``computed`` the training pass's over the tokens the body
    computed (``computed_share`` of them: a prefix shared by several rows counts once)."""
    factors = FLOPS_PER_TOKEN[case.split(":")[0]]
    per_factor = n_params * tokens_per_s / (peak_gflops * 1e9)
    training = factors["training"] * per_factor
    return {
        "all": sum(factors.values()) * per_factor,
        "training": training,
        "computed": training * computed_share,
    }


def _load_note(r: dict[str, Any]) -> str:
    load = r["load_average_1min_at_end"]
    if load <= r["threads"]:
        return f"Load average at the end: {load:.1f} (the cores were this run's)."
    return (
        f"Load average at the end: {load:.1f}, above {r['threads']}: other jobs shared the cores; the "
        "sides ran interleaved, so the ratios suffer less than the rates."
    )


def _peak_note(r: dict[str, Any]) -> str:
    return "the higher of {before:.0f} before the cases and {after:.0f} after them".format(
        **r["peak_gflops_measured"]
    )


def trained_dtypes(r: dict[str, Any]) -> dict[str, list[str]]:
    """Per case, the weights' dtype each of its runs trained in (from the trainer's model)."""
    return {name: [run["dtype"] for run in case["runs"]] for name, case in r["cases"].items()}


def _dtype_note(r: dict[str, Any]) -> str:
    """The dtype every run trained in, or which runs differed from the one the peak is for."""
    differing = {
        name: dtypes for name, dtypes in trained_dtypes(r).items() if any(d != r["dtype"] for d in dtypes)
    }
    if not differing:
        return f"{r['dtype']} weights + LoRA r16 on every linear layer, both sides, every run"
    runs = "; ".join(f"{name}: {', '.join(dtypes)}" for name, dtypes in differing.items())
    return (
        f"LoRA r16 on every linear layer; weights by run, where not {r['dtype']}: {runs} "
        f"(those runs' MFU is priced against the {r['dtype']} peak all the same)"
    )


def _markdown(r: dict[str, Any]) -> str:
    c = r["cases"]
    lines = [
        "# DPO and GRPO on SmolLM2-135M-Instruct: alignflow vs TRL (tuned)",
        "",
        f"Code: {r.get('code_commit', 'not recorded')}. "
        f"Machine: {r['machine']}, {r['cpu']}; {r['threads']} threads; "
        f"{r['dtype']} GEMM peak {r['peak_gflops']:.0f} GFLOP/s "
        f"({_peak_note(r)}). {r['parameters'] / 1e6:.1f}M parameters; {_dtype_note(r)}. "
        f"Repeats: {r['repeats']}, ABBA (medians). {_load_note(r)}",
        "",
        "| case | steps | rows/s (train loop, after step 1; min-max) | tokens/s | rows/s (whole call) "
        "| MFU (all model FLOPs) | MFU (training FLOPs only) | MFU (training, tokens computed) | peak RSS MB "
        "| quality |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, case in c.items():
        quality = (
            f"held-out DPO loss {case['held_out_loss']:.4f}"
            if "held_out_loss" in case
            else f"held-out reward {case['held_out_reward']:.3f} (train {case['mean_reward']:.3f})"
        )
        spread = [run["rows_per_s"] for run in case["runs"]]
        rate = f"{case['rows_per_s']:.2f} ({min(spread):.2f}-{max(spread):.2f})"
        lines.append(
            f"| {name} | {case['steps']:.0f} | {rate} "
            f"| {case['tokens_per_s']:.0f} | "
            f"{case['call_rows_per_s']:.2f} | {case['mfu']:.1%} | {case['mfu_training']:.1%} "
            f"| {case.get('mfu_computed', case['mfu_training']):.1%} "
            f"| {case['peak_rss_mb']:.0f} | {quality} |"
        )
    lines += ["", "Held-out DPO loss by repeat (same seed, same batches both sides):", ""]
    for repeat, (ours, theirs) in enumerate(paired_losses(r)):
        lines.append(f"- repeat {repeat}: alignflow {ours:.4f}, TRL {theirs:.4f} ({ours - theirs:+.4f})")
    lines += ["", "Ratios alignflow/TRL (above 1: alignflow faster or larger):", ""]
    for key, value in r["ratios"].items():
        lines.append(f"- {key}: {value:.2f}x")
    lines += [
        "",
        "Rows are pairs for DPO and completions for GRPO. Tokens are TRL's own `num_tokens` count",
        "(prompt and completion tokens the training loop processed). The train-loop rates leave out",
        "step 1 on both sides (warm-up: compiling the decoder layers, which both sides do with",
        "`torch_compile` layer by layer from a cold inductor cache, one-off allocations and set-up; "
        f"median {r['warm_up_s']:.1f} s); repeats alternate which side runs first (ABBA). MFU is",
        "model FLOPs over the loop's wall time against the GEMM peak: 4 N per token trained (frozen",
        "base, adapters: forward and input gradients); GRPO's loop also samples each row's prompt and",
        "completion tokens, 2 N a token (nominal, as DeepSpeed-Chat counts generation), which the",
        "all-FLOPs column adds and the training-only column leaves out. alignflow computes a prefix",
        "that several rows share (a DPO pair's prompt, a GRPO group's) once: the last MFU column",
        "counts the training pass over the tokens its body computed (share median "
        f"{c['dpo:alignflow'].get('tokens_computed_share', 1.0):.2f} DPO, "
        f"{c['grpo:alignflow'].get('tokens_computed_share', 1.0):.2f} GRPO; TRL's 1.00, padding aside).",
        "TRL's reference pass is",
        "part of its whole call; alignflow's cached reference pass is too (cold cache in every run).",
        "Held-out: DPO loss on 48 HH pairs by TRL's evaluation against SmolLM2; GRPO reward",
        "(correctness + 0.2 x format) of greedy answers to 40 word problems not trained on.",
        f"Wall: {r['wall_s']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def paired_losses(r: dict[str, Any]) -> list[tuple[float, float]]:
    """(alignflow, TRL) held-out DPO loss of each repeat: the two runs of a repeat share the
    seed, the batches and the LoRA initialisation."""
    ours, theirs = (r["cases"][f"dpo:{side}"]["runs"] for side in ("alignflow", "trl"))
    return [(a["held_out_loss"], b["held_out_loss"]) for a, b in zip(ours, theirs, strict=True)]


def abba_order(repeat: int) -> list[str]:
    """Per stage, alignflow then TRL on even repeats and TRL then alignflow on odd ones, so
    neither side always runs first on a cold page cache."""
    order = []
    for stage in ("dpo", "grpo"):
        pair = [f"{stage}:alignflow", f"{stage}:trl"]
        order += pair if repeat % 2 == 0 else pair[::-1]
    return order


def run(repeats: int = REPEATS) -> dict[str, Any]:
    import torch

    from bench.provenance import code_commit
    from bench.real_model_bench import gemm_peak_gflops

    started = time.perf_counter()
    commit = code_commit()  # the code that runs, before the run rewrites bench/results
    dtype = weights_dtype()
    peaks = {"before": gemm_peak_gflops(dtype)}
    with tempfile.TemporaryDirectory(prefix="alignflow-trl-bench-") as tmp:
        root = Path(tmp)
        prepare(root)
        runs: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
        for repeat in range(repeats):
            for case in abba_order(repeat):
                runs[case].append(_child(case, root, root / f"{case.replace(':', '-')}-{repeat}", repeat))
    peaks["after"] = gemm_peak_gflops(dtype)
    peak = max(peaks.values())
    n_params = _parameters(smollm2_path())
    cases = {case: _median(r) for case, r in runs.items()}
    for name, case in cases.items():
        shares = mfu(name, case["tokens_per_s"], n_params, peak, case.get("tokens_computed_share", 1.0))
        case["mfu"], case["mfu_training"], case["mfu_computed"] = (
            shares["all"],
            shares["training"],
            shares["computed"],
        )
    ratios = {}
    for stage in ("dpo", "grpo"):
        ours, theirs = cases[f"{stage}:alignflow"], cases[f"{stage}:trl"]
        ratios[f"{stage} rows/s (train loop)"] = ours["rows_per_s"] / theirs["rows_per_s"]
        ratios[f"{stage} tokens/s"] = ours["tokens_per_s"] / theirs["tokens_per_s"]
        ratios[f"{stage} rows/s (whole call)"] = ours["call_rows_per_s"] / theirs["call_rows_per_s"]
        ratios[f"{stage} peak RSS"] = ours["peak_rss_mb"] / theirs["peak_rss_mb"]
    result = {
        "name": "real_model_trl",
        "code_commit": commit,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "threads": torch.get_num_threads(),
        "parameters": n_params,
        "dtype": str(dtype).removeprefix("torch."),
        "peak_gflops": peak,
        "peak_gflops_measured": peaks,
        "repeats": repeats,
        "cases": cases,
        "ratios": ratios,
        "dpo_train_speedup": ratios["dpo rows/s (train loop)"],
        "grpo_train_speedup": ratios["grpo rows/s (train loop)"],
        "warm_up_s": statistics.median(c["warm_up_s"] for c in cases.values()),
        "cpu": cpu_name(),
        "load_average_1min_at_end": os.getloadavg()[0],
        "wall_s": time.perf_counter() - started,
    }
    result["dpo_held_out_loss_max_difference"] = max(abs(a - b) for a, b in paired_losses(result))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "real_model_trl.md").write_text(_markdown(result), encoding="utf-8")
    return result


def _parameters(path: Any) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=CASES)
    parser.add_argument("--root", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    cli = parser.parse_args()
    if cli.case:
        print(json.dumps(run_case(cli.case, cli.root, cli.out, cli.seed)))
    else:
        print(json.dumps(run(), indent=2))
