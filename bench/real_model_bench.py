"""SmolLM2-135M-Instruct on this CPU: what bf16 buys, and how much of the machine training uses.

Measured in one process, one case after another, on the word-problem task's chat-templated
rows (what ``configs/smollm2-math.yaml`` trains on):

- the GEMM peak of this machine at fp32 and bf16 (2048^3 matmuls, the bench's thread count):
  the ceiling every model-FLOPs-utilisation (MFU) figure below is read against;
- a training step (forward, backward, AdamW) three ways: fp32 weights; fp32 weights under
  bf16 autocast; bf16 weights with LoRA adapters (the config's setting). Tokens/s and MFU,
  counting 6 N FLOPs per token for full training and 4 N for a frozen base with adapters
  (no weight gradients), N the model's parameters;
- loss parity: the same batches from the same weights, fp32 against bf16 autocast, step by
  step (the largest gap, and the last step's losses);
- greedy generation, tokens/s at batch 16, fp32 weights against bf16 weights.

Run: ``python -m bench real_model`` (writes bench/results/real_model.{json,md}); needs the
converted model (``alignflow model pull smollm2-135m-instruct``).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).resolve().parent / "results"
THREADS = int(os.environ.get("ALIGNFLOW_BENCH_THREADS", os.cpu_count() or 1))
BATCH = 16
TIMED_STEPS = int(os.environ.get("ALIGNFLOW_BENCH_STEPS", 5))
PARITY_STEPS = int(os.environ.get("ALIGNFLOW_BENCH_PARITY_STEPS", 6))
NEW_TOKENS = 32
GEMM_SIZE = 2048
GEMM_SECONDS = 3.0


def gemm_peak_gflops(dtype: Any, size: int = GEMM_SIZE, seconds: float = GEMM_SECONDS) -> float:
    """The machine's practical ceiling at ``dtype``: the fastest square matmul over ``seconds`` of
    back-to-back products (``alignflow.models.gemm_rate``), long enough for AMX to warm up."""
    from alignflow.models.gemm_rate import measure_gflops

    return measure_gflops(str(dtype).removeprefix("torch."), "cpu", size, seconds)


def training_rows(tokenizer: Any, n: int) -> list[str]:
    """Chat-templated word problems with their worked answers, as SFT sees them."""
    from alignflow.data import word_problems
    from alignflow.models.prompting import format_prompt

    problems = word_problems.all_problems(n, seed=7)
    return [
        format_prompt(tokenizer, p.prompt) + word_problems.response("best", p, _rng()) + tokenizer.eos_token
        for p in problems
    ]


def _rng():
    import random

    return random.Random(0)


def batches(tokenizer: Any, rows: list[str]) -> list[dict[str, Any]]:
    """Padded batches with labels (padding masked out of the loss)."""
    out = []
    for start in range(0, len(rows), BATCH):
        enc = tokenizer(rows[start : start + BATCH], return_tensors="pt", padding=True)
        labels = enc["input_ids"].clone()
        labels[enc["attention_mask"] == 0] = -100
        out.append({**enc, "labels": labels})
    return out


def load(path: str, mode: str):
    """The model as one of the three training setups: fp32, fp32 under autocast, bf16 + LoRA."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if mode == "bf16-lora" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if mode == "bf16-lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    return model.train()


def train_steps(model: Any, steps: list[dict[str, Any]], autocast: bool) -> tuple[list[float], float]:
    """Losses of a forward-backward-AdamW step per batch, and the seconds they took."""
    import torch

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    losses, start = [], time.perf_counter()
    for batch in steps:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, time.perf_counter() - start


def tokens(steps: list[dict[str, Any]]) -> int:
    return int(sum(int(b["attention_mask"].sum()) for b in steps))


def measure_training(path: str, data: list[dict[str, Any]], n_params: int, peaks: dict[str, float]) -> dict:
    """Tokens/s and MFU of each setup over ``TIMED_STEPS`` steps after one warm-up step."""
    timed = data[1 : 1 + TIMED_STEPS]
    result = {}
    for mode, autocast, flops_per_token, peak in (
        ("fp32", False, 6, peaks["fp32"]),
        ("bf16-autocast", True, 6, peaks["bf16"]),
        ("bf16-lora", False, 4, peaks["bf16"]),
    ):
        model = load(path, mode)
        train_steps(model, data[:1], autocast)
        _, seconds = train_steps(model, timed, autocast)
        rate = tokens(timed) / seconds
        result[mode] = {
            "tokens_per_s": rate,
            "seconds_per_step": seconds / len(timed),
            "mfu": flops_per_token * n_params * rate / (peak * 1e9),
        }
        del model
    return result


def loss_parity(path: str, data: list[dict[str, Any]]) -> dict[str, Any]:
    """fp32 against bf16 autocast: same start, same batches, the loss at every step."""
    import torch

    curves = {}
    for mode, autocast in (("fp32", False), ("bf16-autocast", True)):
        torch.manual_seed(0)
        curves[mode], _ = train_steps(load(path, "fp32"), data[:PARITY_STEPS], autocast)
    gaps = [abs(a - b) for a, b in zip(curves["fp32"], curves["bf16-autocast"], strict=True)]
    return {
        "fp32_losses": curves["fp32"],
        "bf16_autocast_losses": curves["bf16-autocast"],
        "max_abs_gap": max(gaps),
        "max_relative_gap": max(g / abs(a) for g, a in zip(gaps, curves["fp32"], strict=True)),
    }


def measure_generation(path: str, prompts: list[str]) -> dict[str, float]:
    """Greedy new tokens per second at batch 16, fp32 weights against bf16 weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from alignflow.models.loading import load_tokenizer
    from alignflow.models.prompting import generate

    tokenizer = load_tokenizer(path)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        generate(model, tokenizer, prompts[:BATCH], max_new_tokens=4, batch_size=BATCH)  # warm-up
        start = time.perf_counter()
        texts = generate(model, tokenizer, prompts, max_new_tokens=NEW_TOKENS, batch_size=BATCH)
        seconds = time.perf_counter() - start
        made = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
        out[f"{name}_tokens_per_s"] = made / seconds
    out["bf16_speedup"] = out["bf16_tokens_per_s"] / out["fp32_tokens_per_s"]
    return out


def _markdown(r: dict[str, Any]) -> str:
    t, g, p = r["training"], r["generation"], r["parity"]
    lines = [
        "# SmolLM2-135M-Instruct on this CPU",
        "",
        f"Machine: {r['machine']}; {r['threads']} threads; batch {BATCH}; "
        f"{r['parameters'] / 1e6:.1f}M parameters. GEMM peak: fp32 {r['gemm_peak_gflops']['fp32']:.0f} "
        f"GFLOP/s, bf16 {r['gemm_peak_gflops']['bf16']:.0f} GFLOP/s "
        f"({r['gemm_peak_gflops']['bf16'] / r['gemm_peak_gflops']['fp32']:.1f}x).",
        "",
        "| training setup | tokens/s | s/step | MFU (vs its dtype's GEMM peak) | vs fp32 |",
        "|---|---|---|---|---|",
    ]
    base = t["fp32"]["tokens_per_s"]
    for mode, row in t.items():
        lines.append(
            f"| {mode} | {row['tokens_per_s']:.0f} | {row['seconds_per_step']:.2f} | {row['mfu']:.1%} "
            f"| {row['tokens_per_s'] / base:.2f}x |"
        )
    lines += [
        "",
        f"Loss parity over {len(p['fp32_losses'])} steps (same weights, same batches): largest gap "
        f"{p['max_abs_gap']:.4f} ({p['max_relative_gap']:.2%} of the fp32 loss); last step fp32 "
        f"{p['fp32_losses'][-1]:.4f}, bf16 autocast {p['bf16_autocast_losses'][-1]:.4f}.",
        "",
        f"Generation (greedy, batch {BATCH}, {NEW_TOKENS} new tokens): fp32 "
        f"{g['fp32_tokens_per_s']:.0f} tokens/s, bf16 {g['bf16_tokens_per_s']:.0f} tokens/s "
        f"({g['bf16_speedup']:.1f}x).",
        "",
        f"Peak memory (RSS) of the bench process: {r['peak_rss_mb']:.0f} MB. Wall: {r['wall_s']:.0f} s. "
        f"Load average at the end: {r.get('load_average_1min_at_end', float('nan')):.1f} "
        "(above the thread count, other jobs shared the cores: every rate reads low, ratios less so).",
        "",
        "Not measured yet: alignflow's DPO and GRPO stages against TRL's trainers with their own",
        "best speed settings on this model (bench/training_bench.py does so for the tiny model).",
    ]
    return "\n".join(lines) + "\n"


def run() -> dict[str, Any]:
    import torch

    from alignflow.models.factory import resolve_model_source
    from alignflow.models.loading import load_tokenizer
    from alignflow.models.model_config import SMOLLM2

    torch.set_num_threads(THREADS)
    started = time.perf_counter()
    path = resolve_model_source(SMOLLM2)
    tokenizer = load_tokenizer(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = training_rows(tokenizer, BATCH * (2 + max(TIMED_STEPS, PARITY_STEPS)))
    data = batches(tokenizer, rows)
    peaks = {"fp32": gemm_peak_gflops(torch.float32), "bf16": gemm_peak_gflops(torch.bfloat16)}
    n_params = sum(p.numel() for p in load(path, "fp32").parameters())
    from alignflow.data import word_problems

    prompts = [p.prompt for p in word_problems.all_problems(BATCH * 2, seed=11)]
    result = {
        "name": "real_model",
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "threads": THREADS,
        "parameters": n_params,
        "gemm_peak_gflops": peaks,
        "training": measure_training(path, data, n_params, peaks),
        "parity": loss_parity(path, data),
        "generation": measure_generation(path, prompts),
    }
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["load_average_1min_at_end"] = os.getloadavg()[0]  # > threads: others shared the cores
    result["wall_s"] = time.perf_counter() - started
    result["bf16_lora_speedup"] = (
        result["training"]["bf16-lora"]["tokens_per_s"] / result["training"]["fp32"]["tokens_per_s"]
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "real_model.md").write_text(_markdown(result), encoding="utf-8")
    return result


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
