"""Helpers shared by the benchmark scripts (not a benchmark itself; ``make bench`` runs the others).

- :func:`build_policy_dir`: the random-init Qwen2 directory of the issue (hidden 128, 4 layers, the
  character vocabulary) or a larger one, saved the way ``dapo`` and TRL both load it;
- :func:`machine`: the lines every table prints about the machine (``lscpu`` model, cores, torch);
- :func:`table`: fixed-width rows.

Only the standard library is imported at module level, so TRL's venv can import this file too.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SMALL = {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 512}
"""The issue's ~1.06 M-parameter model (the tiny default's shape, random init)."""

LARGE = {"hidden_size": 256, "num_layers": 8, "num_heads": 8, "intermediate_size": 1024}
"""A ~8.4 M-parameter model of the same family (for the update-throughput table)."""


def build_policy_dir(out: Path, shape: dict[str, int] = SMALL, *, seed: int = 0, max_positions: int = 256) -> Path:
    """A random-init Qwen2 causal LM with the character tokenizer, ``save_pretrained`` into ``out``.

    The tokenizer is saved as a plain ``PreTrainedTokenizerFast`` (``tokenizer.json``); loaders must
    read it with that class (``dapo``'s ``load_policy`` does; the TRL worker does too), because
    ``AutoTokenizer`` beside a qwen2 config returns a byte-level Qwen2 tokenizer that drops spaces.
    """
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.models import build_char_tokenizer, save_policy
    from dapo_cli.models.tiny import build_tiny_model_for

    cfg = TinyModelConfig(architecture="qwen2", max_position_embeddings=max_positions, seed=seed, **shape)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model_for(cfg, tokenizer)
    save_policy(model, tokenizer, out)
    return out


def count_parameters(path: Path) -> int:
    from dapo_cli.models import load_policy

    model, _ = load_policy(path)
    return sum(p.numel() for p in model.parameters())


def machine() -> list[str]:
    """``lscpu`` model name and cores, the bf16 flags, Python/torch versions (one line each)."""
    model, cores, flags = "unknown", str(os.cpu_count()), ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = dict(re.findall(r"^([^:\n]+):\s*(.*)$", out, flags=re.MULTILINE))
        model = fields.get("Model name", model)
        cores = f"{fields.get('CPU(s)', cores)} CPUs ({fields.get('Core(s) per socket', '?')} cores/socket, " \
                f"{fields.get('Thread(s) per core', '?')} thread/core)"
        flags = " ".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in fields.get("Flags", "").split())
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        versions = f"torch {torch.__version__}, Python {platform.python_version()}"
    except ImportError:
        versions = f"Python {platform.python_version()}"
    try:
        load = "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = ""
    return [f"machine: {model}; {cores}; flags: {flags or 'none of avx512f/avx512_bf16/amx_bf16'}",
            f"software: {versions}; {load} at start"]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(header: Sequence[str], rows: Sequence[Sequence[object]], widths: Sequence[int] | None = None) -> str:
    """Right-aligned columns (the first left-aligned); floats with 3 decimals unless already strings."""
    cells = [[_cell(c) for c in row] for row in rows]
    widths = widths or [max(len(str(h)), *(len(r[i]) for r in cells)) + 2 for i, h in enumerate(header)]
    lines = ["".join(str(h).ljust(w) if i == 0 else str(h).rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    lines += ["".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a benchmark child: ``threads`` OpenMP/MKL threads, no launcher variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore",
                "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return env


def run_dapo_in_process(words: Sequence[str]) -> None:
    """``dapo WORDS`` in this process (so a benchmark's patches see it); a failing exit is raised."""
    import sys

    from dapo_cli.cli import main

    sys.argv = ["dapo", *words]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise


def train_medians(
    config: Path, sets: dict[str, object], keys: Sequence[str], *, threads: int, first_step: int, flags: Sequence[str] = (),
) -> tuple[dict[str, float], float]:
    """``dapo train CONFIG FLAGS --set k=v ...`` in a temporary folder (no validation, checkpoints or sample
    tables; its own MLflow store) with ``threads`` OpenMP threads; the median of each of ``keys`` over steps
    ``>= first_step`` (nan when never logged) and the run's wall time. A failing run ends the benchmark."""
    import sys
    import tempfile
    import time

    with tempfile.TemporaryDirectory(prefix="dapo-bench-") as tmp:
        work = Path(tmp)
        every = {
            "trainer.test_freq": 0, "trainer.save_freq": 0, "trainer.log_samples_freq": 0, "trainer.collapse_patience": 0,
            "data.val_files": "[]", "trainer.output_dir": work / "runs", "tracking.tracking_uri": f"sqlite:///{work / 'mlflow.db'}",
            "tracking.experiment": "bench", **sets,
        }
        words = [sys.executable, "-m", "dapo_cli", "train", str(config), *flags]
        for key, value in every.items():
            words += ["--set", f"{key}={value}"]
        t0 = time.perf_counter()
        proc = subprocess.run(words, env=thread_env(threads), capture_output=True, text=True, cwd=work)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"dapo train failed:\n{proc.stderr[-3000:]}")
        from mlflow import MlflowClient

        client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
        (mlrun,) = client.search_runs([client.get_experiment_by_name("bench").experiment_id])
        history = {key: client.get_metric_history(mlrun.info.run_id, key) for key in keys}
        return {key: median([m.value for m in history[key] if m.step >= first_step]) for key in keys}, wall
