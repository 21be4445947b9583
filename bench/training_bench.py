"""DPO and reward-model training: alignflow's stages vs TRL's trainers used directly.

Same tiny offline model, same demo pairs (same prompt rendering), same number of steps,
batch size and learning rate on both sides; everything else is each tool's own default.
For TRL that means its trainer config as shipped (gradient checkpointing on, ``max_length``
1024, checkpoint every 500 steps), with bf16 switched off only where the device has no bf16.
alignflow's stage does what it always does (activation checkpointing off unless a stage
config asks for it): loads the versioned snapshot, checkpoints atomically every
``save_steps``, evaluates before and after on held-out pairs (DPO) or measures
accuracy/calibration and reward statistics (reward), and saves the final model.

Each case runs in its own process so that peak memory (max RSS, and peak CUDA memory on a
GPU) belongs to that case alone. Reported per case: pairs/s over the training loop
(``Trainer.train`` timed the same way on both sides), pairs/s over the whole call, peak
memory and the final training loss; then alignflow/TRL ratios.

Run: ``python -m bench training`` (writes bench/results/training.{json,md}).
"""

from __future__ import annotations

import json
import os
import platform
import resource
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
STEPS = 40
BATCH = 16
LEARNING_RATE = {"dpo": 1e-3, "reward": 3e-3}
BETA = 0.1
CASES = ("dpo:alignflow", "dpo:trl", "reward:alignflow", "reward:trl")


# ------------------------------------------------------------------ shared inputs


def prepare(root: Path) -> tuple[Path, Path]:
    """A demo snapshot (train/eval Parquet) and a tiny model, both written once for all cases."""
    from alignflow.data.demo import iter_demo_pairs
    from alignflow.data.snapshot import write_split
    from alignflow.models import build_tiny_model

    records = [dict(r, kind="pair") for r in iter_demo_pairs(800, seed=0)]
    data_dir = root / "data"
    write_split(data_dir, "train", records[:640])
    write_split(data_dir, "eval", records[640:])
    texts = [f"{r['prompt']} {r['chosen']} {r['rejected']}" for r in records]
    return data_dir, build_tiny_model(texts, root / "tiny")


def _pairs_dataset(data_dir: Path, tokenizer: Any):
    """The rows TRL sees: the snapshot's pairs rendered exactly as alignflow's DPO stage renders them."""
    from alignflow.data.snapshot import load_split
    from alignflow.training.dpo import pair_dataset

    return pair_dataset(load_split(data_dir, "train", kind="pair"), tokenizer)


def _trl_common(out: Path, stage: str) -> dict[str, Any]:
    import torch

    common = {
        "output_dir": str(out),
        "max_steps": STEPS,
        "per_device_train_batch_size": BATCH,
        "learning_rate": LEARNING_RATE[stage],
        "report_to": [],
        "seed": 0,
    }
    if not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        common["bf16"] = False
    return common


# ------------------------------------------------------------------ the four cases


def _alignflow_config(stage: str):
    from alignflow.config import load_config

    return load_config(
        REPO / "configs" / "demo.yaml",
        [
            f"{stage}.max_steps={STEPS}",
            f"{stage}.per_device_train_batch_size={BATCH}",
            f"{stage}.learning_rate={LEARNING_RATE[stage]}",
            "dpo.beta=0.1",
        ],
    )


def run_alignflow_dpo(data_dir: Path, model_dir: Path, out: Path) -> float:
    from alignflow.training.dpo import run_dpo

    return run_dpo(_alignflow_config("dpo"), data_dir, out, model_path=model_dir).metrics["train_loss"]


def run_trl_dpo(data_dir: Path, model_dir: Path, out: Path) -> float:
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = DPOTrainer(
        model=str(model_dir),
        args=DPOConfig(beta=BETA, **_trl_common(out, "dpo")),
        train_dataset=_pairs_dataset(data_dir, tokenizer),
        processing_class=tokenizer,
    )
    loss = trainer.train().training_loss
    trainer.save_model(str(out / "model"))
    return loss


def run_alignflow_reward(data_dir: Path, model_dir: Path, out: Path) -> float:
    from alignflow.training.reward import run_reward

    return run_reward(_alignflow_config("reward"), data_dir, out, model_path=model_dir).metrics["train_loss"]


def run_trl_reward(data_dir: Path, model_dir: Path, out: Path) -> float:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, set_seed
    from trl import RewardConfig, RewardTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    set_seed(0)  # the new score head is drawn at load time, before the Trainer seeds anything
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    trainer = RewardTrainer(
        model=model,
        args=RewardConfig(**_trl_common(out, "reward")),
        train_dataset=_pairs_dataset(data_dir, tokenizer),
        processing_class=tokenizer,
    )
    loss = trainer.train().training_loss
    trainer.save_model(str(out / "model"))
    return loss


RUNNERS = {
    "dpo:alignflow": run_alignflow_dpo,
    "dpo:trl": run_trl_dpo,
    "reward:alignflow": run_alignflow_reward,
    "reward:trl": run_trl_reward,
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


def run_case(case: str, root: Path) -> dict[str, Any]:
    """One case in this process: the numbers the parent collects."""
    import torch

    spans = _time_training_loops()
    started = time.perf_counter()
    loss = RUNNERS[case](root / "data", root / "tiny", root / case.replace(":", "-"))
    total = time.perf_counter() - started
    pairs = STEPS * BATCH
    result = {
        "train_pairs_per_s": pairs / sum(spans),
        "call_pairs_per_s": pairs / total,
        "train_s": sum(spans),
        "call_s": total,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "final_train_loss": float(loss),
    }
    if torch.cuda.is_available():
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


# ------------------------------------------------------------------ the parent


def _child(case: str, root: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.training_bench", "--case", case, "--root", str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{case} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratios(cases: dict[str, dict[str, Any]], stage: str) -> dict[str, float]:
    ours, theirs = cases[f"{stage}:alignflow"], cases[f"{stage}:trl"]
    return {
        f"{stage}_train_throughput_ratio": round(ours["train_pairs_per_s"] / theirs["train_pairs_per_s"], 3),
        f"{stage}_call_throughput_ratio": round(ours["call_pairs_per_s"] / theirs["call_pairs_per_s"], 3),
        f"{stage}_peak_memory_ratio": round(ours["peak_rss_mb"] / theirs["peak_rss_mb"], 3),
        f"{stage}_final_loss_alignflow": round(ours["final_train_loss"], 4),
        f"{stage}_final_loss_trl": round(theirs["final_train_loss"], 4),
    }


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Training throughput: alignflow stages vs TRL trainers used directly",
        "",
        f"Tiny offline model, {STEPS} steps x {BATCH} pairs, same data, batch and learning rate;"
        f" {result['machine']}.",
        "",
        "| case | train pairs/s | whole-call pairs/s | peak RSS MB | final train loss |",
        "|---|---|---|---|---|",
    ]
    for case, row in result["cases"].items():
        lines.append(
            f"| {case} | {row['train_pairs_per_s']:.1f} | {row['call_pairs_per_s']:.1f} |"
            f" {row['peak_rss_mb']:.0f} | {row['final_train_loss']:.4f} |"
        )
    lines += ["", "| ratio alignflow/TRL | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in result.items() if k.endswith("_ratio")]
    return "\n".join(lines) + "\n"


def machine() -> str:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {device}"


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="alignflow-training-bench-") as tmp:
        root = Path(tmp)
        prepare(root)
        cases = {case: _child(case, root) for case in CASES}
    result: dict[str, Any] = {"machine": machine(), "steps": STEPS, "batch": BATCH, "cases": cases}
    for stage in ("dpo", "reward"):
        result.update(_ratios(cases, stage))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "training.md").write_text(_markdown(result), encoding="utf-8")
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=CASES)
    parser.add_argument("--root", type=Path)
    options = parser.parse_args()
    if options.case:
        print(json.dumps(run_case(options.case, options.root)))
    else:
        from bench.__main__ import main

        sys.exit(main(["training"]))
