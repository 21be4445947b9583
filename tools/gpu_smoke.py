"""GPU smoke run: the research trainers and the pipeline's stages on CUDA, dtype ``auto`` (bf16
where the card has it) with LoRA; each part is timed and reported apart, so one failure hides
none of the others.

The device machine's image has torch, accelerate and peft but not the rest, and an older
transformers. Here, from the repository root, fetch the lock's wheels for its Python 3.12::

    echo /.whl/ >> .git/info/exclude
    python3 tools/gpu_smoke.py wheels

then run through the device tool with ``carry: [".whl"]``::

    python3 -m pip install -q --no-deps .whl/*.whl && PYTHONPATH=. python3 tools/gpu_smoke.py

It writes ``$OUT/gpu_smoke.json``. First run, H200, 2026-11-26: about 40 s of work.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".whl"
# what the device image lacks, or holds at another version than the lock
MISSING_THERE = [
    "trl",
    "datasets",
    "dill",
    "multiprocess",
    "mlflow-skinny",
    "mlflow-tracing",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "cachetools",
    "databricks-sdk",
    "gitpython",
    "gitdb",
    "smmap",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-semantic-conventions",
    "opentelemetry-proto",
    "sqlparse",
    "python-dotenv",
    "importlib-metadata",
    "google-auth",
    "transformers",
    "huggingface-hub",
    "fastapi",
    "starlette",
    "uvicorn",
    "orjson",
    "pydantic-extra-types",
    "pydot",
    "truststore",
    "httpx2",
    "httpcore2",
    "h2",
    "hpack",
    "hyperframe",
    "sniffio",
    "pyasn1",
    "pyasn1-modules",
]


def download_wheels() -> None:
    """The lock's pins of :data:`MISSING_THERE`, as CPython 3.12 manylinux wheels, into ``.whl``."""
    lock = (REPO / "requirements" / "lock.txt").read_text()
    pins = [m.group(0) for name in MISSING_THERE if (m := re.search(rf"(?im)^{name}==\S+", lock))]
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(WHEELS)]
    command += ["--python-version", "3.12", "--implementation", "cp"]
    for platform in platforms:
        command += ["--platform", platform]
    subprocess.run([*command, *pins], check=True)


def run_smoke() -> dict[str, Any]:
    import torch

    results: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        results["gpu"] = torch.cuda.get_device_name(0)
        results["bf16"] = torch.cuda.is_bf16_supported()
    root = Path(tempfile.mkdtemp())

    def part(name: str, fn: Callable[[], Any]) -> None:
        began = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as exc:
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
        results[name + "_seconds"] = round(time.perf_counter() - began, 1)
        print(name, json.dumps(results[name], default=str)[:1500], flush=True)

    from alignflow.data.demo import iter_demo_pairs
    from alignflow.models import build_tiny_model

    records = list(iter_demo_pairs(600, seed=0))
    tiny = build_tiny_model([f"{r['prompt']} {r['chosen']} {r['rejected']}" for r in records], root / "tiny")
    part("research_dpo", lambda: research_dpo(tiny, records, root))
    part("research_reward", lambda: research_reward(tiny, records))
    stages: dict[str, Any] = {}
    data = demo_snapshot(root)
    part(
        "stage_sft",
        lambda: stage(stages, "sft", data, root, "sft.max_steps=150", "sft.gradient_checkpointing=true"),
    )
    part("stage_dpo", lambda: stage(stages, "dpo", data, root, "dpo.max_steps=40"))
    part("stage_reward", lambda: stage(stages, "reward", data, root, "reward.max_steps=60"))
    part("stage_grpo", lambda: stage(stages, "grpo", data, root, "grpo.max_steps=6"))
    return results


def research_dpo(tiny: Path, records: list[dict[str, Any]], root: Path) -> dict[str, Any]:
    from alignflow.models.factory import load_causal_lm
    from alignflow.rl.dpo import DPOConfig, DPOTrainer

    model, tok = load_causal_lm(tiny)
    config = DPOConfig(
        learning_rate=1e-3,
        batch_size=16,
        gradient_accumulation_steps=1,
        max_length=48,
        max_prompt_length=24,
        eval_every=10,
        output_dir=str(root / "dpo"),
        save_every=10,
    )
    trainer = DPOTrainer(config, tokenizer=tok, model=model)

    def make(rows: list[dict[str, Any]]) -> Any:
        prompts = [r["prompt"] for r in rows]
        return trainer.make_dataset(
            prompts, [" " + r["chosen"] for r in rows], [" " + r["rejected"] for r in rows]
        )

    train, held_out = make(records[:400]), make(records[400:])
    before = trainer.evaluate(held_out)
    out = trainer.train(train, held_out)
    return {
        "before": before,
        "after": out["eval"],
        "steps": out["steps"],
        "device": str(next(trainer.model.parameters()).device),
        "checkpoints": sorted(p.name for p in (root / "dpo").glob("checkpoint-*")),
    }


def research_reward(tiny: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    from alignflow.models.factory import load_causal_lm
    from alignflow.rl.reward_model import RewardModel, RewardModelConfig, RewardModelTrainer

    _, tok = load_causal_lm(tiny)
    config = RewardModelConfig(
        model_name=str(tiny), dropout_prob=0.0, warmup_steps=5, learning_rate=1e-3, max_length=64
    )
    trainer = RewardModelTrainer(RewardModel(config), tok, config)
    chosen = [f"{r['prompt']} {r['chosen']}" for r in records]
    rejected = [f"{r['prompt']} {r['rejected']}" for r in records]
    before = trainer.evaluate(chosen[400:], rejected[400:])
    trainer.train_on_preferences(chosen[:400], rejected[:400], num_epochs=3, batch_size=16)
    after = trainer.evaluate(chosen[400:], rejected[400:])
    return {"before": before, "after": after, "device": str(trainer.model.device)}


def demo_snapshot(root: Path) -> Path:
    from alignflow.data.demo import iter_demo_pairs
    from alignflow.data.snapshot import write_split

    data = root / "data"
    rows = [dict(r, kind="pair") for r in iter_demo_pairs(800, seed=0)]
    write_split(data, "train", rows[:640])
    write_split(data, "eval", rows[640:])
    return data


def stage(done: dict[str, Any], name: str, data: Path, root: Path, *overrides: str) -> dict[str, float]:
    """One pipeline stage on the demo config, dtype auto and LoRA, started from the SFT model."""
    from alignflow.config import load_config
    from alignflow.training.registry import stage_spec

    config = load_config(
        REPO / "configs" / "demo.yaml", ["model.dtype=auto", "model.lora.enabled=true", *overrides]
    )
    start = done["sft"].model_dir if "sft" in done else None
    done[name] = stage_spec(name).load_runner()(config, data, root / name, model_path=start)
    return dict(done[name].metrics)


if __name__ == "__main__":
    if sys.argv[1:] == ["wheels"]:
        download_wheels()
    else:
        out = Path(os.environ.get("OUT", tempfile.mkdtemp()))
        (out / "gpu_smoke.json").write_text(json.dumps(run_smoke(), indent=2, default=str))
