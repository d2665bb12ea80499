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
import time
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass
class Watched:
    """A finished child process: its exit status, output and peak resident memory (bytes)."""

    returncode: int
    stdout: str
    stderr: str
    peak: int


def run_watched(cmd: Sequence[str], *, env: dict[str, str], cwd: Path | str | None = None, every: float = 0.2) -> Watched:
    """Run ``cmd`` and read its ``VmHWM`` (the kernel's high-water mark of its resident memory) every ``every``
    seconds until it exits: the peak of a process the kernel kills for memory is still known (the last read)."""
    import subprocess
    import tempfile
    import threading

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(list(cmd), env=env, cwd=cwd, stdout=out, stderr=err, text=True)
        peak = [0]
        status = Path(f"/proc/{proc.pid}/status")

        def watch() -> None:
            while proc.poll() is None:
                try:
                    for line in status.read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            peak[0] = max(peak[0], int(line.split()[1]) * 1024)
                except OSError:
                    return
                time.sleep(every)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        proc.wait()
        watcher.join()
        out.seek(0), err.seek(0)
        return Watched(proc.returncode, out.read(), err.read(), peak[0])


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


SMOLLM2_SMALL = {"data.train_batch_size": 4, "rollout.n": 4, "rollout.max_response_length": 32, "algorithm.overlong_buffer.len": 8,
                 "trainer.ppo_mini_batch_size": 2, "trainer.ppo_micro_batch_size": 8}
"""``--real`` step-time benchmarks: ``experiments/smollm2-135m.yaml`` (SmolLM2-135M) at a size where a step
takes seconds, not minutes, on 2 cores."""

WORKLOADS = {False: "tiny policy, 16 prompts x 8 samples, <= 64 tokens", True: "SmolLM2-135M, 4 prompts x 4 samples, <= 32 tokens"}
"""The step-time benchmarks' workloads in words, by ``--real``: ``experiments/tiny.yaml`` or :data:`SMOLLM2_SMALL`."""


def timed_run_settings(work: Path, steps: int) -> dict[str, object]:
    """``--set`` values of a step-time run: ``steps`` steps with no validation, periodic checkpoint, sample table
    or collapse stop, its runs and MLflow store (experiment ``bench``) under ``work``."""
    return {
        "trainer.total_steps": steps, "trainer.test_freq": 0, "trainer.save_freq": 0, "trainer.log_samples_freq": 0,
        "trainer.collapse_patience": 0, "data.val_files": "[]", "trainer.output_dir": work / "runs",
        "tracking.tracking_uri": f"sqlite:///{work / 'mlflow.db'}", "tracking.experiment": "bench",
    }


def step_medians(work: Path, keys: Sequence[str], first_step: int) -> dict[str, float]:
    """Median over steps ``>= first_step`` of each metric in ``keys`` of the one run :func:`timed_run_settings` recorded."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("bench").experiment_id])
    return {key: median([m.value for m in client.get_metric_history(run.info.run_id, key) if m.step >= first_step]) for key in keys}
