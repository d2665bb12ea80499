"""Imports point one way (docs/architecture.md): no cycle among dapo_cli modules, the bottom layers
(config/, algo/, data/, models/, rewards/) import nothing above them, and the two algorithms share only
``runs.py``: neither ``train/`` nor ``direct_advantage/`` imports the other, and ``runs.py`` neither.

Every ``dapo_cli`` module is parsed with ``ast``; an import anywhere in a module counts (one inside a
function too: it runs, and ties the modules together all the same), except under ``if TYPE_CHECKING:``
(annotations only, never executed).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dapo_cli"

BOTTOM_LAYERS = ("config", "algo", "data", "models", "rewards")
"""Packages that may import only each other and the leaf utilities below."""

TRAIN, DIRECT_ADVANTAGE, RUNS = "dapo_cli.train", "dapo_cli.direct_advantage", "dapo_cli.runs"

WING_RULES = ((RUNS, (TRAIN, DIRECT_ADVANTAGE)), (DIRECT_ADVANTAGE, (TRAIN,)), (TRAIN, (DIRECT_ADVANTAGE,)))
"""``(package, packages it must not reach)``: what both algorithms share is in ``runs.py``, which imports neither;
``direct_advantage/`` never loads the DAPO loop's package, nor ``train/`` direct-advantage."""

LEAF_UTILITIES = ("dapo_cli", "dapo_cli.errors", "dapo_cli.fileio", "dapo_cli.hardware", "dapo_cli.redact")
"""Modules the bottom layers may import besides each other: each imports no dapo_cli module but
another of these (asserted below; ``fileio`` raises ``errors``' UserError with ``redact``'s escapes).
``dapo_cli`` itself is the package's ``__init__`` (the version string only)."""

def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node`` except the bodies of ``if TYPE_CHECKING:`` (their ``else`` runs)."""
    for child in ast.iter_child_nodes(node):
        yield child
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for orelse in child.orelse:
                yield orelse
                yield from _runtime_nodes(orelse)
        else:
            yield from _runtime_nodes(child)


def _module_of(name: str) -> str | None:
    """The dapo_cli module that ``import name`` loads last (a name inside a module: that module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, *, annotations: bool = False) -> set[str]:
    """The dapo_cli modules ``module`` imports at run time (``annotations``: and under ``if TYPE_CHECKING:``)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str | None] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree) if annotations else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(_module_of(a.name) for a in node.names if a.name.split(".")[0] == "dapo_cli")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base.split(".")[0] != "dapo_cli":
                continue
            # `from pkg import mod` imports the submodule; `from mod import name` the module
            found.update(_module_of(f"{base}.{a.name}") if f"{base}.{a.name}" in MODULES else _module_of(base) for a in node.names)
    found.discard(None)
    found.discard(module)
    return {m for m in found if m is not None}


GRAPH = {m: imports_of(m) for m in MODULES}
TYPED_GRAPH = {m: imports_of(m, annotations=True) for m in MODULES}
"""With the annotation-only imports: a cycle there is a type in the wrong module (issue 51: ``PrepareOptions``)."""
EDGES = {(a, b) for a, targets in GRAPH.items() for b in targets}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in BOTTOM_LAYERS else None


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def reachable(graph: dict[str, set[str]], module: str) -> set[str]:
    """Every module ``module`` imports at run time, directly or through the modules it imports."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def wing_crossings(graph: dict[str, set[str]]) -> list[str]:
    """``module -> target`` for each module of a :data:`WING_RULES` package that reaches a package it must not."""
    return [
        f"{module} -> {target}"
        for package, forbidden in WING_RULES
        for module in sorted(graph) if in_package(module, package)
        for target in sorted(reachable(graph, module)) if any(in_package(target, f) for f in forbidden)
    ]


def test_the_walk_sees_the_package() -> None:
    # the walk finds real edges: top-level ones and a function-local one
    assert "dapo_cli.data.schema" in GRAPH["dapo_cli.data.prepare"]
    assert "dapo_cli.data.prepare" in GRAPH["dapo_cli.data.registry"]  # imported inside convert_raw
    assert "dapo_cli.eval.generations" in GRAPH["dapo_cli.eval.run"]


def test_type_checking_imports_do_not_count() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nelse:\n    import b\ndef f():\n    import c\n")
    names = {a.name for n in _runtime_nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    assert names == {"b", "c"}


def test_cycles_finds_each_loop_and_nothing_else() -> None:
    # a -> b -> c -> a is one loop, d only points into it, e -> f -> e is another; g is alone
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["e", "f"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_warm_start_sits_above_the_models_layer() -> None:
    # the one edge issue 27 ended last: models/ builds no policy; warmstart (above it) samples through the factory
    assert "dapo_cli.models.warmstart" not in MODULES and layer("dapo_cli.warmstart") is None
    assert "dapo_cli.warmstart" in GRAPH["dapo_cli.train.session"] and "dapo_cli.components" in GRAPH["dapo_cli.warmstart"]


def test_no_import_cycle() -> None:
    assert cycles(GRAPH) == []


def test_bottom_layers_import_nothing_above_them() -> None:
    upward = sorted(
        (m, t)
        for m, t in EDGES
        if layer(m) is not None and layer(t) is None and t not in LEAF_UTILITIES
    )
    assert upward == [], "\n".join(f"{m} -> {t}" for m, t in upward)


@pytest.mark.parametrize("leaf", LEAF_UTILITIES)
def test_leaf_utilities_are_leaves(leaf: str) -> None:
    assert GRAPH[leaf] <= set(LEAF_UTILITIES) - {leaf}


def test_the_wing_rules_catch_a_crossing_direct_or_through_another_module() -> None:
    graph = {
        "dapo_cli.runs": {"dapo_cli.config"},
        "dapo_cli.config": set(),
        "dapo_cli.trainer_notes": set(),  # a name that only begins like the package is not in it
        "dapo_cli.direct_advantage.run": {"dapo_cli.runs", "dapo_cli.trainer_notes"},
        "dapo_cli.train.session": {"dapo_cli.runs"},
        "dapo_cli.train.loop": {"dapo_cli.train.session"},
    }
    assert wing_crossings(graph) == []
    graph["dapo_cli.config"] = {"dapo_cli.train.loop"}  # runs, and through it direct-advantage, now reach the loop
    graph["dapo_cli.train.session"] = {"dapo_cli.runs", "dapo_cli.direct_advantage"}
    graph["dapo_cli.direct_advantage"] = set()
    assert wing_crossings(graph) == [
        "dapo_cli.runs -> dapo_cli.direct_advantage",
        "dapo_cli.runs -> dapo_cli.train.loop",
        "dapo_cli.runs -> dapo_cli.train.session",
        "dapo_cli.direct_advantage.run -> dapo_cli.train.loop",
        "dapo_cli.direct_advantage.run -> dapo_cli.train.session",
        "dapo_cli.train.loop -> dapo_cli.direct_advantage",
        "dapo_cli.train.session -> dapo_cli.direct_advantage",
    ]


def test_the_algorithms_share_runs_and_import_each_other_not() -> None:
    # the rules are about real modules: both algorithms import runs.py, and the training package holds the loop
    assert RUNS in GRAPH["dapo_cli.direct_advantage.launch"] and RUNS in GRAPH["dapo_cli.train.session"]
    assert "dapo_cli.train.loop" in GRAPH[TRAIN] and "dapo_cli.train.worker" in GRAPH["dapo_cli.train.rounds"]
    crossings = wing_crossings(GRAPH)
    assert crossings == [], "\n".join(crossings)


def test_no_cycle_even_through_annotation_only_imports() -> None:
    # data/manifest.py annotated with data/prepare.py's PrepareOptions while prepare imported manifest: the options
    # moved down to data/options.py, below both
    assert cycles(TYPED_GRAPH) == []


def test_the_batch_module_imports_no_dapo_module_it_is_below_every_engine() -> None:
    # rollout/, engine/, train/ and algo's callers build on batch.py; it annotated with rollout/base.py's Rollouts
    # (a climbing import): Rollouts now lives in batch.py beside the RolloutBatch it becomes
    assert TYPED_GRAPH["dapo_cli.batch"] == set()
    assert "dapo_cli.batch" in GRAPH["dapo_cli.rollout.base"]
