"""The research API: environments, reward models, PPO, DPO, forward-backward, objectives.

Names are resolved lazily (PEP 562) so that ``import alignflow.rl`` stays cheap. The tensor
math (log-probs, entropy, whitening) lives in :mod:`alignflow.losses`, below this package.
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
    "alignflow.rl.ppo_config": ["PPOConfig"],
    "alignflow.rl.ppo": [
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
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
