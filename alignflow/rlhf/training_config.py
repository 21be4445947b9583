"""The knobs of a spec-002 run, as plain keyword-constructed dataclasses checked on creation.

A bad value fails where it is written (``TrainingConfig(lora_r=0)``), with the field's
name in the message, rather than minutes later inside a training stage. Whether a device
exists is a property of the machine, not of the config, so ``device="cuda"`` is accepted
here and checked when training starts (:func:`resolve_device`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
MIXED_PRECISION = (None, "no", "fp16", "bf16")


def _fail(owner: str, name: str, rule: str, value: Any) -> None:
    raise ValueError(f"{owner}.{name} must be {rule}, got {value!r}")


def _int(owner: str, name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        _fail(owner, name, f"an integer >= {low}", value)


def _number(
    owner: str,
    name: str,
    value: Any,
    low: float,
    high: float,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        if high == float("inf"):
            _fail(owner, name, f"a number {'>' if low_open else '>='} {low:g}", value)
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        _fail(owner, name, f"a number in {interval}", value)


def _positive(owner: str, name: str, value: Any) -> None:
    _number(owner, name, value, 0.0, float("inf"), low_open=True, high_open=True)


def _flag(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        _fail(owner, name, "True or False", value)


def _text(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        _fail(owner, name, "a non-empty string", value)


def _lora(owner: str, config: RewardModelConfig | TrainingConfig) -> None:
    _flag(owner, "use_lora", config.use_lora)
    _int(owner, "lora_r", config.lora_r, 1)
    _int(owner, "lora_alpha", config.lora_alpha, 1)
    _number(owner, "lora_dropout", config.lora_dropout, 0.0, 1.0, high_open=True)


@dataclass
class RewardModelConfig:
    """How the reward model is trained: regression on feedback scores (MSE), optionally LoRA.

    ``num_epochs`` passes over the training feedback become the reward stage's step count.
    """

    base_model: str = "gpt2"
    use_lora: bool = True
    lora_r: int = 8
    lora_alpha: int = 32
    lora_dropout: float = 0.1
    batch_size: int = 8
    num_epochs: int = 3
    learning_rate: float = 1e-5
    max_length: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _text(owner, "base_model", self.base_model)
        _lora(owner, self)
        _int(owner, "batch_size", self.batch_size, 1)
        _int(owner, "num_epochs", self.num_epochs, 1)
        _positive(owner, "learning_rate", self.learning_rate)
        _int(owner, "max_length", self.max_length, 8)
        _int(owner, "seed", self.seed, 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainingConfig:
    """Everything :class:`~alignflow.rlhf.RLHFTrainer` needs: model, PPO, sampling, hardware.

    Spec 002's fields keep its names and defaults. Added here: ``seed``; ``eval_fraction``
    (share of prompts held out to measure the final reward on); ``max_prompt_length``
    (longer prompts are left out of PPO); ``min_feedback`` (fewer rows are refused);
    ``reward`` (how the reward model trains; None: the policy's base model and LoRA
    settings with :class:`RewardModelConfig`'s other defaults).
    """

    # model
    base_model: str = "gpt2"
    use_lora: bool = True
    lora_r: int = 8
    lora_alpha: int = 32
    lora_dropout: float = 0.1
    # optimisation
    learning_rate: float = 1e-5
    batch_size: int = 8
    mini_batch_size: int = 4
    ppo_epochs: int = 4
    max_steps: int = 1000
    # PPO
    init_kl_coef: float = 0.2
    target_kl: float = 6.0
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = 0.2
    vf_coef: float = 0.1
    # sampling
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 0.95
    # hardware
    gradient_accumulation_steps: int = 1
    device: str = "auto"
    mixed_precision: str | None = None
    # additions (see the class docstring)
    seed: int = 0
    eval_fraction: float = 0.1
    max_prompt_length: int = 128
    min_feedback: int = 10
    reward: RewardModelConfig | None = field(default=None)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _text(owner, "base_model", self.base_model)
        _lora(owner, self)
        _positive(owner, "learning_rate", self.learning_rate)
        for name in ("batch_size", "mini_batch_size", "ppo_epochs", "max_steps", "max_new_tokens"):
            _int(owner, name, getattr(self, name), 1)
        _int(owner, "gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        _number(owner, "init_kl_coef", self.init_kl_coef, 0.0, float("inf"), high_open=True)
        _positive(owner, "target_kl", self.target_kl)
        _number(owner, "gamma", self.gamma, 0.0, 1.0)
        _number(owner, "lam", self.lam, 0.0, 1.0)
        _positive(owner, "cliprange", self.cliprange)
        _number(owner, "vf_coef", self.vf_coef, 0.0, float("inf"), high_open=True)
        _positive(owner, "temperature", self.temperature)
        _int(owner, "top_k", self.top_k, 0)
        _number(owner, "top_p", self.top_p, 0.0, 1.0, low_open=True)
        if not isinstance(self.device, str) or not DEVICE_PATTERN.match(self.device):
            _fail(owner, "device", "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'", self.device)
        if self.mixed_precision not in MIXED_PRECISION:
            _fail(owner, "mixed_precision", f"one of {list(MIXED_PRECISION)}", self.mixed_precision)
        _int(owner, "seed", self.seed, 0)
        _number(owner, "eval_fraction", self.eval_fraction, 0.0, 1.0, high_open=True)
        _int(owner, "max_prompt_length", self.max_prompt_length, 1)
        _int(owner, "min_feedback", self.min_feedback, 1)
        if self.reward is not None and not isinstance(self.reward, RewardModelConfig):
            _fail(owner, "reward", "a RewardModelConfig or None", self.reward)

    def reward_config(self) -> RewardModelConfig:
        """The reward model's settings: ``reward``, or the policy's base model and LoRA settings."""
        if self.reward is not None:
            return self.reward
        return RewardModelConfig(
            base_model=self.base_model,
            use_lora=self.use_lora,
            lora_r=self.lora_r,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            seed=self.seed,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_device(device: str) -> str:
    """``auto`` -> cuda when there is one, else cpu; a CUDA device on a machine without CUDA
    is an error that names the setting."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"TrainingConfig.device is {device!r} but this machine has no CUDA device "
            "(torch.cuda.is_available() is False); use device='cpu' or 'auto'"
        )
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("TrainingConfig.device is 'mps' but MPS is not available; use 'cpu' or 'auto'")
    return device


def check_precision(mixed_precision: str | None, device: str) -> None:
    """Half precision is a GPU setting: asking for it on a CPU run is an error naming the field."""
    if mixed_precision in ("fp16", "bf16") and not device.startswith("cuda"):
        raise ValueError(
            f"TrainingConfig.mixed_precision={mixed_precision!r} needs a CUDA device, "
            f"but training runs on {device!r}; use mixed_precision=None or 'no'"
        )
