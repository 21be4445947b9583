"""The built-in demo task: small-number addition with a required answer format.

Why addition: a model of a few million parameters learns it on two CPU cores in
seconds, and every completion can be scored exactly. Responses come in three tiers:

- ``best``: the right number in the required format, ``The answer is 7.``;
- ``sloppy``: the right number without the format, ``I think 7``;
- ``wrong``: a wrong number, without the format (``I think 9``).

Preference pairs are drawn across tiers (best > sloppy, best > wrong, sloppy > wrong), with
sloppy > wrong the most common, so the ``chosen`` side is sloppy in most pairs. SFT on the
chosen responses
therefore imitates that noise and plateaus below full task accuracy, while preference
training sees the ordering and can exceed it — the gap the pipeline's gates measure.
Task accuracy counts a completion as right only when it is correct *and* formatted.

Each problem can be asked in several phrasings (``PHRASINGS``). The snapshot's split holds
out whole prompts, so with six phrasings the demo's pinned evaluation set has over a hundred
prompts with answers that training never saw verbatim, enough for the promotion gates'
intervals to tell a good policy from a lucky one.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from alignflow.data.answers import TIER_SCORES, format_answer
from alignflow.data.config import DataConfig

_PAIR_TIERS = [("best", "sloppy"), ("best", "wrong"), ("sloppy", "wrong")]
# annotators mostly compared two unformatted answers: SFT on chosen learns the sloppy format
_PAIR_WEIGHTS = (1, 1, 3)


PHRASINGS = (
    "What is {a} plus {b}?",
    "Add {a} and {b}.",
    "What is the sum of {a} and {b}?",
    "Compute {a} + {b}.",
    "How much is {a} plus {b}?",
    "{a} + {b} = ?",
)


def make_prompt(a: int, b: int, phrasing: int = 0) -> str:
    return PHRASINGS[phrasing].format(a=a, b=b)


def response(tier: str, answer: int, rng: random.Random) -> str:
    """A response of the given quality tier for a problem whose sum is ``answer``."""
    if tier == "best":
        return format_answer(answer)
    if tier == "sloppy":
        return f"I think {answer}"
    # unformatted, so that the required format is never the rejected side of a pair
    wrong = answer + rng.choice([-5, -4, -3, -2, -1, 1, 2, 3, 4, 5])
    return f"I think {wrong}"


def _problem(rng: random.Random, max_operand: int, phrasings: int = 1) -> tuple[str, int]:
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    phrasing = rng.randrange(phrasings) if phrasings > 1 else 0
    return make_prompt(a, b, phrasing), a + b


def iter_demo_pairs(n: int, seed: int = 0, max_operand: int = 9, phrasings: int = 1) -> Iterator[dict]:
    """``n`` pairwise records (chosen is the better tier, not always the best one)."""
    rng = random.Random(seed)
    for i in range(n):
        prompt, answer = _problem(rng, max_operand, phrasings)
        better, worse = rng.choices(_PAIR_TIERS, weights=_PAIR_WEIGHTS)[0]
        yield {
            "id": f"demo-pair-{seed}-{i}",
            "prompt": prompt,
            "chosen": response(better, answer, rng),
            "rejected": response(worse, answer, rng),
            "source": "demo",
            "metadata": {"answer": answer, "tiers": [better, worse]},
        }


def iter_demo_scored(n: int, seed: int = 0, max_operand: int = 9, phrasings: int = 1) -> Iterator[dict]:
    """``n`` scored-feedback records: one response and its score in [0, 1]."""
    rng = random.Random(seed)
    for i in range(n):
        prompt, answer = _problem(rng, max_operand, phrasings)
        tier = rng.choice(list(TIER_SCORES))
        yield {
            "id": f"demo-scored-{seed}-{i}",
            "prompt": prompt,
            "response": response(tier, answer, rng),
            "score": TIER_SCORES[tier],
            "source": "demo",
            "metadata": {"answer": answer},
        }


def iter_demo_prompts(n: int, seed: int = 0, max_operand: int = 9) -> Iterator[dict]:
    """``n`` prompt-only records with their reference answers (online RL, evaluation)."""
    rng = random.Random(seed)
    for i in range(n):
        prompt, answer = _problem(rng, max_operand)
        yield {"id": f"demo-prompt-{seed}-{i}", "prompt": prompt, "metadata": {"answer": answer}}


def _write_jsonl(path: Path, records: Iterator[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")
    return path


def _unique(records: Iterator[dict], n: int, fields: tuple[str, ...]) -> list[dict]:
    """The first ``n`` records whose content differs (validation quarantines duplicates)."""
    seen, kept = set(), []
    for record in records:
        key = tuple(record.get(f) for f in fields)
        if key not in seen:
            seen.add(key)
            kept.append(record)
            if len(kept) == n:
                break
    return kept


def iter_all_prompts(max_operand: int = 9, phrasings: int = 1) -> Iterator[dict]:
    """Every problem of the task once per phrasing, with its reference answer (prompt-only rows)."""
    for k in range(phrasings):
        for a in range(max_operand + 1):
            for b in range(max_operand + 1):
                suffix = f"-{k}" if k else ""
                yield {
                    "id": f"demo-prompt-{a}-{b}{suffix}",
                    "prompt": make_prompt(a, b, k),
                    "metadata": {"answer": a + b},
                }


def write_demo_dataset(
    out_dir: str | Path,
    n_pairs: int = 2000,
    n_scored: int = 500,
    seed: int = 0,
    eval_fraction: float = 0.1,
    phrasings: int = 1,
    task: str = "addition",
) -> dict[str, Path]:
    """Write the demo data set: deterministic, built in, no downloads.

    ``demo.jsonl`` mixes distinct pairwise rows, scored feedback and one prompt-only row per
    problem (reference answer in metadata); it is what ``data add`` versions, and the
    prompt-hash split of the snapshot holds out whole problems for evaluation. The same
    rows are also written per shape, plus ``eval.jsonl``: the held-out problems with answers.
    The space of distinct pairs is small (single-digit sums): about 2,500 per phrasing.
    """
    from alignflow.data.split import assign_split

    out = Path(out_dir)
    if task == "word_problems":  # the task for real pretrained models (data/word_problems.py)
        from alignflow.data import word_problems

        problems = word_problems.all_problems(seed=seed)
        pair_rows = word_problems.iter_pairs(problems, n_pairs * 20, seed=seed)
        scored_rows = word_problems.iter_scored(problems, n_scored * 20, seed=seed + 1)
        prompts = list(word_problems.iter_prompts(problems))
    else:
        pair_rows = iter_demo_pairs(n_pairs * 20, seed=seed, phrasings=phrasings)
        scored_rows = iter_demo_scored(n_scored * 20, seed=seed + 1, phrasings=phrasings)
        prompts = list(iter_all_prompts(phrasings=phrasings))
    pairs = _unique(pair_rows, n_pairs, ("prompt", "chosen", "rejected"))
    scored = _unique(scored_rows, n_scored, ("prompt", "response", "score"))
    held_out = [p for p in prompts if assign_split(p["prompt"], eval_fraction, seed) == "eval"]
    return {
        "demo": _write_jsonl(out / "demo.jsonl", iter([*pairs, *scored, *prompts])),
        "pairs": _write_jsonl(out / "pairs.jsonl", iter(pairs)),
        "scored": _write_jsonl(out / "scored.jsonl", iter(scored)),
        "prompts": _write_jsonl(out / "prompts.jsonl", iter(prompts)),
        "eval": _write_jsonl(out / "eval.jsonl", iter(held_out)),
    }


def write_configured_demo(config: DataConfig, out_dir: str | Path, seed: int = 0) -> Path:
    """The demo input a data config asks for (its rows, scored rows, split, phrasings and
    task), drawn with ``seed``, in ``out_dir``; the path of its ``demo.jsonl``."""
    return write_demo_dataset(
        out_dir,
        n_pairs=config.demo_rows,
        n_scored=config.demo_scored_rows,
        seed=seed,
        eval_fraction=config.eval_fraction,
        phrasings=config.demo_phrasings,
        task=config.demo_task,
    )["demo"]


def write_demo_source(config: DataConfig, repo_dir: str | Path) -> Path:
    """The demo input a data config asks for, written where every run of a repo finds it.

    The path is relative to the repo (``.alignflow/demo-input``), and the manifest stores it
    that way, so the snapshot's bytes and its DVC md5 are the same in every clone.
    """
    return write_configured_demo(config, Path(repo_dir) / ".alignflow" / "demo-input")
