"""Shared fixtures: a tiny policy saved on disk, and the shared real data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ("fixtures.model_families",)  # qwen2_dir, mistral_dir, family: real tokenizers, offline

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (real public files; never copied into the repo)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} is not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny char-level policy (hidden 32, 2 layers) + tokenizer with chat template.

    Built in about a second with ``save_pretrained``; loadable by ``load_policy`` and
    ``dapo eval``/``dapo train --set model.path=...``. Being untrained, it answers almost
    nothing correctly: tests that need mixed groups use fake rollouts instead.
    """
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.models import build_char_tokenizer, save_policy
    from dapo_cli.models.tiny import build_tiny_model_for

    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=128)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model_for(cfg, tokenizer)
    out = tmp_path_factory.mktemp("tiny-model")
    save_policy(model, tokenizer, out)
    return out


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread: the tiny models gain nothing from more, and on a busy 2-core
    machine two threads per process oversubscribe the cores (measured 5-20x slower)."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # subprocesses started by the e2e tests
