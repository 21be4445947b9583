"""TrainingConfig and RewardModelConfig: spec 002's defaults, and a bad value named where it is set."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from alignflow.rlhf import RewardModelConfig, RLHFTrainer, TrainingConfig


def test_every_spec_field_is_there_with_the_spec_default():
    fields = {f.name: f.default for f in dataclasses.fields(TrainingConfig)}
    spec = {
        "base_model": "gpt2", "use_lora": True, "lora_r": 8, "lora_alpha": 32, "lora_dropout": 0.1,
        "learning_rate": 1e-5, "batch_size": 8, "mini_batch_size": 4, "ppo_epochs": 4, "max_steps": 1000,
        "init_kl_coef": 0.2, "target_kl": 6.0, "gamma": 1.0, "lam": 0.95, "cliprange": 0.2, "vf_coef": 0.1,
        "max_new_tokens": 128, "temperature": 1.0, "top_k": 50, "top_p": 0.95,
        "gradient_accumulation_steps": 1, "device": "auto", "mixed_precision": None,
    }  # fmt: skip
    assert {name: fields[name] for name in spec} == spec


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("base_model", ""),
        ("use_lora", "yes"),
        ("lora_r", 0),
        ("lora_alpha", 0),
        ("lora_dropout", 1.0),
        ("learning_rate", 0.0),
        ("batch_size", 0),
        ("mini_batch_size", 2.5),
        ("ppo_epochs", 0),
        ("max_steps", -1),
        ("init_kl_coef", -0.1),
        ("target_kl", 0),
        ("gamma", 1.5),
        ("lam", -0.1),
        ("cliprange", 0),
        ("vf_coef", -1),
        ("max_new_tokens", 0),
        ("temperature", 0),
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.1),
        ("gradient_accumulation_steps", 0),
        ("device", "gpu"),
        ("mixed_precision", "fp8"),
        ("eval_fraction", 1.0),
        ("max_steps", True),
        ("reward", {"learning_rate": 1e-3}),
    ],
)
def test_a_bad_training_value_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^TrainingConfig\.{field} must be .*, got {value!r}"):
        TrainingConfig(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_epochs", 0),
        ("batch_size", 0),
        ("learning_rate", -1e-5),
        ("lora_dropout", 2),
        ("base_model", None),
        ("max_length", 4),
    ],
)
def test_a_bad_reward_model_value_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^RewardModelConfig\.{field} must be"):
        RewardModelConfig(**{field: value})


def test_the_reward_model_follows_the_policy_unless_configured():
    config = TrainingConfig(base_model="tiny", use_lora=False, lora_r=4, seed=3)
    derived = config.reward_config()
    assert (derived.base_model, derived.use_lora, derived.lora_r, derived.seed) == ("tiny", False, 4, 3)
    own = RewardModelConfig(base_model="minilm", num_epochs=1)
    assert TrainingConfig(reward=own).reward_config() is own


def test_config_round_trips_through_a_dict():
    config = TrainingConfig(base_model="tiny", max_steps=7, top_k=0)
    assert TrainingConfig(**config.to_dict()) == config


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_constructs_but_training_without_cuda_names_the_device(monkeypatch, tmp_path, device):
    config = TrainingConfig(base_model="tiny", device=device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=rf"TrainingConfig\.device is '{device}'"):
        RLHFTrainer(config).train([{"prompt": "p", "response": "r", "score": 1.0}] * 10, tmp_path)


def test_half_precision_on_a_cpu_run_names_mixed_precision(tmp_path):
    config = TrainingConfig(base_model="tiny", device="cpu", mixed_precision="fp16")
    with pytest.raises(ValueError, match=r"TrainingConfig\.mixed_precision='fp16' needs a CUDA device"):
        RLHFTrainer(config).train([{"prompt": "p", "response": "r", "score": 1.0}] * 10, tmp_path)
