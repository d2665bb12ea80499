"""The harness behind every malformed-input table: one case is a command line, the error it must
end in, and the files its working directory starts with.

The promise of the CLI (docs/reliability.md): whatever is wrong with what the user typed or
pointed at, ``dapo`` prints one line starting ``error:`` that says what to fix, exits 2, and
writes nothing: no output file, no run directory, no MLflow store. Each case runs in a fresh,
otherwise empty working directory with ``$MLFLOW_TRACKING_URI`` unset, and the directory
listing after the command must equal the listing before it. The tables live in
``test_cli_malformed*.py``; the fixtures they point at in ``conftest.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dapo_cli.cli import app

ENV = {"MLFLOW_TRACKING_URI": None, "DAPO_PARENT_RUN_ID": None, "DAPO_EXTRA_TAGS": None, "HF_HUB_OFFLINE": "1",
       "COLUMNS": "200"}


# ---------------------------------------------------------------- files a case creates in its working directory


def _corrupt_run(cwd: Path) -> None:
    """A run of the embedded experiment whose only checkpoint has truncated weights (resume must refuse it)."""
    import torch

    run = cwd / "runs" / "dapo-tiny" / "dapo-s0"
    ckpt = run / "checkpoints" / "step_000001"
    (ckpt / "engine").mkdir(parents=True)
    (ckpt / "model").mkdir()
    (ckpt / "model" / "config.json").write_text("{}", encoding="utf-8")
    (ckpt / "model" / "model.safetensors").write_bytes((64).to_bytes(8, "little") + b"{")
    torch.save({"step": 1}, ckpt / "trainer_state.pt")
    (run / "checkpoints" / "latest").write_text("step_000001\n", encoding="utf-8")
    (run / "config.yaml").write_text("{}\n", encoding="utf-8")
    (run / ".lock").write_text("1\n", encoding="utf-8")  # every run that ever trained has one


def _empty_parquet(cwd: Path) -> None:
    from dapo_cli.data.schema import write_dapo_parquet

    write_dapo_parquet([], cwd / "empty.parquet")


SETUPS: dict[str, Callable[[Path], object]] = {
    "afile": lambda cwd: (cwd / "afile").write_text("x\n", encoding="utf-8"),
    "adir": lambda cwd: (cwd / "adir").mkdir(),
    "bin.yaml": lambda cwd: (cwd / "bin.yaml").write_bytes(b"\x1f\x8b\x08\x00\xff\xfe\x00\x80" * 16),
    "bad.yaml": lambda cwd: (cwd / "bad.yaml").write_text("data: [1,\n", encoding="utf-8"),
    "list.yaml": lambda cwd: (cwd / "list.yaml").write_text("- a\n- b\n", encoding="utf-8"),
    "empty.jsonl": lambda cwd: (cwd / "empty.jsonl").write_text("", encoding="utf-8"),
    "empty.parquet": _empty_parquet,
    "corrupt-run": _corrupt_run,
}



@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    expect: str
    """A fragment of the error line (after ``error: ``)."""
    setup: tuple[str, ...] = ()
    read_only: bool = False
    """Needs the read-only tmpfs (``{ro}`` in the args)."""
    progress_first: bool = False
    """The failure comes after the command reported progress (the model was loading): other stderr
    lines may come before the error line, which must still be the only ``error:`` line and the last."""


def case(id: str, *args: str, expect: str, setup: tuple[str, ...] = (), **kw: bool) -> Case:
    return Case(id, args, expect, setup, **kw)



def listing(root: Path) -> list[str]:
    """Every path under ``root`` (relative): a directory, a link and its target (links are not followed: a
    case may plant a loop or a link to a device), a FIFO, or a regular file with its size and SHA-256, so a
    file a command changed in place (another program's database) shows as changed."""
    import hashlib
    import stat

    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            out.append(f"{rel} -> {os.readlink(path)}")
        elif stat.S_ISDIR(mode):
            out.append(rel + "/")
        elif not stat.S_ISREG(mode) or path.name == ".lock":
            out.append(rel)
        else:
            out.append(f"{rel} ({path.stat().st_size} bytes, {hashlib.sha256(path.read_bytes()).hexdigest()[:16]})")
    return out


def run_case(c: Case, places: dict[str, str], cwd: Path) -> None:
    """Run ``c`` in ``cwd`` (already the working directory) and assert the promise: exit 2, one
    ``error:`` line holding ``c.expect``, no traceback, the directory listing unchanged."""
    for name in c.setup:
        SETUPS[name](cwd)
    before = listing(cwd)

    result = CliRunner().invoke(app, [a.format(**places) for a in c.args], env=ENV)

    stderr = result.stderr
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output and "Traceback" not in stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr
    if not c.progress_first:
        assert lines == errors, stderr
    expected = c.expect.format(**places)
    assert expected in errors[0], (expected, errors[0])
    assert listing(cwd) == before, "the command left files behind"


def places_for(c: Case, request: pytest.FixtureRequest, models: dict[str, Path], dataset: Path) -> dict[str, str]:
    """What ``{name}`` in a case's arguments stands for."""
    places = {name: str(path) for name, path in models.items()} | {"data": str(dataset)}
    if c.read_only:
        places["ro"] = str(request.getfixturevalue("read_only_dir"))
    return places
