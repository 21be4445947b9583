"""Rows that rank several responses to one prompt: RewardBench 2 and RM-Bench lists of chosen and
rejected answers, responses with scores or ranks beside them, and response records that carry
their own (UltraFeedback's ``completions``, Nectar's ``answers``)."""

from __future__ import annotations

import json
import re

import pytest

from alignflow.data.checks import check_record, record_keys
from alignflow.data.config import DataConfig
from alignflow.data.normalize import RowError, normalize_row
from alignflow.data.pairing import best_responses, load_pairs, pairs_from_ranked
from alignflow.data.snapshot import load_split, write_split
from alignflow.data.validation import validate_paths
from alignflow.training.sft import sft_examples

REWARDBENCH2 = {
    "id": "rb2-1",
    "prompt": "What is 2 + 2?",
    "chosen": ["2 + 2 = 4."],
    "rejected": ["2 + 2 = 5.", "22", "Four hundred."],
    "subset": "Math",
    "num_correct": 1,
}
RM_BENCH = {
    "prompt": "Name a prime.",
    "chosen": ["7", "7 is prime.", "**7** is a prime number."],
    "rejected": ["9", "9 is prime.", "**9** is a prime number."],
    "domain": "math",
}
NECTAR = {
    "prompt": "\n\nHuman: Say hi\n\nAssistant:",
    "answers": [
        {"answer": "Hi there!", "model": "m1", "rank": 2},
        {"answer": "Hello! How can I help?", "model": "m2", "rank": 1},
        {"answer": "Go away.", "model": "m3", "rank": 3},
    ],
}
ULTRAFEEDBACK = {
    "instruction": "Write a haiku.",
    "completions": [
        {"response": "Old pond, frog jumps in.", "overall_score": 7.5, "model": "a"},
        {"response": "No.", "overall_score": 2, "model": "b"},
    ],
}


def _ranked(row, mapping=None, **options):
    record = normalize_row(row, mapping, **options)
    check_record(record, max_chars=1000)
    return record


def test_lists_of_chosen_and_rejected_answers_are_one_ranked_row():
    record = _ranked(REWARDBENCH2)
    assert record["kind"] == "ranked"
    assert record["responses"] == ["2 + 2 = 4.", "2 + 2 = 5.", "22", "Four hundred."]
    assert record["scores"] == [1.0, 0.0, 0.0, 0.0]
    assert record["metadata"] == {"subset": "Math", "num_correct": 1}
    pairs = pairs_from_ranked([record])
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [
        ("2 + 2 = 4.", r) for r in REWARDBENCH2["rejected"]
    ]
    assert {p["metadata"]["subset"] for p in pairs} == {"Math"}
    # RM-Bench: every chosen style against every rejected one, never chosen against chosen
    rm = pairs_from_ranked([_ranked(RM_BENCH)])
    assert len(rm) == 9 and {p["chosen"] for p in rm} == set(RM_BENCH["chosen"])
    assert {p["rejected"] for p in rm} == set(RM_BENCH["rejected"])


def test_a_single_chosen_text_beside_a_list_of_rejected_ones():
    record = _ranked({"prompt": "p", "chosen": "good", "rejected": ["bad", "worse"]})
    assert record["responses"] == ["good", "bad", "worse"] and record["scores"] == [1.0, 0.0, 0.0]


def test_response_records_with_ranks_or_scores_keep_their_other_fields():
    nectar = _ranked(NECTAR, {"answers": "responses"})
    assert nectar["scores"] == [-2.0, -1.0, -3.0]  # rank 1 is best: the highest score
    assert best_responses(nectar) == ["Hello! How can I help?"]
    assert nectar["metadata"]["response_details"] == [{"model": "m1"}, {"model": "m2"}, {"model": "m3"}]
    pairs = pairs_from_ranked([nectar])
    assert len(pairs) == 3
    assert ("Hello! How can I help?", "Go away.") in {(p["chosen"], p["rejected"]) for p in pairs}
    assert ("Go away.", "Hi there!") not in {(p["chosen"], p["rejected"]) for p in pairs}

    uf = _ranked(ULTRAFEEDBACK, {"completions": "responses"})
    assert uf["prompt"] == "Write a haiku." and uf["scores"] == [7.5, 2.0]
    assert pairs_from_ranked([uf])[0]["chosen"] == "Old pond, frog jumps in."


def test_response_fields_name_keys_the_defaults_do_not_know():
    row = {"prompt": "p", "responses": [{"body": "x", "votes": 3}, {"body": "y", "votes": 9}]}
    with pytest.raises(
        RowError, match=r"no text key .*its keys: \['body', 'votes'\].*data.response_fields.text"
    ):
        normalize_row(row)
    record = _ranked(row, response_fields={"text": "body", "score": "votes"})
    assert best_responses(record) == ["y"]
    by_rank = _ranked(row, response_fields={"text": "body", "rank": "votes"})
    assert best_responses(by_rank) == ["x"]
    with pytest.raises(ValueError, match="a score or a rank, not both"):
        DataConfig(response_fields={"text": "body", "score": "votes", "rank": "votes"})


def test_responses_with_scores_or_ranks_beside_them():
    assert _ranked({"prompt": "p", "responses": ["a", "b", "c"], "scores": [0.1, 0.9, 0.5]})["scores"] == [
        0.1,
        0.9,
        0.5,
    ]
    assert best_responses(_ranked({"prompt": "p", "responses": ["a", "b"], "ranks": [2, 1]})) == ["b"]


@pytest.mark.parametrize(
    ("row", "code", "field", "message"),
    [
        ({"prompt": "p", "responses": ["a", "b"]}, "missing_field", "scores", "'scores' or 'ranks'"),
        (
            {"prompt": "p", "responses": ["a", "b"], "scores": [1]},
            "score_invalid",
            "scores",
            "1 values for 2",
        ),
        (
            {"prompt": "p", "responses": ["a", "b"], "scores": [1, "high"]},
            "score_invalid",
            "scores",
            "scores[1]",
        ),
        (
            {"prompt": "p", "responses": ["a", "b"], "scores": [1, float("nan")]},
            "score_invalid",
            "scores",
            "finite",
        ),
        ({"prompt": "p", "responses": ["a", "b"], "ranks": [True, 2]}, "score_invalid", "ranks", "ranks[0]"),
        ({"prompt": "p", "responses": ["a", "b"], "scores": [3, 3]}, "tie", "scores", "rank equal"),
        ({"prompt": "p", "responses": ["a"], "scores": [3]}, "missing_field", "responses", "fewer than two"),
        (
            {"prompt": "p", "responses": "a", "scores": [3]},
            "non_string_field",
            "responses",
            "expected a list",
        ),
        ({"prompt": "p", "chosen": [], "rejected": ["a"]}, "missing_field", "chosen", "holds no response"),
        (
            {"prompt": "p", "chosen": ["a"], "rejected": ["b", 7]},
            "non_string_field",
            "rejected",
            "'rejected[1]' is int",
        ),
        ({"chosen": ["a"], "rejected": ["b"]}, "missing_field", "prompt", "'prompt' is missing"),
        (
            {"prompt": "p", "responses": [{"answer": "a", "rank": 1}, {"answer": "b"}]},
            "score_invalid",
            "responses",
            "responses[1].rank None",
        ),
    ],
)
def test_a_ranking_that_cannot_be_read_names_its_field(row, code, field, message):
    with pytest.raises(RowError, match=re.escape(message)) as caught:
        normalize_row(row)
    assert (caught.value.code, caught.value.field) == (code, field)


@pytest.mark.parametrize(
    ("row", "code", "message"),
    [
        (
            {"prompt": "p", "chosen": ["ok"], "rejected": ["fine", "bad\x07"]},
            "control_chars",
            r"responses\[2\]",
        ),
        ({"prompt": "p", "chosen": ["ok"], "rejected": ["  "]}, "empty_field", r"responses\[1\]"),
        ({"prompt": "p", "chosen": ["ok"], "rejected": ["x" * 1001]}, "too_long_chars", "1001 characters"),
        (
            {"prompt": "p", "chosen": ["same"], "rejected": ["same", "same"]},
            "chosen_equals_rejected",
            "identical",
        ),
        (
            {"prompt": "p", "chosen": ["ok"], "rejected": [[{"role": "assistant", "content": "no"}]]},
            "bad_chat_structure",
            "mixes plain text",
        ),
    ],
)
def test_each_response_of_a_ranked_row_is_checked(row, code, message):
    record = normalize_row(row)
    with pytest.raises(RowError, match=message) as caught:
        check_record(record, max_chars=1000)
    assert caught.value.code == code


def test_chat_responses_and_the_snapshot_round_trip(tmp_path):
    chat = {
        "prompt": [{"role": "user", "content": "Hi?"}],
        "chosen": [[{"role": "assistant", "content": "Hello!"}]],
        "rejected": [[{"role": "assistant", "content": "What."}], [{"role": "assistant", "content": "Bye."}]],
    }
    records = [_ranked(chat), _ranked(REWARDBENCH2), _ranked(NECTAR, {"answers": "responses"})]
    records.append(normalize_row({"prompt": "q", "chosen": "a", "rejected": "b"}))
    write_split(tmp_path, "train", records)
    back = load_split(tmp_path, "train", kind="ranked")
    assert [(r["prompt"], r["responses"], r["scores"]) for r in back] == [
        (r["prompt"], r["responses"], r["scores"]) for r in records[:3]
    ]
    assert back[2]["metadata"]["response_details"][1] == {"model": "m2"}
    pairs = load_pairs(tmp_path, "train")
    assert len(pairs) == 1 + 2 + 3 + 3  # the text pair, then the ranked rows' pairs
    assert pairs[1]["chosen"] == [{"role": "assistant", "content": "Hello!"}]
    completions = [e["completion"] for e in sft_examples(tmp_path, "train", 0.5)]
    assert completions == [
        "a",
        [{"role": "assistant", "content": "Hello!"}],
        "2 + 2 = 4.",
        "Hello! How can I help?",
    ]


def test_a_benchmark_file_of_ranked_rows_accounts_for_every_row(tmp_path):
    rows = [REWARDBENCH2, dict(REWARDBENCH2), RM_BENCH, {"prompt": "p", "chosen": ["x"], "rejected": ["x"]}]
    rows += [
        {"prompt": f"q{i}", "chosen": [f"good {i}"], "rejected": [f"bad {i}", f"worse {i}"]} for i in range(6)
    ]
    path = tmp_path / "rb2.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    validated = validate_paths(path, DataConfig(max_bad_fraction=1.0))
    report = validated.report
    assert report["input_rows"] == 10 and report["kept"] + report["quarantined"] == 10
    assert report["kinds"] == {"ranked": 8}
    assert report["counts_by_reason"] == {"duplicate_exact": 1, "chosen_equals_rejected": 1}
    assert {(i.code, i.row) for i in validated.issues} == {
        ("duplicate_exact", 2),
        ("chosen_equals_rejected", 4),
    }  # lines


def test_ranked_rows_differing_only_in_their_order_are_not_duplicates():
    a = normalize_row({"prompt": "p", "responses": ["x", "y"], "scores": [1, 0]})
    b = normalize_row({"prompt": "p", "responses": ["x", "y"], "scores": [0, 1]})
    assert record_keys(a) != record_keys(b)
    assert record_keys(a) == record_keys(normalize_row({"prompt": "p", "chosen": ["x"], "rejected": ["y"]}))
