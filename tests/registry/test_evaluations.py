"""Registered models named on the command line (the registry side of ``alignflow eval``)."""

import pytest

from alignflow.registry.evaluations import parse_registered


def test_parse_registered_refs():
    assert parse_registered("models:/demo-reward@champion") == ("demo-reward", "champion")
    assert parse_registered("models:/demo-reward/3") == ("demo-reward", "3")
    assert parse_registered("outputs/reward") is None
    with pytest.raises(ValueError, match="models:/NAME@ALIAS"):
        parse_registered("models:/")


def test_a_real_model_name_resolves_to_its_converted_folder(monkeypatch, tmp_path):
    from alignflow.models import real_models
    from alignflow.registry.evaluations import resolve_model

    converted = tmp_path / "smollm2"
    asked = []
    monkeypatch.setattr(real_models, "materialise", lambda name: asked.append(name) or converted)
    ref = resolve_model("smollm2-135m-instruct", None, tmp_path / "work")
    assert ref.path == str(converted) and asked == ["smollm2-135m-instruct"], "no tracking URI needed"
    with pytest.raises(FileNotFoundError):
        resolve_model("not-a-model-name", None, tmp_path / "work")
