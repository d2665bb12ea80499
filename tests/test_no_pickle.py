"""No file dapo reads is unpickled in full: every ``torch.load`` in ``dapo_cli/`` passes ``weights_only=True``, and
nothing calls ``pickle``'s loaders (``dapo_cli/statefiles.py`` is how checkpoint state is written and read).

Every module is parsed with ``ast``, so a call hidden in a function counts and a mention in a docstring does not;
the text ``weights_only=False`` may not appear anywhere (what ``grep -rn`` finds, the issue's own check).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dapo_cli"
UNPICKLERS = {"pickle.load", "pickle.loads", "pickle.Unpickler", "dill.load", "dill.loads", "cloudpickle.load",
              "cloudpickle.loads", "joblib.load", "marshal.load", "marshal.loads", "torch.serialization.load"}


def dotted(node: ast.AST) -> str:
    """``torch.load`` for the expression ``torch.load`` ('' for anything but names and attributes)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def offences(source: str, name: str) -> list[str]:
    """Where ``source`` may unpickle a file in full."""
    found = []
    if "weights_only=False" in source:
        found.append(f"{name}: the text weights_only=False")
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        called = dotted(node.func)
        safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords)
        if called == "torch.load" and not safe:
            found.append(f"{name}:{node.lineno}: torch.load without weights_only=True")
        if called in UNPICKLERS:
            found.append(f"{name}:{node.lineno}: {called}")
        if any(k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant) and k.value.value is False) for k in node.keywords):
            found.append(f"{name}:{node.lineno}: allow_pickle")
    return found


def test_nothing_in_the_package_unpickles_in_full() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 100
    found = [o for f in files for o in offences(f.read_text(encoding="utf-8"), str(f.relative_to(PACKAGE)))]
    assert found == []


def test_the_scanner_finds_each_way_back() -> None:
    sample = (
        "import torch, pickle, numpy\n"
        "def f(p):\n"
        "    torch.load(p)\n"
        "    torch.load(p, weights_only=flag)\n"
        "    pickle.loads(p.read_bytes())\n"
        "    numpy.load(p, allow_pickle=True)\n"
        "    torch.load(p, map_location='cpu', weights_only=True)\n"
    )
    assert offences(sample, "m.py") == [
        "m.py:3: torch.load without weights_only=True", "m.py:4: torch.load without weights_only=True",
        "m.py:5: pickle.loads", "m.py:6: allow_pickle",
    ]
    assert offences('"""docs"""\nx = dict(weights_only=False)\n', "d.py") == ["d.py: the text weights_only=False"]
