"""The layer rule, read from the source: which package may import which (static, every import).

The library never imports Prefect, tasks or flows; the loss math sits below the research API;
training stages never import the pipeline config that assembles them; and no two library
packages import each other.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "alignflow"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def package_of(module: str) -> str:
    """``alignflow.training.ppo`` -> ``alignflow.training``; a top-level module is its own package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "alignflow" else parts[0]


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in LIBRARY.rglob("*.py"):
        relative = path.relative_to(REPO).with_suffix("")
        source = package_of(".".join(relative.parts))
        for module in imported_modules(path):
            target = package_of(module)
            if target != source:
                graph[source].add(target)
    return graph


def test_the_library_never_imports_the_orchestration_layers():
    graph = package_graph()
    orchestration = {"prefect", "tasks", "flows"}
    # the CLI is the top layer's face: it may start flows
    offenders = {p: sorted(t & orchestration) for p, t in graph.items() if t & orchestration}
    offenders.pop("alignflow.cli", None)
    assert not offenders, offenders


def test_no_two_library_packages_import_each_other():
    graph = package_graph()
    library = {p for p in graph if p.startswith("alignflow.")}
    cycles = sorted((a, b) for a in library for b in graph[a] if b in library and a < b and a in graph[b])
    # the CLI is the top layer's face: it may import anything, nothing imports it
    assert not [c for c in cycles if "alignflow.cli" not in c], cycles
    assert not [p for p in library if "alignflow.cli" in graph[p] and p != "alignflow.cli"]


def test_losses_sit_below_the_research_api_and_stages_below_the_pipeline_config():
    graph = package_graph()
    assert "alignflow.rl" not in graph["alignflow.losses"]
    assert "alignflow.config" not in graph["alignflow.training"]
