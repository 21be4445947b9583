"""Model factory: offline tiny presets, tokenizer training, loading, LoRA, prompting, reward scoring.

Names resolve lazily (PEP 562): the config models in ``model_config`` are torch-free, and
importing them through this package must not pull torch and transformers in with the factory.
"""

from __future__ import annotations

from alignflow.lazy import lazy_exports

_EXPORTS = {
    "alignflow.models.model_config": ["MINILM", "PRESETS", "TINY", "LoraSpec", "ModelSpec"],
    "alignflow.models.factory": [
        "build_tiny_model",
        "init_tiny_model",
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
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
