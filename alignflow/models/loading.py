"""Load a saved model folder as the kind of model a caller needs, or say why it is not one.

``from_pretrained`` is lenient where a pipeline must not be: given a policy folder, the
sequence-classification class builds a classifier with a freshly initialised head; given a
reward-model folder, the causal-LM class builds a language-model head from nothing. Both
"load" and then score or generate noise. Here every weight the class expects must come
from the folder, and any failure (unreadable weights, unknown architecture, head-count
mismatch, NaN or infinite weights) is a :class:`ModelLoadError` naming the folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from alignflow.errors import InputError

if TYPE_CHECKING:  # transformers loads only when a model does
    from transformers import PretrainedConfig

SHOWN_KEYS = 3
# what the reward stage saves: never a policy, even where its weights would load as one
CLASSIFIER_ARCHITECTURES = ("ForSequenceClassification",)
# a saved tokenizer writes at least one of these (fast JSON, BPE and WordPiece vocabularies,
# SentencePiece models)
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "tokenizer.model",
    "sentencepiece.bpe.model",
)


class ModelLoadError(InputError):
    """A model folder that exists but cannot be used as the kind of model asked for."""


def load_pretrained(
    auto_class: Any, path: str | Path, kind: str, refuse: tuple[str, ...] = (), **kwargs: Any
) -> Any:
    """``auto_class.from_pretrained(path)`` with every expected weight present in the folder.

    ``kind`` names what the caller needs ("reward model", "causal LM") in the error message;
    ``refuse``: architecture-name endings (config.json) that are never that kind, for models
    whose missing weights cannot tell (a causal LM with tied embeddings has no LM head of its own).
    """
    try:
        model, info = auto_class.from_pretrained(path, output_loading_info=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - broken files, unknown architectures: one clear error
        raise ModelLoadError(f"{path}: cannot load as a {kind}: {type(exc).__name__}: {exc}") from exc
    named = getattr(model.config, "architectures", None) or []
    if refuse and named and all(str(n).endswith(refuse) for n in named):
        raise ModelLoadError(
            f"{path}: not a {kind}: the folder holds a {architectures(model.config)} checkpoint"
        )
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise ModelLoadError(
            f"{path}: not a {kind}: {type(model).__name__} would start {len(missing)} weights untrained "
            f"({first_few(missing)}); the folder holds a {architectures(model.config)} checkpoint"
        )
    return require_finite_weights(model, path)


def non_finite_tensors(model: Any) -> list[str]:
    """Names of the floating-point weights holding a NaN or an infinity (a diverged model)."""
    import torch

    return [
        name
        for name, tensor in model.state_dict().items()
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())
    ]


def require_finite_weights(model: Any, path: str | Path) -> Any:
    """``model``, unless a weight is NaN or infinite (a diverged checkpoint): it would load, then
    score NaN or fail mid-generation, far from the cause."""
    broken = non_finite_tensors(model)
    if broken:
        raise ModelLoadError(
            f"{path}: NaN or infinite weights in {len(broken)} tensors ({first_few(broken)})"
        )
    return model


def first_few(names: list[str]) -> str:
    """The first names of a list, and how many more there are."""
    more = len(names) - SHOWN_KEYS
    return ", ".join(names[:SHOWN_KEYS]) + (f" (+{more} more)" if more > 0 else "")


def architectures(config: PretrainedConfig) -> str:
    """The architecture(s) a folder's config.json names, for error messages."""
    names = getattr(config, "architectures", None) or [getattr(config, "model_type", "unknown")]
    return "/".join(names)


def load_tokenizer(path: str | Path) -> Any:
    """The folder's tokenizer, or a :class:`ModelLoadError` naming the folder.

    A folder without tokenizer files is refused: transformers would build an empty tokenizer
    from config.json alone that reads every text as a few unknown tokens, so a model would
    "load" and give every response the same score.
    """
    from transformers import AutoTokenizer

    folder = Path(path)
    if folder.is_dir() and not any((folder / name).exists() for name in TOKENIZER_FILES):
        raise ModelLoadError(
            f"{path}: no tokenizer in the folder (none of {', '.join(TOKENIZER_FILES)}); "
            "save it beside the model (tokenizer.save_pretrained)"
        )
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - missing or broken tokenizer files
        raise ModelLoadError(f"{path}: cannot load its tokenizer: {type(exc).__name__}: {exc}") from exc


def require_tokenizer_fits(model: Any, tokenizer: Any, path: str | Path) -> Any:
    """``model``, unless its tokenizer can produce ids past its embedding table (another model's
    tokenizer, or tokens added without resizing): the first such id would crash mid-run."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ModelLoadError(
            f"{path}: the tokenizer has {len(tokenizer)} tokens but the model embeds only {rows}: "
            "not this model's tokenizer, or tokens were added without resize_token_embeddings"
        )
    return model
