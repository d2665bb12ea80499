"""Fixtures the malformed-input tables of this package point at (``malformed_harness.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


# ---------------------------------------------------------------- what the cases point at


@pytest.fixture(scope="module")
def models(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny policy, and copies of it with damaged weights (outside every case's working directory)."""
    root = tmp_path_factory.mktemp("damaged-models")
    out = {"model": tiny_model_dir}
    for name in ("trunc", "garbage", "wrongshape", "noweights"):
        shutil.copytree(tiny_model_dir, root / name)
        out[name] = root / name
    weights = "model.safetensors"
    data = (tiny_model_dir / weights).read_bytes()
    (out["trunc"] / weights).write_bytes(data[: len(data) // 2])  # a copy cut short
    (out["garbage"] / weights).write_bytes(bytes(range(256)) * 8)  # not a safetensors file at all
    (out["noweights"] / weights).unlink()
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(tiny_model_dir / weights)
    tensors[next(iter(tensors))] = torch.zeros(3, 3)  # complete file, tensor of the wrong shape
    save_file(tensors, out["wrongshape"] / weights, metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dapo_cli.data.schema import make_row, write_dapo_parquet

    path = tmp_path_factory.mktemp("data") / "three.parquet"
    write_dapo_parquet([make_row(f"What is {i} + 1?", str(i + 1), index=i) for i in range(3)], path)
    return path


@pytest.fixture(scope="module")
def read_only_dir(tmp_path_factory: pytest.TempPathFactory):
    """A read-only tmpfs mount (root ignores permission bits, not a read-only file system)."""
    path = tmp_path_factory.mktemp("read-only")
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root and mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True, check=False)


# ---------------------------------------------------------------- files a case creates in its working directory


@pytest.fixture
def case_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty working directory for one malformed-input case, with ``$MLFLOW_TRACKING_URI`` unset."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return cwd
