"""The ablation package imports one way: no cycle among dapo_cli/ablate/*.py (function-local imports count,
``if TYPE_CHECKING:`` blocks do not), and nothing outside the CLI imports the ablation manager."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dapo_cli

PACKAGE = Path(dapo_cli.__file__).parent
ABLATE = PACKAGE / "ablate"


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def imported_modules(path: Path, package: str) -> set[str]:
    """Every ``dapo_cli...`` module (or ``module.name``) that ``path`` imports, anywhere in the file but under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m.startswith("dapo_cli")}


def ablate_graph() -> dict[str, set[str]]:
    """``module -> ablate modules it imports`` for every module of dapo_cli/ablate/ (short names; ``__init__`` left out:
    it only re-exports)."""
    names = {p.stem for p in ABLATE.glob("*.py")} - {"__init__"}
    graph = {}
    for name in names:
        found = imported_modules(ABLATE / f"{name}.py", "dapo_cli.ablate")
        graph[name] = {m.split(".")[2] for m in found if m.startswith("dapo_cli.ablate.") and m.split(".")[2] in names} - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_find_cycle_finds_one_and_only_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imported_modules_counts_function_local_imports_and_skips_type_checking(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "from dapo_cli.ablate import variants\n"
        "if TYPE_CHECKING:\n    from dapo_cli.ablate.report import AblationReport\n"
        "def f():\n    from .store import child_runs\n"
    )
    found = imported_modules(path, "dapo_cli.ablate")
    assert {"dapo_cli.ablate.variants", "dapo_cli.ablate.store"} <= found
    assert not any(m.startswith("dapo_cli.ablate.report") for m in found)


def test_no_import_cycle_inside_the_ablate_package() -> None:
    graph = ablate_graph()
    assert {"runner", "child", "launchers", "pool", "slurm", "store", "results", "report", "mechanisms", "plots"} <= set(graph)
    assert find_cycle(graph) is None, f"import cycle in dapo_cli/ablate/: {' -> '.join(find_cycle(graph) or [])}"


def test_the_layers_of_the_ablate_package() -> None:
    """The result types, the statistics and the axes import no other ablate module, the variants only the axes; the
    MLflow reads only the types; the child's command and environment only the variants; nothing below the driver
    imports it."""
    graph = ablate_graph()
    assert graph["results"] == set() and graph["stats"] == set() and graph["axes"] == set()
    assert graph["variants"] == {"axes"}
    assert graph["store"] == {"results"}
    assert graph["child"] == {"variants"}
    assert graph["sequential"] <= {"stats", "axes"}  # the rule's comparisons read the axis names, not the plan
    assert not any("runner" in deps for deps in graph.values())


@pytest.mark.slow
def test_only_the_cli_imports_the_ablation_manager() -> None:
    """``dapo train`` (session, train, direct_advantage, cli/train) reads DAPO_EXTRA_TAGS through tracking.tags, not ablate."""
    outside = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("ablate", "cli"):
            continue
        package = ".".join(("dapo_cli", *rel.parent.parts))
        if any(m == "dapo_cli.ablate" or m.startswith("dapo_cli.ablate.") for m in imported_modules(path, package)):
            outside.append(str(rel))
    assert outside == []
    train_cli = imported_modules(PACKAGE / "cli" / "train.py", "dapo_cli.cli")
    assert "dapo_cli.tracking.tags" in train_cli and not any(m.startswith("dapo_cli.ablate") for m in train_cli)
