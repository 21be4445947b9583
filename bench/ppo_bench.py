"""PPO iteration throughput: alignflow's PPOTrainer against TRL's GRPOTrainer.

Both train the same offline tiny model (built from the demo data) on the same demo
addition prompts with the same reward (correctness + 0.5 * format), generating up to
``MAX_NEW_TOKENS`` tokens per response with the same number of responses per update.
Reported: prompts/s and generated tokens/s over the timed iterations (after one warm-up
iteration each), and alignflow/TRL ratios. TRL's GRPO samples ``NUM_GENERATIONS``
responses per prompt, so its prompts/s counts distinct prompts; tokens/s is the
like-for-like figure. Note the algorithms differ: PPO also runs a value head and a
reference model pass, GRPO needs no critic; the ratio is what a user switching sees.

Run: ``python -m bench.ppo_bench`` (writes bench/results/ppo_throughput.{json,md}).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from alignflow.data import demo  # noqa: E402
from alignflow.data.answers import correctness_reward, format_reward  # noqa: E402
from alignflow.models import build_tiny_model, load_causal_lm  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RESPONSES_PER_UPDATE = 16
NUM_GENERATIONS = 4
MAX_NEW_TOKENS = 16
ITERATIONS = 8


def _prompts(n: int = 64) -> tuple[list[str], dict[str, int]]:
    problems = list(demo.iter_demo_prompts(n, seed=1))
    return [p["prompt"] for p in problems], {p["prompt"]: p["metadata"]["answer"] for p in problems}


def _score(prompt: str, completion: str, answers: dict[str, int]) -> float:
    return correctness_reward(completion, answers[prompt]) + 0.5 * format_reward(completion)


def _build_model(root: Path) -> Path:
    texts = [f"{r['prompt']} {r['chosen']} {r['rejected']}" for r in demo.iter_demo_pairs(600, seed=0)]
    return build_tiny_model(texts, root / "tiny")


def bench_alignflow(model_dir: Path) -> dict[str, float]:
    from alignflow.rl.ppo import PPOConfig, PPOTrainer

    prompts, answers = _prompts()
    model, tok = load_causal_lm(model_dir)
    cfg = PPOConfig(
        batch_size=RESPONSES_PER_UPDATE,
        mini_batch_size=RESPONSES_PER_UPDATE,
        num_epochs=1,
        max_new_tokens=MAX_NEW_TOKENS,
        learning_rate=1e-5,
        seed=0,
    )
    trainer = PPOTrainer(cfg, model, tok)

    def reward_fn(batch_prompts, responses, metadata=None):
        return [_score(p, r, answers) for p, r in zip(batch_prompts, responses, strict=True)]

    trainer.train(prompts, reward_fn, num_iterations=1)  # warm-up
    start = time.perf_counter()
    trainer.train(prompts, reward_fn, num_iterations=1 + ITERATIONS)
    elapsed = time.perf_counter() - start
    timed = trainer.history[1:]
    tokens = sum(h["response/length"] * RESPONSES_PER_UPDATE for h in timed)
    return {
        "seconds": elapsed,
        "iterations": len(timed),
        "prompts_per_s": len(timed) * RESPONSES_PER_UPDATE / elapsed,
        "responses_per_s": len(timed) * RESPONSES_PER_UPDATE / elapsed,  # one response per prompt
        "generated_tokens_per_s": tokens / elapsed,
    }


def bench_trl_grpo(model_dir: Path, workdir: Path) -> dict[str, float]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    prompts, answers = _prompts()
    model, tok = load_causal_lm(model_dir)
    dataset = Dataset.from_dict({"prompt": prompts})

    def reward(completions, prompts, **kwargs):
        return [_score(p, c, answers) for p, c in zip(prompts, completions, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.stamps: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.stamps.append(time.perf_counter())

    args = GRPOConfig(
        output_dir=str(workdir / "grpo"),
        per_device_train_batch_size=RESPONSES_PER_UPDATE,
        num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_NEW_TOKENS,
        max_steps=1 + ITERATIONS,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        seed=0,
        disable_tqdm=True,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[timer],
    )
    trainer.train()
    elapsed = timer.stamps[-1] - timer.stamps[0]  # first step is the warm-up
    lengths = [
        h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h
    ]
    tokens = sum(lengths[1:]) * RESPONSES_PER_UPDATE
    steps = len(timer.stamps) - 1
    return {
        "seconds": elapsed,
        "iterations": steps,
        "prompts_per_s": steps * RESPONSES_PER_UPDATE / NUM_GENERATIONS / elapsed,
        "responses_per_s": steps * RESPONSES_PER_UPDATE / elapsed,
        "generated_tokens_per_s": tokens / elapsed,
    }


def _markdown(result: dict[str, Any]) -> str:
    a, t, r = result["alignflow_ppo"], result["trl_grpo"], result["ratio_alignflow_over_trl"]
    return "\n".join(
        [
            "# PPO iteration throughput: alignflow PPO vs TRL GRPOTrainer",
            "",
            f"Tiny offline model, {RESPONSES_PER_UPDATE} responses per update, up to {MAX_NEW_TOKENS} new "
            f"tokens, {ITERATIONS} timed iterations; {result['machine']}.",
            "",
            "| | prompts/s | responses/s | generated tokens/s |",
            "|---|---|---|---|",
            f"| alignflow PPO | {a['prompts_per_s']:.2f} | {a['responses_per_s']:.2f} | "
            f"{a['generated_tokens_per_s']:.1f} |",
            f"| TRL GRPO | {t['prompts_per_s']:.2f} | {t['responses_per_s']:.2f} | "
            f"{t['generated_tokens_per_s']:.1f} |",
            f"| ratio alignflow/TRL | {r['prompts_per_s']:.2f} | {r['responses_per_s']:.2f} | "
            f"{r['generated_tokens_per_s']:.2f} |",
            "",
            f"GRPO draws {NUM_GENERATIONS} responses per prompt, so its prompts/s counts distinct prompts.",
            "",
        ]
    )


def run() -> dict[str, Any]:
    """Time both trainers; write JSON + Markdown to bench/results/ and return the figures."""
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _build_model(Path(tmp))
        ours = bench_alignflow(model_dir)
        theirs = bench_trl_grpo(model_dir, Path(tmp))
    result = {
        "alignflow_ppo": ours,
        "trl_grpo": theirs,
        "ratio_alignflow_over_trl": {
            key: ours[key] / theirs[key]
            for key in ("prompts_per_s", "responses_per_s", "generated_tokens_per_s")
            if theirs[key]
        },
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ppo_throughput.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    (RESULTS / "ppo_throughput.md").write_text(_markdown(result), encoding="utf-8")
    return result


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
