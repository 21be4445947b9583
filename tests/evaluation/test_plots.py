"""The learning-curve plot and the version page find a stage's handed-on step, however the
stage spells its metric."""

from alignflow.evaluation.metric_names import HANDED_ON_STEP, stage_figure


def test_the_handed_on_step_is_found_under_the_stages_own_prefix():
    assert stage_figure({"ppo/handed_on_step": 8.0, "eval/reward": 0.6}, HANDED_ON_STEP) == 8.0  # PPO
    assert stage_figure({"handed_on_step": 4.0, "grpo/handed_on_step": 9.0}, HANDED_ON_STEP) == 4.0
    assert stage_figure({"eval/reward": 0.6, "handed_on_steps": 3.0}, HANDED_ON_STEP) is None
