"""The learning-curve plot marks the step a stage handed on, however the stage spells its metric."""

from alignflow.evaluation.plots import _handed_on


def test_the_handed_on_step_is_found_under_the_stages_own_prefix():
    assert _handed_on({"ppo/handed_on_step": 8.0, "eval/reward": 0.6}) == 8.0  # PPO's stage metrics
    assert _handed_on({"handed_on_step": 4.0, "grpo/handed_on_step": 9.0}) == 4.0  # the plain name first
    assert _handed_on({"eval/reward": 0.6, "handed_on_steps": 3.0}) is None
