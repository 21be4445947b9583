from __future__ import annotations

import json

from alignflow.data.answers import task_accuracy
from alignflow.data.demo import write_demo_dataset
from alignflow.data.split import assign_split, split_records
from alignflow.data.validation import validate_paths


def test_split_is_by_prompt_and_deterministic():
    records = [{"prompt": f"q{i % 50}", "chosen": str(i)} for i in range(500)]
    splits = split_records(records, eval_fraction=0.2, seed=3)
    train_prompts = {r["prompt"] for r in splits["train"]}
    eval_prompts = {r["prompt"] for r in splits["eval"]}
    assert not train_prompts & eval_prompts
    assert 0 < len(eval_prompts) < 50
    assert split_records(list(reversed(records)), 0.2, seed=3)["eval"][0]["prompt"] in eval_prompts
    assert [assign_split(f"q{i}", 0.2, 3) for i in range(50)] == [
        assign_split(f"q{i}", 0.2, 3) for i in range(50)
    ]


def test_demo_dataset_is_deterministic_clean_and_holds_out_answers(tmp_path):
    first = write_demo_dataset(tmp_path / "a")
    second = write_demo_dataset(tmp_path / "b")
    assert all(first[k].read_bytes() == second[k].read_bytes() for k in first)
    validated = validate_paths(first["demo"])
    assert validated.passed and validated.report["quarantined"] == 0
    assert validated.report["kinds"] == {"pair": 2000, "prompt": 100, "scored": 500}
    held_out = [json.loads(line) for line in first["eval"].read_text().splitlines()]
    assert held_out and all(isinstance(r["metadata"]["answer"], int) for r in held_out)
    pairs = [json.loads(line) for line in first["pairs"].read_text().splitlines()]
    # the noisy chosen side keeps SFT on chosen below full task accuracy
    chosen_accuracy = sum(task_accuracy(p["chosen"], p["metadata"]["answer"]) for p in pairs) / len(pairs)
    assert 0.3 < chosen_accuracy < 0.9
