"""The layer rule, read from the source: which package may import which (static, every import).

The library never imports Prefect or the orchestration layer (``alignflow.tasks`` and
``alignflow.flows``, which live in the package's namespace, not at the top of a user's path);
tasks never import flows; only the CLI sits above the flows; the loss math sits below the
research API; training stages never import the pipeline config that assembles them; and no
two library packages import each other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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


ORCHESTRATION = {"alignflow.tasks", "alignflow.flows"}
ABOVE_THE_LIBRARY = {*ORCHESTRATION, "alignflow.cli"}


def test_the_library_never_imports_the_orchestration_layers():
    graph = package_graph()
    library = {p: targets for p, targets in graph.items() if p.startswith("alignflow.")}
    offenders = {
        p: sorted(t & {"prefect", *ORCHESTRATION}) for p, t in library.items() if p not in ABOVE_THE_LIBRARY
    }
    assert not {p: t for p, t in offenders.items() if t}, offenders
    assert "alignflow.flows" not in graph["alignflow.tasks"], "a task wraps one library call, flows use tasks"
    # the CLI is the top layer's face: it may start flows; nothing below imports it
    assert not [p for p in graph if "alignflow.cli" in graph[p] and p != "alignflow.cli"]


def test_the_orchestration_layer_is_not_a_top_level_package():
    assert not (REPO / "flows").exists() and not (REPO / "tasks").exists()
    assert (LIBRARY / "flows" / "retrain.py").exists() and (LIBRARY / "tasks" / "training.py").exists()


def test_no_two_library_packages_import_each_other():
    graph = package_graph()
    library = {p for p in graph if p.startswith("alignflow.")}
    cycles = sorted((a, b) for a in library for b in graph[a] if b in library and a < b and a in graph[b])
    # the CLI is the top layer's face: it may import anything, nothing imports it
    assert not [c for c in cycles if "alignflow.cli" not in c], cycles


def test_losses_sit_below_the_research_api_and_stages_below_the_pipeline_config():
    graph = package_graph()
    assert "alignflow.rl" not in graph["alignflow.losses"]
    assert "alignflow.config" not in graph["alignflow.training"]


def _loads_mlflow(module: str) -> bool:
    """Whether importing ``module`` in a fresh interpreter loads MLflow."""
    code = f"import sys, {module}; print('mlflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return done.stdout.strip() == "True"


def test_promotion_decisions_read_no_store():
    """The gates and the decision are pure code: ``alignflow.promotion`` imports neither MLflow
    nor the registry that records its decisions, and importing it loads no MLflow."""
    assert not {"mlflow", "alignflow.registry"} & package_graph()["alignflow.promotion"]
    assert not _loads_mlflow("alignflow.promotion.gates")


def test_the_research_api_imports_no_tracking_store():
    """``alignflow.rl`` reports through the callbacks its caller passes, never to MLflow itself."""
    assert not {"mlflow", "alignflow.registry"} & package_graph()["alignflow.rl"]
    assert not _loads_mlflow("alignflow.rl.ppo, alignflow.rl.dpo, alignflow.rl.reward_model")


def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules a file imports when it runs (``if TYPE_CHECKING:`` blocks left out;
    ``from package import module`` counts the module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found & modules


def module_graph() -> dict[str, set[str]]:
    paths = {}
    for path in LIBRARY.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        paths[name] = path
    return {name: _runtime_imports(path, set(paths)) - {name} for name, path in paths.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that reach each other through imports (strongly connected, size > 1)."""
    reach = {m: set() for m in graph}
    for start in graph:
        todo = list(graph[start])
        while todo:
            module = todo.pop()
            if module not in reach[start]:
                reach[start].add(module)
                todo.extend(graph.get(module, ()))
    circles = {frozenset({m} | {o for o in reach[m] if m in reach[o]}) for m in graph if m in reach[m]}
    return sorted(sorted(c) for c in circles)


def test_no_module_imports_one_that_imports_it_back():
    assert import_circles(module_graph()) == []


def test_the_circle_check_finds_a_circle_through_a_third_module():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]
