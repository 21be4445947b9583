"""Environments: episode mechanics, stop sequences, multi-objective metrics, judges, built-ins."""

from __future__ import annotations

import pytest
import torch

from alignflow.models import load_causal_lm
from alignflow.rl.environments import (
    MultiObjectiveRewardEnv,
    PreferenceComparisonEnv,
    TextGenerationEnv,
    Trajectory,
    create_code_generation_env,
    create_math_problem_env,
    style_reward,
    syntax_reward,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_causal_lm(tiny_model_dir)[1]


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_episode_ends_at_stop_sequence_and_scores_the_text_before_it(tokenizer):
    seen = []

    def reward(prompt, generated, full_text):
        seen.append((prompt, generated, full_text))
        return float(len(generated))

    env = TextGenerationEnv(tokenizer, ["What is 1 plus 2?"], reward_fn=reward, stop_sequences=["."])
    obs = env.reset()
    assert obs.prompt == "What is 1 plus 2?"
    assert obs.input_ids.tolist() == ids(tokenizer, "What is 1 plus 2?")
    tokens = ids(tokenizer, " The answer is 3. Extra words here")
    first = env.step(torch.tensor(tokens[:1]))
    assert not first.done and first.reward == 0.0
    result = env.step(torch.tensor(tokens[1:]))
    assert result.done and result.info["stop_reason"] == "stop_sequence"
    assert result.info["generated"] == " The answer is 3."
    assert result.info["consumed"] < len(tokens) - 1  # trailing words were not consumed
    assert seen == [("What is 1 plus 2?", " The answer is 3.", "What is 1 plus 2? The answer is 3.")]
    assert result.reward == len(" The answer is 3.")
    assert "The answer is 3." in env.render()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(tokens[:1])


def test_eos_and_max_length_end_episodes(tokenizer):
    env = TextGenerationEnv(
        tokenizer, ["What is 1 plus 2?"], max_length=len(ids(tokenizer, "What is 1 plus 2?")) + 3
    )
    env.reset()
    assert env.step([tokenizer.eos_token_id]).info["stop_reason"] == "eos"
    env.reset()
    result = env.step(ids(tokenizer, " I think that it is 3 or 4 maybe"))
    assert result.done and result.info["stop_reason"] == "max_length" and result.info["consumed"] == 3


def test_step_before_reset_and_bad_arguments_are_clear_errors(tokenizer):
    env = TextGenerationEnv(tokenizer, ["a prompt"])
    with pytest.raises(RuntimeError, match="reset"):
        env.step([1])
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        TextGenerationEnv(tokenizer, ["ok", ""])
    with pytest.raises(ValueError, match="temperature"):
        TextGenerationEnv(tokenizer, ["ok"], temperature=0)


def test_evaluate_scores_a_response_without_touching_the_current_episode(tokenizer):
    env = create_math_problem_env(tokenizer, num_problems=5)
    obs = env.reset()
    answer = obs.metadata["answer"]
    current = env.render()
    result = env.evaluate(obs, ids(tokenizer, f" The answer is {answer}.") + [tokenizer.eos_token_id])
    assert result.done and result.reward == pytest.approx(1.5)
    assert env.render() == current


def test_temperature_sharpens_sampling(tokenizer):
    logits = torch.tensor([2.0, 1.0, 0.0])
    gen = torch.Generator().manual_seed(0)
    cold = TextGenerationEnv(tokenizer, ["p"], temperature=0.05)
    hot = TextGenerationEnv(tokenizer, ["p"], temperature=5.0)
    cold_draws = [int(cold.sample_action(logits, gen)) for _ in range(200)]
    hot_draws = [int(hot.sample_action(logits, gen)) for _ in range(200)]
    assert cold_draws.count(0) == 200
    assert hot_draws.count(0) < 150 and hot_draws.count(2) > 20


def test_multi_objective_env_reports_every_component_and_weights_the_total(tokenizer):
    env = MultiObjectiveRewardEnv(
        tokenizer,
        ["What is 2 plus 2?"],
        reward_components={
            "correctness": lambda p, g, f: 1.0 if "4" in g else 0.0,
            "formatting": lambda p, g, f: 0.5 if g.strip().startswith("The answer") else 0.0,
            "brevity": lambda p, g, f: 1.0 / max(len(g.split()), 1),
        },
        reward_weights={"correctness": 1.0, "formatting": 0.1},
    )
    env.reset()
    result = env.step(ids(tokenizer, " The answer is 4.") + [tokenizer.eos_token_id])
    m = result.metrics
    assert m["reward_correctness"] == 1.0 and m["reward_formatting"] == 0.5
    assert m["reward_brevity"] == pytest.approx(0.25)
    assert result.reward == pytest.approx(1.0 + 0.1 * 0.5 + 1.0 * 0.25) == m["reward"]
    with pytest.raises(ValueError, match="unknown components"):
        MultiObjectiveRewardEnv(
            tokenizer, ["p"], reward_components={"a": lambda *x: 0}, reward_weights={"b": 1}
        )


def test_math_env_rewards_correct_formatted_answers_most(tokenizer):
    env = create_math_problem_env(tokenizer, num_problems=3)
    obs = env.reset()
    answer = obs.metadata["answer"]
    scores = {}
    for name, text in {
        "best": f" The answer is {answer}.",
        "sloppy": f" I think {answer}",
        "wrong": f" The answer is {answer + 1}.",
    }.items():
        scores[name] = env.evaluate(obs, ids(tokenizer, text) + [tokenizer.eos_token_id])
    assert scores["best"].reward > scores["sloppy"].reward > 0
    assert scores["best"].reward > scores["wrong"].reward > 0
    assert scores["sloppy"].metrics == {"reward_correctness": 1.0, "reward_formatting": 0.0, "reward": 1.0}


def test_code_rewards_parse_but_never_execute(tmp_path, tokenizer):
    marker = tmp_path / "executed"
    malicious = f"open({str(marker)!r}, 'w').write('x')\n"
    assert syntax_reward(malicious) == 1.0
    assert not marker.exists()
    good = '```python\ndef add_all(xs):\n    """Sum a list."""\n    return sum(xs)\n```'
    bad = "def AddAll(xs):\n\treturn sum(xs)  \n"
    assert syntax_reward(good) == 1.0 and style_reward(good) == 1.0
    assert syntax_reward("def f(:\n  pass") == 0.0
    assert 0.0 < style_reward(bad) < 0.5
    env = create_code_generation_env(tokenizer)
    env.reset()
    result = env.step(ids(tokenizer, good) + [tokenizer.eos_token_id])
    assert set(result.metrics) == {"reward_syntax", "reward_style", "reward"}


def test_preference_env_with_human_feedback_records_comparisons(tokenizer):
    def prefer_shorter(prompt, a, b):
        return 1.0 if len(a) < len(b) else 0.0

    env = PreferenceComparisonEnv(tokenizer, ["What is 1 plus 1?"], human_feedback_fn=prefer_shorter)
    env.reset()
    first = env.step(ids(tokenizer, " I think it might be 2 or so"))
    assert not first.done and first.reward == 0.0
    second = env.step(ids(tokenizer, " 2"))
    assert second.done and second.reward == 0.0 and second.info["preferred"] == "b"
    assert env.comparisons == [
        {
            "prompt": "What is 1 plus 1?",
            "chosen": " 2",
            "rejected": " I think it might be 2 or so",
            "margin": 1.0,
        }
    ]


class _CountDigits(torch.nn.Module):
    """A stand-in preference model: its score is the number of digit tokens it sees."""

    def __init__(self, digit_ids):
        super().__init__()
        self.register_buffer("digits", torch.tensor(sorted(digit_ids)))
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, input_ids, attention_mask):
        hits = torch.isin(input_ids, self.digits) & attention_mask.bool()
        return {"rewards": self.scale * hits.sum(-1, keepdim=True).float()}


def test_preference_env_with_a_model_uses_bradley_terry_on_scores(tokenizer):
    digit_ids = {i for d in "0123456789" for i in ids(tokenizer, d) + ids(tokenizer, " " + d)}
    env = PreferenceComparisonEnv(tokenizer, ["Say numbers:"], preference_model=_CountDigits(digit_ids))
    env.reset()
    env.step(" 1 2 3")
    result = env.step(" no")
    diff = result.metrics["score_a"] - result.metrics["score_b"]
    assert diff > 0
    assert result.reward == pytest.approx(float(torch.sigmoid(torch.tensor(diff))))
    assert env.comparisons[0]["chosen"] == " 1 2 3"


def test_trajectory_totals_rewards():
    traj = Trajectory(
        observations=[], actions=[torch.tensor(1), torch.tensor(2)], rewards=[0.0, 1.5], done=True
    )
    assert traj.total_reward == 1.5 and len(traj) == 2 and traj.logprobs is None
