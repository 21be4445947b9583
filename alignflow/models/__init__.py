"""Model factory: offline tiny presets, tokenizer training, loading, LoRA, prompting, reward scoring.

Names resolve lazily (PEP 562): the config models in ``model_config`` are torch-free, and
importing them through this package must not pull torch and transformers in with the factory.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "alignflow.models.model_config": ["MINILM", "PRESETS", "TINY", "LoraSpec", "ModelSpec"],
    "alignflow.models.factory": [
        "build_tiny_model",
        "load_causal_lm",
        "minilm_path",
        "model_init_kwargs",
        "peft_config",
        "prepare_base_model",
        "resolve_model_source",
        "select_dtype",
        "train_tokenizer",
    ],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'alignflow.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
