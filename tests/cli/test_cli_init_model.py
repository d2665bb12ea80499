"""``dapo init-model``: builtin:tiny into the cache (once; --force rebuilds it) or into --output.

A 3-step warm-start of a 2-layer model, so each build takes about a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.tiny import QUICK_TINY, tiny_overrides
from typer.testing import CliRunner

import dapo_cli.warmstart as warmstart
from dapo_cli.cli import app
from dapo_cli.config import load_config
from dapo_cli.models.loading import MODEL_CARD, tiny_cache_path

QUICK = tiny_overrides(QUICK_TINY)
SETS = [arg for s in QUICK for arg in ("--set", s)]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DAPO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def init_model(*args: str) -> str:
    result = CliRunner().invoke(app, ["init-model", *SETS, *args])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())  # rich may wrap the line


@pytest.mark.slow
def test_builds_into_the_cache_once_and_force_rebuilds_the_same_model(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = load_config(None, QUICK).model.tiny
    assert tiny == QUICK_TINY
    path = tiny_cache_path(tiny)
    assert path.parent == cache and not path.exists()
    out = init_model()
    assert "tiny policy at" in out and "3 warm-start steps" in out and "on 4 held-out problems" in out
    card = json.loads((path / MODEL_CARD).read_text())
    assert card["fingerprint"] == tiny.fingerprint() and card["sft_steps"] == 3
    weights = (path / "model.safetensors").read_bytes()

    with monkeypatch.context() as m:  # cached: reported, not rebuilt
        m.setattr(warmstart, "warm_start", lambda *a, **k: pytest.fail("the cached model was rebuilt"))
        assert "tiny policy at" in init_model()
    init_model("--force")  # rebuilt from scratch: the same bytes (the build is deterministic)
    assert (path / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in cache.iterdir()) == [path.name]  # no temporary sibling left behind


@pytest.mark.slow
def test_output_writes_the_model_there_and_not_into_the_cache(tmp_path: Path, cache: Path) -> None:
    out = init_model("-o", "mine")
    card = json.loads((tmp_path / "mine" / MODEL_CARD).read_text())
    assert card["spec"] == "builtin:tiny" and card["sft_steps"] == 3 and "base accuracy" in out
    assert (tmp_path / "mine" / "model.safetensors").is_file() and not cache.exists()
