"""Model factory: offline tiny presets, tokenizer training, loading, LoRA, prompting, reward scoring."""

from alignflow.models.factory import (
    MINILM,
    PRESETS,
    TINY,
    LoraSpec,
    ModelSpec,
    build_tiny_model,
    load_causal_lm,
    minilm_path,
    model_init_kwargs,
    peft_config,
    prepare_base_model,
    resolve_model_source,
    select_dtype,
    train_tokenizer,
)

__all__ = [
    "MINILM",
    "PRESETS",
    "TINY",
    "LoraSpec",
    "ModelSpec",
    "build_tiny_model",
    "load_causal_lm",
    "minilm_path",
    "model_init_kwargs",
    "peft_config",
    "prepare_base_model",
    "resolve_model_source",
    "select_dtype",
    "train_tokenizer",
]
