"""DPO and reward-model training: alignflow's stages vs TRL's trainers used directly.

Real preference data (the shared HH-RLHF harmless-base pairs, a mix of one-line answers
and long multi-turn chats) and a small causal LM built offline on that text. Both sides
get the same pairs (rendered the same way), the same number of steps, batch size,
learning rate, seed and ``max_length`` (TRL's default, 1024); everything else is each
tool's own default. For TRL that is its trainer config as shipped (gradient checkpointing
on, the reference model run at every DPO step, random batches), with bf16 switched off only
where the device has no bf16. alignflow's stage does what it always does: length-grouped
batches, DPO reference log-probs computed once before training in length-sorted batches and
cached per (reference weights, tokenized pairs), atomic checkpoints, and its measurements
(DPO: held-out evaluation before and after; reward: accuracy, calibration, reward
statistics).

Each case runs in its own process (peak RSS is that case's own) and ``REPEATS`` times,
repeat ``r`` with seed ``r`` on both sides (the loss of one seed says little about how the
two trainers compare: which batches a seed draws moves it); the medians are reported.
Per case: pairs/s over the training loop (``Trainer.train``, timed the same way on both
sides), pairs/s over the whole call (model load, data preparation, the reference pass,
training, evaluation, saving), peak memory and the final training loss. Every alignflow
DPO run starts with an empty reference cache (cold); the ``dpo:alignflow-rerun`` case then
reruns with another ``beta`` on a warm cache, what a hyperparameter sweep sees. Ratios are alignflow/TRL.

Run: ``python -m bench training`` (writes bench/results/training.{json,md}).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
HH_PAIRS = REPO.parent / "shared" / "data" / "hh-rlhf-harmless-base-test.jsonl.gz"
# steps per stage: enough that the faster side trains >= 30 s on two CPU cores
# (ALIGNFLOW_BENCH_STEPS=N sets both, e.g. for a quick check that the bench runs)
STEPS = {"dpo": 125, "reward": 170}
if os.environ.get("ALIGNFLOW_BENCH_STEPS"):
    STEPS = dict.fromkeys(STEPS, int(os.environ["ALIGNFLOW_BENCH_STEPS"]))
BATCH = 16
MAX_LENGTH = 1024  # TRL's default for both trainers; alignflow is given the same
LEARNING_RATE = {"dpo": 1e-3, "reward": 3e-3}
BETA = 0.1
REPEATS = int(os.environ.get("ALIGNFLOW_BENCH_REPEATS", 3))
HELD_OUT_PAIRS = 200  # scored after training, outside the timed call
CASES = ("dpo:alignflow", "dpo:trl", "reward:alignflow", "reward:trl")
RERUN = "dpo:alignflow-rerun"


# ------------------------------------------------------------------ shared inputs


def prepare(root: Path) -> tuple[Path, Path]:
    """The HH pairs validated and split as ``alignflow data add`` does, and a small model built on them."""
    from alignflow.config import load_config
    from alignflow.data.pairing import load_pairs
    from alignflow.data.pipeline import write_snapshot
    from alignflow.data.validation import validate_paths
    from alignflow.models import build_tiny_model
    from alignflow.models.prompting import completion_text, format_prompt

    config = load_config(REPO / "configs" / "hh-rlhf.yaml", [f"data.source={HH_PAIRS}"])
    data_dir = root / "data"
    write_snapshot(validate_paths([HH_PAIRS], config.data), config.data, data_dir, REPO)
    pairs = load_pairs(data_dir, "train")
    texts = [
        f"{format_prompt(None, p['prompt'])} {completion_text(p['chosen'])} {completion_text(p['rejected'])}"
        for p in pairs
    ]
    return data_dir, build_tiny_model(texts, root / "tiny")


def _pairs_dataset(data_dir: Path, tokenizer: Any):
    """The rows TRL sees: the snapshot's pairs rendered exactly as alignflow's DPO stage renders them."""
    from alignflow.data.pairing import load_pairs
    from alignflow.training.dpo import pair_dataset

    return pair_dataset(load_pairs(data_dir, "train"), tokenizer)


def _trl_common(out: Path, stage: str, seed: int) -> dict[str, Any]:
    import torch

    common = {
        "output_dir": str(out),
        "max_steps": STEPS[stage],
        "per_device_train_batch_size": BATCH,
        "learning_rate": LEARNING_RATE[stage],
        "max_length": MAX_LENGTH,
        "report_to": [],
        "seed": seed,
    }
    if not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        common["bf16"] = False
    return common


# ------------------------------------------------------------------ the cases


def _alignflow_config(stage: str, seed: int, *extra: str):
    from alignflow.config import load_config

    return load_config(
        REPO / "configs" / "demo.yaml",
        [
            f"{stage}.max_steps={STEPS[stage]}",
            f"{stage}.per_device_train_batch_size={BATCH}",
            f"{stage}.learning_rate={LEARNING_RATE[stage]}",
            f"{stage}.max_length={MAX_LENGTH}",
            f"{stage}.save_steps=500",  # TRL's default checkpoint interval
            f"dpo.beta={BETA}",
            f"seed={seed}",
            *extra,
        ],
    )


def run_alignflow_dpo(
    data_dir: Path, model_dir: Path, out: Path, seed: int, *extra: str
) -> tuple[float, Path]:
    from alignflow.training.dpo import run_dpo

    cache = f"dpo.reference_cache_dir={out.parent / 'reference-cache'}"
    config = _alignflow_config("dpo", seed, cache, *extra)
    result = run_dpo(config, data_dir, out, model_path=model_dir)
    return result.metrics["train_loss"], Path(result.model_dir)


def run_alignflow_dpo_rerun(data_dir: Path, model_dir: Path, out: Path, seed: int) -> tuple[float, Path]:
    """A sweep's next run: another beta, the reference cache the previous run left."""
    return run_alignflow_dpo(data_dir, model_dir, out, seed, f"dpo.beta={2 * BETA}")


def run_trl_dpo(data_dir: Path, model_dir: Path, out: Path, seed: int) -> tuple[float, Path]:
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = DPOTrainer(
        model=str(model_dir),
        args=DPOConfig(beta=BETA, **_trl_common(out, "dpo", seed)),
        train_dataset=_pairs_dataset(data_dir, tokenizer),
        processing_class=tokenizer,
    )
    loss = trainer.train().training_loss
    trainer.save_model(str(out / "model"))
    return loss, out / "model"


def run_alignflow_reward(data_dir: Path, model_dir: Path, out: Path, seed: int) -> tuple[float, Path]:
    from alignflow.training.reward import run_reward

    result = run_reward(_alignflow_config("reward", seed), data_dir, out, model_path=model_dir)
    return result.metrics["train_loss"], Path(result.model_dir)


def run_trl_reward(data_dir: Path, model_dir: Path, out: Path, seed: int) -> tuple[float, Path]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, set_seed
    from trl import RewardConfig, RewardTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    set_seed(seed)  # the new score head is drawn at load time, before the Trainer seeds anything
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    trainer = RewardTrainer(
        model=model,
        args=RewardConfig(**_trl_common(out, "reward", seed)),
        train_dataset=_pairs_dataset(data_dir, tokenizer),
        processing_class=tokenizer,
    )
    loss = trainer.train().training_loss
    trainer.save_model(str(out / "model"))
    return loss, out / "model"


def held_out_loss(stage: str, trained: Path, start: Path, data_dir: Path, out: Path) -> float:
    """The trained model's loss on the first ``HELD_OUT_PAIRS`` held-out pairs, by TRL's own
    evaluation, the same call for both sides: DPO against the starting model as reference,
    Bradley-Terry for the reward model. The training loss averaged over a run depends on how
    batches were drawn; this compares the models the two runs produced."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer

    from alignflow.data.pairing import load_optional_pairs
    from alignflow.training.dpo import pair_dataset

    tokenizer = AutoTokenizer.from_pretrained(start)
    pairs = pair_dataset(load_optional_pairs(data_dir, "eval", HELD_OUT_PAIRS), tokenizer)
    common = {"output_dir": str(out / "held-out"), "report_to": [], "max_length": MAX_LENGTH, "use_cpu": True}
    common |= {"per_device_eval_batch_size": BATCH, "bf16": False}
    if stage == "dpo":
        trainer = DPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(trained),
            ref_model=AutoModelForCausalLM.from_pretrained(start),
            args=DPOConfig(beta=BETA, **common),
            train_dataset=pairs,  # required by the constructor; nothing is trained
            eval_dataset=pairs,
            processing_class=tokenizer,
        )
    else:
        model = AutoModelForSequenceClassification.from_pretrained(trained)
        model.config.pad_token_id = tokenizer.pad_token_id
        trainer = RewardTrainer(
            model=model,
            args=RewardConfig(**common),
            train_dataset=pairs,
            eval_dataset=pairs,
            processing_class=tokenizer,
        )
    return float(trainer.evaluate()["eval_loss"])


RUNNERS = {
    "dpo:alignflow": run_alignflow_dpo,
    "dpo:trl": run_trl_dpo,
    "reward:alignflow": run_alignflow_reward,
    "reward:trl": run_trl_reward,
    RERUN: run_alignflow_dpo_rerun,
}


def _time_training_loops() -> list[float]:
    """Record the seconds of every ``Trainer.train`` call in this process (both sides alike)."""
    from transformers import Trainer

    spans: list[float] = []
    original = Trainer.train

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            spans.append(time.perf_counter() - started)

    Trainer.train = timed
    return spans


def run_case(case: str, root: Path, out: Path, seed: int = 0) -> dict[str, Any]:
    """One case in this process: the numbers the parent collects."""
    import torch

    spans = _time_training_loops()
    started = time.perf_counter()
    loss, trained = RUNNERS[case](root / "data", root / "tiny", out, seed)
    total = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the held-out pass loads more
    stage = case.split(":")[0]
    pairs = STEPS[stage] * BATCH
    result = {
        "train_pairs_per_s": pairs / sum(spans),
        "call_pairs_per_s": pairs / total,
        "train_s": sum(spans),
        "call_s": total,
        "peak_rss_mb": rss,
        "mean_train_loss": float(loss),
        "seed": seed,
    }
    if torch.cuda.is_available():
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    result["held_out_loss"] = held_out_loss(stage, trained, root / "tiny", root / "data", out)
    return result


# ------------------------------------------------------------------ the parent


def _child(case: str, root: Path, out: Path, seed: int) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.training_bench",
            "--case",
            case,
            "--root",
            str(root),
            "--out",
            str(out),
            "--seed",
            str(seed),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{case} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric, the median over the repeats; the runs themselves are kept beside it."""
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and k != "seed"]
    return {k: statistics.median(r[k] for r in runs) for k in keys} | {"runs": runs}


def run_repeats(root: Path, repeats: int = REPEATS) -> dict[str, dict[str, Any]]:
    """Every case ``repeats`` times, interleaved (a slow minute on the machine hits both sides),
    repeat ``r`` seeded ``r`` on both sides."""
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    for repeat in range(repeats):
        for case in CASES:
            out = root / f"{case.replace(':', '-')}-{repeat}" / "stage"
            runs[case].append(_child(case, root, out, seed=repeat))
            if case == "dpo:alignflow" and repeat == repeats - 1:
                # the cache this run left
                runs[RERUN] = [_child(RERUN, root, out.parent / "rerun", seed=repeat)]
            shutil.rmtree(out.parent, ignore_errors=True)
    return {case: _median(r) for case, r in runs.items()}


def _ratios(cases: dict[str, dict[str, Any]], stage: str) -> dict[str, float]:
    ours, theirs = cases[f"{stage}:alignflow"], cases[f"{stage}:trl"]
    return {
        f"{stage}_train_throughput_ratio": round(ours["train_pairs_per_s"] / theirs["train_pairs_per_s"], 3),
        f"{stage}_call_throughput_ratio": round(ours["call_pairs_per_s"] / theirs["call_pairs_per_s"], 3),
        f"{stage}_peak_memory_ratio": round(ours["peak_rss_mb"] / theirs["peak_rss_mb"], 3),
        f"{stage}_final_loss_alignflow": round(ours["held_out_loss"], 4),
        f"{stage}_final_loss_trl": round(theirs["held_out_loss"], 4),
        f"{stage}_final_loss_abs_diff": round(abs(ours["held_out_loss"] - theirs["held_out_loss"]), 4),
        f"{stage}_mean_train_loss_alignflow": round(ours["mean_train_loss"], 4),
        f"{stage}_mean_train_loss_trl": round(theirs["mean_train_loss"], 4),
        f"{stage}_final_loss_diff_by_seed": [
            round(a["held_out_loss"] - b["held_out_loss"], 4)
            for a, b in zip(ours["runs"], theirs["runs"], strict=True)
        ],
    }


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Training throughput: alignflow stages vs TRL trainers used directly",
        "",
        f"{result['data']}; a small causal LM built offline on that text; {result['machine']}.",
        f"Steps {result['steps']}, {BATCH} pairs a step, max_length {MAX_LENGTH}, same learning rate on both"
        f" sides; median of {result['repeats']} runs per case (each in its own process), run r seeded r on"
        " both sides.",
        "",
        "| case | train pairs/s | whole-call pairs/s | train s | whole call s | peak RSS MB"
        " | mean train loss | held-out loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, row in result["cases"].items():
        lines.append(
            f"| {case} | {row['train_pairs_per_s']:.1f} | {row['call_pairs_per_s']:.1f} |"
            f" {row['train_s']:.1f} | {row['call_s']:.1f} | {row['peak_rss_mb']:.0f} |"
            f" {row['mean_train_loss']:.4f} | {row['held_out_loss']:.4f} |"
        )
    lines += ["", "| alignflow/TRL | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in result.items() if k.startswith(("dpo_", "reward_"))]
    lines += [
        "",
        f"Final loss = held-out loss: each trained model on the first {HELD_OUT_PAIRS} held-out pairs by"
        " TRL's own evaluation (DPO against the starting model, Bradley-Terry for the reward model),"
        " the same call for both sides and outside the timed call. Mean train loss is the training"
        " loss averaged over the run, which also depends on how batches were drawn (alignflow groups"
        " pairs by length).",
        "",
        f"`{RERUN}`: the last alignflow DPO run again with beta {2 * BETA}, reading the reference"
        " log-probs that run cached (what each further run of a sweep costs).",
    ]
    return "\n".join(lines) + "\n"


def cpu_name() -> str:
    """The CPU by name, family/model and the matrix units that decide its bf16 speed and rounding
    (machines of one kind differ: an AMX Xeon, EPYCs with or without AVX-512 bf16)."""
    try:
        info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    field = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(field.get("flags", "").split())
    units = [name for name, flag in (("AMX", "amx_bf16"), ("AVX-512 bf16", "avx512_bf16")) if flag in flags]
    units = units or (["AVX2, no AVX-512"] if "avx2" in flags else [])
    return (
        f"{field.get('model name', 'unknown CPU')} (family {field.get('cpu family', '?')} model "
        f"{field.get('model', '?')}; {', '.join(units) or 'no bf16 matrix unit'})"
    )


def machine() -> str:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu_name()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {device}"


def run(repeats: int = REPEATS) -> dict[str, Any]:
    """Prepare the data and model once, run every case ``repeats`` times, write the Markdown summary."""
    with tempfile.TemporaryDirectory(prefix="alignflow-training-bench-") as tmp:
        root = Path(tmp)
        data_dir, _ = prepare(root)
        n_train = _count(data_dir)
        cases = run_repeats(root, repeats)
    result: dict[str, Any] = {
        "machine": machine(),
        "data": f"HH-RLHF harmless-base, {n_train} train pairs",
        "steps": STEPS,
        "batch": BATCH,
        "max_length": MAX_LENGTH,
        "repeats": repeats,
        "cases": cases,
    }
    for stage in ("dpo", "reward"):
        result.update(_ratios(cases, stage))
    rerun, trl = cases[RERUN], cases["dpo:trl"]
    result["dpo_rerun_call_throughput_ratio"] = round(rerun["call_pairs_per_s"] / trl["call_pairs_per_s"], 3)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "training.md").write_text(_markdown(result), encoding="utf-8")
    return result


def _count(data_dir: Path) -> int:
    from alignflow.data.pairing import load_pairs

    return len(load_pairs(data_dir, "train"))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=[*CASES, RERUN])
    parser.add_argument("--root", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    if options.case:
        print(json.dumps(run_case(options.case, options.root, options.out, options.seed)))
    else:
        from bench.__main__ import main

        sys.exit(main(["training"]))
