"""The one registry the stages, gates and judges keep their specs in."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from alignflow.named_registry import NamedRegistry
from tests.test_layers import LIBRARY, imported_modules


@dataclass(frozen=True)
class Spec:
    name: str
    value: int = 0


def test_a_taken_name_is_refused_unless_replaced_and_order_is_kept():
    registry: NamedRegistry[Spec] = NamedRegistry("widget")
    registry.add(Spec("b")), registry.add(Spec("a"))
    with pytest.raises(ValueError, match="a widget named 'a' is already registered"):
        registry.add(Spec("a", 1))
    registry.add(Spec("a", 2), replace=True)
    assert list(registry.all()) == ["b", "a"] and registry.get("a").value == 2 and "a" in registry
    registry.remove("a"), registry.remove("never there")
    with pytest.raises(ValueError, match=r"unknown widget 'a'; registered: \['b'\]"):
        registry.get("a")


def test_names_that_serve_as_identifiers_are_checked_and_the_reason_given():
    registry: NamedRegistry[Spec] = NamedRegistry("judge", "it names metrics")
    with pytest.raises(
        ValueError, match=r"judge name 'no-dash' must be a Python identifier \(it names metrics\)"
    ):
        registry.add(Spec("no-dash"))
    assert NamedRegistry("gate").add(Spec("any-name")).name == "any-name"


def test_the_three_registries_use_it_and_it_imports_nothing_of_alignflow():
    for module in ("training/registry.py", "promotion/gates.py", "evaluation/judge_registry.py"):
        assert "alignflow.named_registry" in imported_modules(LIBRARY / module), module
    assert not {m for m in imported_modules(LIBRARY / "named_registry.py") if m.startswith("alignflow")}
