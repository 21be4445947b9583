"""Spec 002's Python snippets, run as the spec writes them.

Changed only: ``from n3_server.rlhf`` -> ``from alignflow.rlhf`` and ``base_model="tiny"``
where a snippet names a base model (the hub is offline here). The names a snippet takes
from its surroundings (``training_config``, ``feedback_list``, ``train_dataset``...) are
this file's fixtures. The snippets write to relative paths (``models/my_agent/v1``), so
the module runs in a fresh working directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from alignflow.rlhf import (
    FeedbackDataset,
    RewardModelConfig,
    RLHFTrainer,
    TrainingConfig,
    TrainingResult,
    build_tokenizer,
)

pytestmark = pytest.mark.usefixtures("workspace")


def _fast_training_config(**changes) -> TrainingConfig:
    """What this file hands to the snippets as ``training_config``/``config``: few, short rollouts,
    and a reward model trained hard enough to mean something."""
    settings = dict(
        base_model="tiny",
        max_steps=4,
        batch_size=8,
        mini_batch_size=4,
        ppo_epochs=2,
        learning_rate=1e-3,
        max_new_tokens=6,
        reward=RewardModelConfig(base_model="tiny", use_lora=False, learning_rate=1e-3, num_epochs=10),
    )
    return TrainingConfig(**{**settings, **changes})


@pytest.fixture(scope="module")
def v1(workspace, feedback_list) -> TrainingResult:
    """Step 2: PPO Training."""
    training_config = _fast_training_config()

    from alignflow.rlhf import RLHFTrainer

    trainer = RLHFTrainer(training_config)

    result = trainer.train(
        feedbacks=feedback_list,
        output_dir="models/my_agent/v1",
    )

    print(f"Final reward: {result.final_reward_mean}")
    print(f"Training steps: {result.training_steps}")
    return result


# ---------------------------------------------------------------- Training Configuration


def test_default_configuration():
    from alignflow.rlhf import TrainingConfig

    config = TrainingConfig(
        # Model settings
        base_model="tiny",  # Base LLM to train
        use_lora=True,  # Use LoRA for efficient fine-tuning
        lora_r=8,  # LoRA rank
        lora_alpha=32,  # LoRA alpha
        lora_dropout=0.1,  # LoRA dropout
        # Training hyperparameters
        learning_rate=1e-5,  # Learning rate
        batch_size=8,  # Training batch size
        mini_batch_size=4,  # PPO mini-batch size
        ppo_epochs=4,  # PPO update epochs per batch
        max_steps=1000,  # Total training steps
        # PPO-specific
        init_kl_coef=0.2,  # KL divergence coefficient
        target_kl=6.0,  # Target KL divergence
        gamma=1.0,  # Discount factor
        lam=0.95,  # GAE lambda
        cliprange=0.2,  # PPO clip range
        vf_coef=0.1,  # Value function coefficient
        # Generation settings
        max_new_tokens=128,  # Max tokens to generate
        temperature=1.0,  # Sampling temperature
        top_k=50,  # Top-K sampling
        top_p=0.95,  # Nucleus sampling
    )

    # the spec's values are also the defaults: only base_model differs from a bare config
    assert config == TrainingConfig(base_model="tiny")
    assert TrainingConfig().base_model == "gpt2"
    spec = dict(use_lora=True, lora_r=8, lora_alpha=32, lora_dropout=0.1, learning_rate=1e-5, batch_size=8)
    spec.update(mini_batch_size=4, ppo_epochs=4, max_steps=1000, init_kl_coef=0.2, target_kl=6.0)
    spec.update(gamma=1.0, lam=0.95, cliprange=0.2, vf_coef=0.1, max_new_tokens=128, temperature=1.0)
    spec.update(top_k=50, top_p=0.95)
    assert {k: getattr(config, k) for k in spec} == spec


def test_quick_prototyping():
    config = TrainingConfig(
        base_model="tiny",
        max_steps=100,
        batch_size=4,
        learning_rate=1e-4,
    )
    assert (config.max_steps, config.batch_size, config.learning_rate) == (100, 4, 1e-4)
    assert config.mini_batch_size == 4 and config.use_lora


def test_production_training():
    config = TrainingConfig(
        base_model="tiny",  # or gpt2-large
        max_steps=5000,
        batch_size=16,
        learning_rate=1e-5,
        use_lora=True,
        lora_r=16,
    )
    assert (config.max_steps, config.batch_size, config.lora_r, config.lora_alpha) == (5000, 16, 16, 32)


def test_memory_constrained():
    config = TrainingConfig(
        base_model="tiny",
        use_lora=True,
        lora_r=4,
        batch_size=4,
        mini_batch_size=2,
        gradient_accumulation_steps=4,
    )
    assert (config.lora_r, config.batch_size, config.mini_batch_size) == (4, 4, 2)
    assert config.gradient_accumulation_steps == 4


def test_gpu_training_constructs_and_names_the_device_where_there_is_no_cuda(
    monkeypatch, feedback_list, tmp_path
):
    config = TrainingConfig(
        device="cuda",  # Use GPU
        batch_size=32,  # Larger batch size with GPU
        mixed_precision="fp16",  # Use mixed precision
    )
    assert (config.device, config.batch_size, config.mixed_precision) == ("cuda", 32, "fp16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"TrainingConfig\.device is 'cuda' but this machine has no CUDA"):
        RLHFTrainer(config).train(feedback_list, tmp_path / "gpu")
    assert not (tmp_path / "gpu").exists()


def test_lora_fine_tuning():
    config = TrainingConfig(
        use_lora=True,
        lora_r=8,  # Lower rank = less memory, faster training
        lora_alpha=32,  # Alpha/r ratio controls adaptation strength
        lora_dropout=0.1,
    )
    assert (config.use_lora, config.lora_r, config.lora_alpha, config.lora_dropout) == (True, 8, 32, 0.1)


@pytest.mark.parametrize("name", ["facebook/opt-125m", "EleutherAI/gpt-neo-125M", "meta-llama/Llama-2-7b-hf"])
def test_custom_base_models(name):
    # the spec lists three alternatives in one call, which repeats a keyword (a SyntaxError
    # in Python), so each alternative is its own construction
    config = TrainingConfig(
        base_model=name,
    )
    assert config.base_model == name
    assert config.reward_config().base_model == name  # the reward model follows the policy's base


def test_troubleshooting_configs():
    # 1. Out of Memory
    config = TrainingConfig(
        batch_size=4,
        mini_batch_size=2,
        use_lora=True,
        lora_r=4,
    )
    assert (config.batch_size, config.mini_batch_size, config.lora_r) == (4, 2, 4)

    # 2. Training Instability
    config = TrainingConfig(
        learning_rate=1e-6,  # Lower learning rate
        init_kl_coef=0.5,  # Stronger KL constraint
    )
    assert (config.learning_rate, config.init_kl_coef) == (1e-6, 0.5)

    # 3. Low Reward (the snippet's feedback review calls the HTTP API, not this one)
    config = TrainingConfig(
        max_steps=2000,  # More training steps
    )
    assert config.max_steps == 2000

    # 4. Reward Model Overfitting
    config = RewardModelConfig(
        num_epochs=2,  # Fewer epochs
        lora_dropout=0.2,  # Higher dropout
    )
    assert (config.num_epochs, config.lora_dropout, config.use_lora) == (2, 0.2, True)


# ---------------------------------------------------------------- Step 1: Reward Model Training


def test_step1_reward_model_training(feedback_list):
    tokenizer = build_tokenizer(feedback_list, "tiny")
    train_dataset, val_dataset = FeedbackDataset(feedback_list, tokenizer).split(val_fraction=0.25, seed=0)

    from alignflow.rlhf import RewardModelConfig, train_reward_model

    config = RewardModelConfig(
        base_model="tiny",
        use_lora=True,
        batch_size=8,
        num_epochs=3,
        learning_rate=1e-5,
    )

    reward_model = train_reward_model(
        train_dataset,
        val_dataset,
        config,
        tokenizer,
    )

    # Save reward model
    reward_model.save_pretrained("models/my_agent/reward_model")

    from alignflow.models.reward_scorer import load_reward_scorer

    assert isinstance(reward_model, RewardModel)
    assert reward_model.meta.mode == "regression" and "eval/mse" in reward_model.metrics
    assert reward_model.tokenizer.get_vocab() == tokenizer.get_vocab()  # built around the caller's tokenizer
    saved = Path("models/my_agent/reward_model")
    assert (saved / "model.safetensors").exists() and not list(saved.glob("adapter_*"))  # LoRA merged
    prompts, responses = val_dataset.prompts, [r["response"] for r in val_dataset.records]
    expected = reward_model.score(prompts, responses)
    assert RewardModel.from_pretrained(saved).score(prompts, responses) == pytest.approx(expected, abs=1e-5)
    scorer = load_reward_scorer(saved, normalize=False)
    assert scorer(prompts, responses) == pytest.approx(expected, abs=1e-5)  # the pipeline reads it alike


# ---------------------------------------------------------------- Step 2 and Step 3


def test_step2_ppo_training(v1):
    out = Path("models/my_agent/v1")
    assert isinstance(v1, TrainingResult)
    assert v1.model_path == str(out / "policy") and v1.reward_model_path == str(out / "reward_model")
    assert v1.training_steps == 4 and len(v1.reward_history) == 4
    assert v1.feedback_count == 48 and v1.reward_mode == "regression"
    assert TrainingResult.load(out / "training_results.json") == v1
    assert (out / "reward_model" / "alignflow_reward.json").exists()


def test_step3_policy_deployment(v1):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained("models/my_agent/v1/policy")
    tokenizer = AutoTokenizer.from_pretrained("models/my_agent/v1/policy")

    # Generate response
    prompt = "What is quantum computing?"
    inputs = tokenizer(prompt, return_tensors="pt")
    outputs = model.generate(**inputs, max_new_tokens=128)
    response = tokenizer.decode(outputs[0], skip_special_tokens=True)

    assert outputs.shape[1] > inputs["input_ids"].shape[1]
    assert response.startswith(prompt)
    assert not list(Path("models/my_agent/v1/policy").glob("adapter_*"))  # a plain, merged model


# ---------------------------------------------------------------- Visualization


def test_visualization_plots_the_reward_history(v1, tmp_path):
    import matplotlib

    matplotlib.use("Agg")

    import matplotlib.pyplot as plt

    # Load results
    from alignflow.rlhf import TrainingResult

    result = TrainingResult.load("models/my_agent/v1/training_results.json")

    # Plot reward over time
    plt.plot(result.reward_history)
    plt.xlabel("Step")
    plt.ylabel("Reward")
    plt.title("Training Progress")
    plt.show()

    figure = plt.gcf()
    figure.savefig(tmp_path / "progress.png")
    (line,) = figure.axes[0].lines
    assert list(line.get_ydata()) == result.reward_history == v1.reward_history
    assert figure.axes[0].get_title() == "Training Progress"
    assert (tmp_path / "progress.png").stat().st_size > 0
    plt.close(figure)


# ---------------------------------------------------------------- Pre-trained Reward Model


def test_pretrained_reward_model_is_reused(v1, feedback_list):
    config = _fast_training_config(max_steps=2)
    feedbacks = feedback_list

    trainer = RLHFTrainer(config)

    result = trainer.train(
        feedbacks=feedbacks,
        output_dir="models/my_agent/v2",
        reward_model_path="models/my_agent/v1/reward_model",  # Reuse
    )

    assert result.reward_model_path == "models/my_agent/v1/reward_model"
    assert not Path("models/my_agent/v2/reward_model_stage").exists()  # nothing was trained for it
    assert result.training_steps == 2 and Path("models/my_agent/v2/policy/model.safetensors").exists()
    stage = json.loads(Path("models/my_agent/v2/ppo_stage/result.json").read_text())
    assert "eval/reward_model" in stage["metrics"]


# ---------------------------------------------------------------- Custom Reward Functions

from alignflow.rlhf import RewardModel  # noqa: E402


class CustomRewardModel(RewardModel):
    def forward(self, input_ids, attention_mask):
        # Custom reward logic
        base_rewards = super().forward(input_ids, attention_mask)

        # Apply custom transformations
        rewards = base_rewards * 2.0 - 1.0  # Scale to [-1, 1]

        return rewards


def test_custom_reward_model_rescales_the_base_rewards(v1, feedback_list):
    path = "models/my_agent/v1/reward_model"
    base, custom = RewardModel.from_pretrained(path), CustomRewardModel.from_pretrained(path)
    assert type(custom) is CustomRewardModel
    prompts = [f["prompt"] for f in feedback_list]
    responses = [f["response"] for f in feedback_list]
    expected = [2.0 * r - 1.0 for r in base.score(prompts, responses)]
    assert custom.score(prompts, responses) == pytest.approx(expected, abs=1e-5)
    batch = base.encode(prompts[:4], responses[:4])
    torch.testing.assert_close(custom(**batch), base(**batch) * 2.0 - 1.0)


def test_custom_reward_model_scores_the_ppo_rollouts(v1, feedback_list):
    """Same seed, same first rollout: its mean reward under the custom model is 2x - 1 of the base's."""
    path = "models/my_agent/v1/reward_model"
    config = _fast_training_config(max_steps=1)
    plain = RLHFTrainer(config).train(
        feedback_list, "custom/plain", reward_model=RewardModel.from_pretrained(path)
    )
    custom = RLHFTrainer(config).train(
        feedback_list, "custom/custom", reward_model=CustomRewardModel.from_pretrained(path)
    )
    assert custom.reward_history[0] == pytest.approx(2.0 * plain.reward_history[0] - 1.0, abs=1e-4)
    # the same rollout scored by the pipeline's scorer (v1): normalised with the model's saved stats
    meta = RewardModel.from_pretrained(path).meta
    assert v1.reward_history[0] == pytest.approx((plain.reward_history[0] - meta.mean) / meta.std, abs=1e-4)
    assert custom.reward_model_path == "custom/custom/reward_model"
    assert RewardModel.from_pretrained(custom.reward_model_path).score(["p"], ["OK."]) == pytest.approx(
        RewardModel.from_pretrained(path).score(["p"], ["OK."]), abs=1e-5
    )
