"""``model.path: gguf:NAME``: a registered GGUF's imported folder, found by its registered sha256.

These tests fake the imported folder (a config.json and the import card), so they need neither
the wheel nor the ``gguf`` package; the real import is tested in ``test_models_gguf.py``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.errors import UserError
from dapo_cli.models.context import context_of_spec
from dapo_cli.models.gguf import IMPORT_CARD, NAMED_GGUF, imported_dir, named_model_dir
from dapo_cli.models.loading import resolve_model

NAME = "smollm2-135m-instruct"


def fake_import(cache: Path, *, sha: str | None = None, dtype: str = "float32") -> Path:
    """What ``import_gguf`` leaves behind, minus the weights: config.json and the card."""
    entry = NAMED_GGUF[NAME]
    folder = imported_dir(cache, entry.sha256, dtype)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 8192}))
    card = {"sha256": sha or entry.sha256, "dtype": dtype, "source": "test"}
    (folder / IMPORT_CARD).write_text(json.dumps(card))
    return folder


def test_a_cached_import_is_found_from_the_registered_hash_without_the_file(tmp_path: Path) -> None:
    folder = fake_import(tmp_path)
    assert folder.name == "gguf-" + NAMED_GGUF[NAME].sha256[:16] + "-float32"
    assert named_model_dir(NAME, tmp_path) == folder
    assert resolve_model(f"gguf:{NAME}", TinyModelConfig(), tmp_path) == folder


def test_the_context_of_a_named_model_is_read_from_its_imported_config(tmp_path: Path, monkeypatch) -> None:
    folder = fake_import(tmp_path)
    monkeypatch.setenv("DAPO_CACHE", str(tmp_path))
    assert context_of_spec(f"gguf:{NAME}", 64) == (8192, f"max_position_embeddings in {folder / 'config.json'}")


def test_a_card_for_other_bytes_is_not_taken_for_the_import(tmp_path: Path, monkeypatch) -> None:
    fake_import(tmp_path, sha="0" * 64)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "gguf" else real_find_spec(n, *a))
    with pytest.raises(UserError, match=r"gguf:smollm2-135m-instruct is not imported yet .*run make smollm2"):
        named_model_dir(NAME, tmp_path)


def test_without_the_gguf_package_a_missing_import_says_how_to_get_it(tmp_path: Path, monkeypatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "gguf" else real_find_spec(n, *a))
    with pytest.raises(UserError) as err:
        named_model_dir(NAME, tmp_path)
    assert "\n" not in str(err.value) and "make smollm2" in str(err.value)


def test_an_unknown_name_lists_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"unknown model 'gguf:nope' \(registered: gguf:smollm2-135m-instruct\)"):
        resolve_model("gguf:nope", TinyModelConfig(), tmp_path)
