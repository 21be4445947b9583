"""Every metric name that one module writes and another reads, in one place.

Scopes: ``eval/`` the held-out split, ``golden/`` the pinned set (with ``/low``, ``/high``
and ``/n`` beside each estimate), ``human/`` live ratings from the feedback service,
``promotion/`` the gate machinery (and each gate on the promote run), ``promoted/`` whether
a pipeline run's version of a role holds ``champion``, ``train/`` the trainers' own logs.
Producers (the evaluation stage, the reward stage, the challenger evaluation) and consumers
(promotion gates, the run summary, the parent run's headline, the label check, the
estimate of a training request) import these names instead of spelling them.
"""

from __future__ import annotations

from collections.abc import Mapping

EVAL, GOLDEN, HUMAN, PROMOTION, TRAIN = "eval", "golden", "human", "promotion", "train"
PROMOTED = "promoted"
WIN_RATE_PREFIX = "win_rate_vs_"
BEFORE = "before_"


def eval_key(name: str) -> str:
    return f"{EVAL}/{name}"


def before_key(name: str) -> str:
    """``eval/before_<name>``: a held-out figure measured before a stage trained (``eval/<name>``
    after), one spelling for every stage: ``eval/before_loss``, ``eval/before_reward``..."""
    return f"{EVAL}/{BEFORE}{name}"


def golden_key(name: str) -> str:
    return f"{GOLDEN}/{name}"


def win_rate_key(scope: str, judge: str | None, against: str) -> str:
    """``<scope>/<judge>/win_rate_vs_<against>``; without a judge, the primary judge's rate."""
    return f"{scope}/{judge}/{WIN_RATE_PREFIX}{against}" if judge else f"{scope}/{WIN_RATE_PREFIX}{against}"


def is_win_rate(key: str) -> bool:
    """A win rate's own key, not the interval bound or row count stored beside it (``…/low``)."""
    return key.rpartition("/")[2].startswith(WIN_RATE_PREFIX)


def judge_agreement_key(judge: str) -> str:
    """``golden/<judge>/verifier_agreement``: how often a model judge picks the side the
    verifiable answers pick, on the pinned items where the answers decide."""
    return f"{GOLDEN}/{judge}/verifier_agreement"


def judge_pair_accuracy_key(judge: str) -> str:
    """``golden/<judge>/pair_accuracy``: how often a judge ranks a pinned pair's chosen answer first."""
    return f"{GOLDEN}/{judge}/pair_accuracy"


def judge_reward_agreement_key(judge: str) -> str:
    """``golden/<judge>/agreement_with_reward``: how often a judge ranks a pinned pair as the
    run's own reward model does (two judges alike in their mistakes agree whatever the truth)."""
    return f"{GOLDEN}/{judge}/agreement_with_reward"


HANDED_ON_STEP = "handed_on_step"  # a stage that hands on its best held-out step logs which


def stage_figure(metrics: Mapping[str, float], name: str) -> float | None:
    """``name`` as a stage run logged it: plain (the Trainer stages) or under the stage's own
    prefix (PPO's ``ppo/handed_on_step``); the plain spelling first."""
    keys = [k for k in metrics if k == name or k.endswith(f"/{name}")]
    return metrics[min(keys, key=len)] if keys else None


def promoted_key(role: str) -> str:
    """``promoted/<role>``: 1 when the run's version of ``role`` holds ``champion`` after it, else 0."""
    return f"{PROMOTED}/{role}"


def gate_key(role: str, gate: str, part: str = "") -> str:
    """``promotion/<role>/<gate>``: a gate's value on the promote run; ``part`` names what sits
    beside it (``low``, ``high``, ``n`` as for any estimate, ``threshold``, ``passed``)."""
    key = f"{PROMOTION}/{role}/{gate}"
    return f"{key}/{part}" if part else key


# ---- the held-out split (evaluation stage)
REWARD_ACCURACY_EVAL = eval_key("reward_accuracy")
REWARD_MARGIN_EVAL = eval_key("reward_margin")
CALIBRATION_ERROR = eval_key("reward_ece")
REWARD_PAIRS_EVAL = eval_key("reward_pairs")
REWARD_MSE = eval_key("reward_mse")
REWARD_RATINGS = eval_key("reward_ratings")
REWARD_SPEARMAN = eval_key("reward_spearman")
REWARD_MEAN = eval_key("reward_mean")
REFERENCE_REWARD_MEAN = eval_key("reference_reward_mean")
NORMALISED_REWARD = eval_key("normalised_reward")
LENGTH_MEAN = eval_key("length_mean")
REFERENCE_LENGTH_MEAN = eval_key("reference_length_mean")
LENGTH_GROWTH_RATIO_EVAL = eval_key("length_growth_ratio")
TASK_ACCURACY_EVAL = eval_key("task_accuracy")
REFERENCE_TASK_ACCURACY_EVAL = eval_key("reference_task_accuracy")
TASK_ACCURACY_GAIN_EVAL = eval_key("task_accuracy_gain")
CHAMPION_TASK_ACCURACY_EVAL = eval_key("champion_task_accuracy")
KL_TO_REFERENCE = eval_key("kl_to_reference")
# share of completions that loop (evaluation.repetition), the policy's and its reference's
LOOP_RATE_EVAL = eval_key("loop_rate")
REFERENCE_LOOP_RATE_EVAL = eval_key("reference_loop_rate")
POLICY_REWARD_MEAN = eval_key("policy_reward_mean")
POLICY_REWARD_STD = eval_key("policy_reward_std")
POLICY_REWARD_N = eval_key("policy_reward_n")

# ---- the reward stage's own held-out report (calibration.PairwiseReport.as_metrics("eval/"))
REWARD_STAGE_ACCURACY = eval_key("accuracy")
REWARD_STAGE_ECE = eval_key("ece")
REWARD_STAGE_MARGIN = eval_key("margin_mean")
REWARD_STAGE_TRAIN_ACCURACY = f"{TRAIN}/accuracy"

# ---- the pinned set (challenger evaluation; promotion gates read these)
ANSWERS = golden_key("answers")
TASK_ACCURACY = golden_key("task_accuracy")
REFERENCE_TASK_ACCURACY = golden_key("reference_task_accuracy")
CHAMPION_TASK_ACCURACY = golden_key("champion_task_accuracy")
TASK_ACCURACY_GAIN = golden_key("task_accuracy_gain")
TASK_ACCURACY_VS_CHAMPION = golden_key("task_accuracy_vs_champion")
LENGTH_GROWTH_RATIO = golden_key("length_growth_ratio")
LENGTH_GROWTH_VS_CHAMPION = golden_key("length_growth_vs_champion")
REWARD_ACCURACY = golden_key("reward_accuracy")
REWARD_ACCURACY_VS_CHAMPION = golden_key("reward_accuracy_vs_champion")
# share of pinned items where challenger and champion differ: the power of the two gates above
TASK_DISAGREEMENT_VS_CHAMPION = golden_key("task_disagreement_vs_champion")
REWARD_DISAGREEMENT_VS_CHAMPION = golden_key("reward_disagreement_vs_champion")
# the worst slice of the pinned set (evaluation.slices): challenger minus champion on its items
WORST_SLICE_TASK_ACCURACY = golden_key("worst_slice_task_accuracy_vs_champion")
WORST_SLICE_REWARD_ACCURACY = golden_key("worst_slice_reward_accuracy_vs_champion")
SLICES_JUDGED = golden_key("slices_judged")
# the RL stage's own contribution: the policy against the model that stage started from (the SFT
# model, else the base), beside its gain over the reference; the judges' win rates against it are
# win_rate_key(GOLDEN, judge, RL_START)
RL_START = "rl_start"
RL_START_TASK_ACCURACY = golden_key("rl_start_task_accuracy")
RL_GAIN = golden_key("rl_gain")  # task accuracy minus the RL start's, paired on the pinned items
LENGTH_GROWTH_VS_RL_START = golden_key("length_growth_vs_rl_start")
# 1 when the RL start is the reference itself (no SFT ran, or evaluation.reference: sft): the
# figures above are then the reference's, recorded under these names and not computed twice
RL_START_IS_REFERENCE = golden_key("rl_start_is_reference")
REWARD_SLICES_JUDGED = golden_key("reward_slices_judged")
# degeneration (evaluation.repetition): the share of pinned completions that loop, each
# opponent's share (``<opponent>_loop_rate``) and ours minus theirs on the same prompts
# (``loop_rate_vs_<opponent>``); the share of repeated word 4-grams; distinct word bigrams
LOOP_RATE = golden_key("loop_rate")
REFERENCE_LOOP_RATE = golden_key("reference_loop_rate")
LOOP_RATE_VS_REFERENCE = golden_key("loop_rate_vs_reference")
REPEATED_4GRAM_SHARE = golden_key("repeated_4gram_share")
DISTINCT_2 = golden_key("distinct_2")
REFERENCE_DISTINCT_2 = golden_key("reference_distinct_2")
# the pinned-set decoding settings the figures were measured with (numbers, so they sit with them)
DECODING = "decoding"
DECODING_MAX_NEW_TOKENS = golden_key(f"{DECODING}/max_new_tokens")
DECODING_DO_SAMPLE = golden_key(f"{DECODING}/do_sample")
DECODING_TEMPERATURE = golden_key(f"{DECODING}/temperature")
DECODING_REPETITION_PENALTY = golden_key(f"{DECODING}/repetition_penalty")

# ---- live feedback and the gates
HUMAN_SCORE_GAIN = f"{HUMAN}/score_gain_vs_champion"  # live ratings: challenger mean - champion mean
INDEPENDENT_JUDGES = f"{PROMOTION}/independent_judges"
# 1 where the run's models started from random weights (model.weights: random): never promoted
RANDOM_WEIGHTS = f"{PROMOTION}/random_weights"
