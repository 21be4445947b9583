"""The research API: environments, reward models, PPO, DPO, forward-backward, objectives.

Names are resolved lazily (PEP 562) so that ``alignflow.losses``, which builds on
``alignflow.rl.functional``, can be imported first without a circular import, and so that
``import alignflow.rl`` stays cheap.
"""

from __future__ import annotations

from alignflow.lazy import lazy_exports

_EXPORTS = {
    "alignflow.rl.environments": [
        "Observation",
        "StepResult",
        "Trajectory",
        "RLEnvironment",
        "TextGenerationEnv",
        "MultiObjectiveRewardEnv",
        "PreferenceComparisonEnv",
        "create_math_problem_env",
        "create_code_generation_env",
    ],
    "alignflow.rl.forward_backward": [
        "ForwardBackwardPipeline",
        "ForwardBackwardOutput",
        "OptimStepOutput",
        "AsyncTrainingFuture",
    ],
    "alignflow.rl.ppo": [
        "PPOConfig",
        "PPOTrainer",
        "PPOModel",
        "ValueHead",
        "AdaptiveKLController",
        "FixedKLController",
        "compute_gae",
    ],
    "alignflow.rl.objectives": ["compute_rl_loss"],
    "alignflow.rl.reward_model": [
        "RewardModelConfig",
        "RewardModel",
        "PairwiseRewardModel",
        "MultiObjectiveRewardModel",
        "RewardModelTrainer",
    ],
    "alignflow.rl.dpo": ["DPOConfig", "DPOTrainer"],
    "alignflow.rl.functional": [
        "logprobs_from_logits",
        "entropy_from_logits",
        "masked_mean",
        "masked_var",
        "whiten",
        "sequence_logprobs",
    ],
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
