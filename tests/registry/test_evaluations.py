"""Registered models named on the command line (the registry side of ``alignflow eval``)."""

import pytest

from alignflow.registry.evaluations import parse_registered


def test_parse_registered_refs():
    assert parse_registered("models:/demo-reward@champion") == ("demo-reward", "champion")
    assert parse_registered("models:/demo-reward/3") == ("demo-reward", "3")
    assert parse_registered("outputs/reward") is None
    with pytest.raises(ValueError, match="models:/NAME@ALIAS"):
        parse_registered("models:/")
