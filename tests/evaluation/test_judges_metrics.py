import pytest

from alignflow.data.answers import format_answer
from alignflow.evaluation import metrics
from alignflow.evaluation.judges import AnswerJudge, Judge, RewardModelJudge, win_rate


def length_scorer(prompts, completions):
    return [float(len(c)) for c in completions]


def test_reward_model_judge_prefers_the_higher_score_and_calls_ties():
    judge = RewardModelJudge(length_scorer, tie_margin=1.0)
    verdicts = judge.compare(["p"] * 3, ["aaaa", "a", "ab"], ["a", "aaaa", "a"])
    assert verdicts == [1.0, 0.0, 0.5]
    assert isinstance(judge, Judge)


def test_answer_judge_uses_reference_answers_and_skips_rows_without_one():
    judge = AnswerJudge()
    verdicts = judge.compare(
        ["What is 3 plus 4?"] * 3,
        [format_answer(7), "I think 7", format_answer(7)],
        [format_answer(8), format_answer(7), format_answer(1)],
        [{"answer": 7}, {"answer": 7}, {}],
    )
    assert verdicts == [1.0, 0.0, None]
    assert win_rate(verdicts) == 0.5
    assert win_rate([None]) is None


def test_judges_reject_mismatched_lengths():
    with pytest.raises(ValueError, match="equal lengths"):
        AnswerJudge().compare(["p"], ["a", "b"], ["c"])


def test_normalised_reward_is_zero_at_rejected_and_one_at_chosen():
    chosen, rejected = [2.0, 4.0], [0.0, 0.0]
    assert metrics.normalised_mean_reward([0.0], chosen, rejected) == 0.0
    assert metrics.normalised_mean_reward([3.0, 3.0], chosen, rejected) == 1.0
    assert metrics.normalised_mean_reward([1.5], chosen, rejected) == 0.5
    assert metrics.normalised_mean_reward([1.0], [1.0], [1.0]) is None


def test_length_growth_and_answer_accuracy():
    assert metrics.length_growth_ratio([10, 30], [10, 10]) == 2.0
    completions = [format_answer(3), "I think 3", format_answer(5)]
    assert metrics.answer_accuracy(completions, [{"answer": 3}, {"answer": 3}, {}]) == 0.5
    assert metrics.answer_accuracy(completions, [{}, {}, {}]) is None


def test_reward_model_metrics_detect_a_reversed_model():
    good = metrics.reward_model_metrics([2.0, 3.0, 1.0], [0.0, 1.0, 2.0])
    assert good["eval/reward_accuracy"] == pytest.approx(2 / 3)
    assert good["eval/reward_margin"] == pytest.approx(1.0)
    reversed_ = metrics.reward_model_metrics([0.0, 1.0, 2.0], [2.0, 3.0, 1.0])
    assert reversed_["eval/reward_accuracy"] == pytest.approx(1 / 3)
    assert 0.0 <= good["eval/reward_ece"] <= 1.0
