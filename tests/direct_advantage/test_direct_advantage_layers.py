"""One stack for both algorithms: direct-advantage gets its engines from ``components`` and its checks from
``config/`` and ``cli/preflight``, never by constructing or importing a concrete engine itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dapo_cli

PACKAGE = Path(dapo_cli.__file__).resolve().parent
CONCRETE_ENGINES = (
    "dapo_cli.rollout.fast", "dapo_cli.rollout.hf", "dapo_cli.rollout.vllm",
    "dapo_cli.engine.torch", "dapo_cli.engine.deepspeed",
)


def imported_modules(path: Path) -> set[str]:
    """Every ``dapo_cli`` module a file imports, at the top or inside a function (``from a import b``
    counts as ``a`` and ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("dapo_cli")}


@pytest.mark.slow
def test_direct_advantage_imports_no_concrete_engine():
    files = sorted((PACKAGE / "direct_advantage").rglob("*.py"))
    assert files
    offenders = {
        f"{f.relative_to(PACKAGE)} imports {m}"
        for f in files for m in imported_modules(f) if m.startswith(CONCRETE_ENGINES)
    }
    assert not offenders, sorted(offenders)


def test_the_checker_sees_function_local_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from dapo_cli.rollout.hf import HFRolloutEngine\n", encoding="utf-8")
    assert "dapo_cli.rollout.hf" in imported_modules(sample)


def test_config_rules_import_no_algorithm_package():
    """The config layer holds direct-advantage's value rules itself (no arrow up into the algorithm); it may
    read the layers beside it (algo's constants, hardware.py: docs/architecture.md's rules)."""
    beside = ("dapo_cli.config", "dapo_cli.errors", "dapo_cli.fileio", "dapo_cli.hardware", "dapo_cli.algo")
    for f in sorted((PACKAGE / "config").rglob("*.py")):
        ups = [m for m in imported_modules(f) if not m.startswith(beside)]
        assert not ups, f"{f.name} imports {ups}"
