"""Scoring a benchmark file: validation on the way in, length bias, subsets, the API fix."""

import json

import pytest

from alignflow.evaluation import benchmark
from alignflow.evaluation.evaluate import evaluate_reward_model


def length_scorer(prompts, completions):
    """A reward model that has learnt only that longer is better."""
    return [float(len(c)) for c in completions]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def pairs_with_lengths(n_longer: int, n_shorter: int) -> list[dict]:
    rows = []
    for i in range(n_longer):
        rows.append({"prompt": f"q{i}", "chosen": f"a long, careful answer {i}", "rejected": f"no {i}"})
    for i in range(n_shorter):
        rows.append({"prompt": f"r{i}", "chosen": f"yes {i}", "rejected": f"a long, rambling reply {i}"})
    return rows


def test_length_bias_of_a_scorer_that_rewards_length():
    chosen_lengths, rejected_lengths = [30, 40, 50, 5, 6], [10, 12, 14, 20, 25]
    bias = benchmark.length_bias(chosen_lengths, rejected_lengths, chosen_lengths, rejected_lengths)
    assert bias.chosen_longer.value == 1.0 and bias.chosen_longer.n == 3
    assert bias.chosen_shorter.value == 0.0 and bias.chosen_shorter.n == 2
    assert bias.gap == 1.0
    assert bias.spearman_reward_length == pytest.approx(1.0)
    assert bias.responses == 10
    # a scorer that ignores length: no gap, no correlation
    flat = benchmark.length_bias([1.0] * 5, [0.0] * 5, chosen_lengths, rejected_lengths)
    assert flat.gap == 0.0
    assert flat.spearman_reward_length < 0.5


def test_spearman_is_rank_based_and_none_when_constant():
    assert benchmark.spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)
    assert benchmark.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert benchmark.spearman([1, 1, 1], [1, 2, 3]) is None


def test_reward_report_on_a_file_with_subsets(tmp_path):
    rows = pairs_with_lengths(6, 4)
    for i, row in enumerate(rows):
        row["category"] = "easy" if i % 2 else "hard"
    bench = benchmark.read_benchmark(write_jsonl(tmp_path / "bench.jsonl", rows))
    assert bench.name == "bench"
    report = benchmark.evaluate_reward_benchmark(length_scorer, bench, subset_column="category")
    assert report["accuracy"]["value"] == pytest.approx(0.6) and report["accuracy"]["n"] == 10
    assert 0.0 <= report["accuracy"]["low"] < 0.6 < report["accuracy"]["high"] <= 1.0
    bias = report["length_bias"]
    assert bias["chosen_longer"]["value"] == 1.0 and bias["chosen_shorter"]["value"] == 0.0
    assert bias["gap"] == 1.0 and bias["spearman_reward_length"] > 0.8
    groups = report["subsets"]["groups"]
    assert sorted(groups) == ["easy", "hard"] and sum(g["pairs"] for g in groups.values()) == 10
    assert report["metrics"]["reward_accuracy"] == pytest.approx(0.6)
    assert report["metrics"]["subset/easy/reward_accuracy/n"] == 5.0
    paths = benchmark.write_benchmark_report(report, tmp_path / "out")
    assert json.loads(paths["json"].read_text())["rows"]["scored"] == 10
    assert "## By `category`" in paths["markdown"].read_text()


def test_bad_rows_are_quarantined_not_scored(tmp_path):
    rows = [
        *pairs_with_lengths(3, 0),
        {"prompt": "q", "chosen": "fine"},
        {"prompt": "q", "chosen": True, "rejected": "no"},
        {"prompt": "q", "chosen": "   ", "rejected": "no"},
    ]
    bench = benchmark.read_benchmark(write_jsonl(tmp_path / "mixed.jsonl", rows))
    report = benchmark.evaluate_reward_benchmark(length_scorer, bench)
    assert report["rows"]["read"] == 6 and report["rows"]["scored"] == 3
    assert report["rows"]["quarantined_by_reason"] == {
        "empty_field": 1,
        "missing_field": 1,
        "non_string_field": 1,
    }
    where = {(q["row"], q["field"]) for q in report["rows"]["quarantined_rows"]}
    assert where == {(4, "rejected"), (5, "chosen"), (6, "chosen")}


def test_a_file_without_valid_pairs_is_refused(tmp_path):
    bench = benchmark.read_benchmark(write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "q", "chosen": 1}]))
    with pytest.raises(ValueError, match="no valid pair rows"):
        benchmark.evaluate_reward_benchmark(length_scorer, bench)


def test_max_rows_stops_reading(tmp_path):
    bench = benchmark.read_benchmark(write_jsonl(tmp_path / "b.jsonl", pairs_with_lengths(8, 0)), max_rows=3)
    assert bench.validation["input_rows"] == 3 and len(bench.pairs()) == 3


def test_answer_score_numbers_and_text():
    assert benchmark.answer_score("The answer is 7.", 7) == 1.0
    assert benchmark.answer_score("I think 7", "7") == 0.0  # the demo task's required format
    assert benchmark.answer_score("It is Paris, France.", "paris") == 1.0
    assert benchmark.answer_score("It is Parisian.", "Paris") == 0.0


def test_answer_score_reads_gsm8k_style_final_answers():
    """GSM8K references are worked solutions ending "#### N"; completions may state "#### N" too."""
    solution = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72"
    assert benchmark.answer_score("48 + 24 = 72 clips.\n#### 72", solution) == 1.0
    assert benchmark.answer_score("The answer is 72.", solution) == 1.0
    assert benchmark.answer_score("48 + 24 = 72, so I think 72", solution) == 0.0  # no stated answer
    assert benchmark.answer_score("#### 71", solution) == 0.0
    assert benchmark.answer_score("The answer is 1234.", "#### 1,234") == 1.0  # thousands separators
    assert benchmark.answer_score("#### 1,234", 1234) == 1.0
    heading = "#### Causes\nMostly the seasons and the tilt of the earth."  # Markdown, not a final answer
    assert benchmark.reference_answer(heading) == heading
    assert benchmark.answer_score("It is the tilt of the earth, mostly.", "#### 42\n") == 0.0
    assert benchmark.answer_score("#### 42", "The result:\n#### 42\n") == 1.0


def test_evaluate_reward_model_normalises_raw_rows_and_names_a_bad_one():
    """The Python API used to raise a bare TypeError on a boolean response."""
    hh = {"chosen": "\n\nHuman: hi\n\nAssistant: hello there", "rejected": "\n\nHuman: hi\n\nAssistant: go"}
    plain = {"prompt": "q", "chosen": "long one", "rejected": "no"}
    report = evaluate_reward_model(length_scorer, [plain, hh])
    assert report.metrics["eval/reward_accuracy"] == 1.0 and report.metrics["eval/reward_pairs"] == 2.0
    bad = [{"prompt": "q", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": True, "rejected": "no"}]
    with pytest.raises(ValueError, match=r"records\[1\] field 'chosen': non_string_field"):
        evaluate_reward_model(length_scorer, bad)
    with pytest.raises(ValueError, match=r"records\[0\] field 'rejected': missing_field"):
        evaluate_reward_model(length_scorer, [{"prompt": "q", "chosen": "a"}])


def test_a_subset_column_no_row_has_is_noted(tmp_path):
    bench = benchmark.read_benchmark(write_jsonl(tmp_path / "b.jsonl", pairs_with_lengths(2, 1)))
    report = benchmark.evaluate_reward_benchmark(length_scorer, bench, subset_column="nope")
    assert list(report["subsets"]["groups"]) == [benchmark.MISSING_SUBSET]
    assert report["notes"] == ["no scored row has a value in column 'nope'"]


def test_rewards_that_are_not_numbers_are_counted_and_noted(tmp_path):
    def diverged(prompts, completions):
        return [float("nan") if "long" in c else 1.0 for c in completions]

    bench = benchmark.read_benchmark(write_jsonl(tmp_path / "bench.jsonl", pairs_with_lengths(3, 2)))
    report = benchmark.evaluate_reward_benchmark(diverged, bench)
    assert report["nonfinite_rewards"] == 5 and report["accuracy"]["value"] == 0.0
    assert report["ece"] != report["ece"]  # NaN: not measurable, never 0
    assert any("5 of 10 rewards are not finite" in note for note in report["notes"])


def helpsteer_rows() -> list[dict]:
    """HelpSteer2's shape: responses rated 0-4, two or more per prompt, one lone, one tie."""
    rows = []
    for i in range(4):
        for rating in (0, 2, 4):
            answer = "word " * (rating + 1) + str(i)
            rows.append({"prompt": f"q{i}", "response": answer, "helpfulness": rating})
    rows.append({"prompt": "lone", "response": "only answer", "helpfulness": 3})
    rows += [{"prompt": "tied", "response": f"same score {k}", "helpfulness": 1} for k in range(2)]
    return rows


def test_scored_responses_to_one_prompt_are_paired_and_correlated(tmp_path):
    from alignflow.data.config import DataConfig

    path = write_jsonl(tmp_path / "helpsteer.jsonl", helpsteer_rows())
    config = DataConfig(column_mapping={"helpfulness": "score"}, score_range=(0, 4))
    bench = benchmark.read_benchmark(path, config)
    calls: list[int] = []

    def counting(prompts, completions):
        calls.append(len(completions))
        return length_scorer(prompts, completions)

    report = benchmark.evaluate_reward_benchmark(counting, bench)
    assert report["pairs"] == 12 and report["accuracy"]["value"] == 1.0  # 3 ratings -> 3 pairs per prompt
    scored = report["scored_responses"]
    assert (scored["responses"], scored["paired"]) == (15, 12)
    assert scored["spearman_reward_score"] > 0.9
    assert report["metrics"]["scored/spearman_reward_score"] == scored["spearman_reward_score"]
    rows = report["rows"]
    assert (rows["read"], rows["scored"], rows["valid_not_scored"], rows["quarantined"]) == (15, 12, 3, 0)
    assert "12 pairs formed from 12 of 15 scored responses" in report["notes"][0]
    # each distinct response is scored once per evaluation: the 12 paired ones for the pairs,
    # then only the 3 left over (lone and tied) for the correlation
    assert calls == [12, 3]

    shortest_wins = benchmark.evaluate_reward_benchmark(lambda p, c: [-x for x in length_scorer(p, c)], bench)
    assert shortest_wins["accuracy"]["value"] == 0.0
    assert shortest_wins["scored_responses"]["spearman_reward_score"] < -0.9


def test_scores_off_the_declared_scale_are_quarantined(tmp_path):
    from alignflow.data.config import DataConfig

    path = write_jsonl(tmp_path / "helpsteer.jsonl", helpsteer_rows())
    bench = benchmark.read_benchmark(path, DataConfig(column_mapping={"helpfulness": "score"}))
    assert bench.validation["counts_by_reason"] == {"score_out_of_range": 9}  # ratings 2, 4 and 3 on [0, 1]
    assert "data.score_range" in bench.issues[0].message


def test_pairs_scored_equal_are_counted_wrong_and_noted(tmp_path):
    bench = benchmark.read_benchmark(write_jsonl(tmp_path / "b.jsonl", pairs_with_lengths(3, 2)))
    report = benchmark.evaluate_reward_benchmark(lambda prompts, completions: [0.5] * len(completions), bench)
    assert report["tied_pairs"] == 5 and report["accuracy"]["value"] == 0.0
    assert report["notes"] == [
        "5 of 5 pairs got the same reward for both responses: they count as wrong (a model whose "
        "rewards do not tell responses apart scores 0, not 0.5)"
    ]
    assert benchmark.evaluate_reward_benchmark(length_scorer, bench)["tied_pairs"] == 0


def rewardbench2_rows() -> list[dict]:
    """RewardBench 2's shape: one chosen and three rejected answers per prompt, in subsets.

    For a scorer that rewards length, the 'long' subset's chosen answer is the longest of its
    row (right) and the 'short' subset's is the shortest (wrong, though it still beats one)."""
    rows = []
    for i in range(4):
        rows.append(
            {
                "prompt": f"long {i}",
                "chosen": [f"a careful, complete answer {i}"],
                "rejected": [f"no {i}", f"maybe {i}", f"a longish reply {i}"],
                "subset": "long",
            }
        )
        rows.append(
            {
                "prompt": f"short {i}",
                "chosen": [f"yes {i}"],
                "rejected": [f"y {i}", f"a wordy reply {i}", f"a very wordy reply {i}"],
                "subset": "short",
            }
        )
    return rows


def test_ranked_rows_report_pairwise_and_best_of_n_accuracy(tmp_path):
    bench = benchmark.read_benchmark(write_jsonl(tmp_path / "rb2.jsonl", rewardbench2_rows()))
    calls: list[int] = []

    def counting(prompts, completions):
        calls.append(len(completions))
        return length_scorer(prompts, completions)

    report = benchmark.evaluate_reward_benchmark(counting, bench, subset_column="subset")
    assert report["pairs"] == 24 and report["rows"]["scored"] == 8
    assert report["accuracy"]["value"] == pytest.approx((12 + 4) / 24)  # short rows: 1 of 3 pairs right
    ranked = report["ranked"]
    assert (ranked["rows"], ranked["responses"]) == (8, 32)
    assert ranked["best_of_n_accuracy"]["value"] == 0.5 and ranked["best_of_n_accuracy"]["n"] == 8
    assert calls == [32], "each response is scored once, for the pairs and best-of-n alike"
    groups = report["subsets"]["groups"]
    assert groups["long"]["best_of_n_accuracy"]["value"] == 1.0
    assert groups["short"]["best_of_n_accuracy"]["value"] == 0.0
    assert groups["short"]["accuracy"]["value"] == pytest.approx(1 / 3)
    metrics = report["metrics"]
    assert metrics["ranked/best_of_n_accuracy"] == 0.5 and metrics["ranked/best_of_n_accuracy/n"] == 8
    assert metrics["subset/short/best_of_n_accuracy"] == 0.0
    markdown = benchmark.to_markdown(report)
    assert "| best of n | 95% interval |" in markdown and "| short | 12 |" in markdown
    assert any("24 pairs from 8 ranked rows" in note for note in report["notes"])


def test_best_of_n_counts_ties_and_nonfinite_rewards_as_wrong():
    rows = [
        {"prompt": "p", "responses": ["a", "b", "c"], "scores": [1.0, 0.0, 0.0]},
        {"prompt": "q", "responses": ["a", "b", "c"], "scores": [1.0, 0.0, 0.0]},
        {"prompt": "r", "responses": ["a", "b", "c"], "scores": [1.0, 1.0, 0.0]},
    ]
    rewards = {("p", "a"): 2.0, ("p", "b"): 2.0, ("p", "c"): 0.0}  # a tie with a worse answer
    rewards |= {("q", "a"): 1.0, ("q", "b"): 0.5, ("q", "c"): float("nan")}  # max() skips a NaN after 0.5
    rewards |= {("r", "a"): 0.0, ("r", "b"): 3.0, ("r", "c"): 1.0}  # either best one may win
    score = benchmark.ScoreOnce(lambda ps, cs: [rewards[(p, c)] for p, c in zip(ps, cs, strict=True)])
    assert benchmark.best_of_n(score, rows) == [0.0, 0.0, 1.0]
