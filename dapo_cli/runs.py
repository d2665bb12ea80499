"""What a training run of either algorithm needs besides its loop: seeds, run tags, the run's datasets
read once, the model's ``dapo_model.json``, and the checkpoint upload.

``dapo train`` (``train/session.py``) and ``--algo direct-advantage`` (``direct_advantage/``) both import
from here; this module imports neither.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dapo_cli.config.schema import DataConfig
from dapo_cli.data.loader import Prompt, build_prompts, dataset_manifest, load_rows
from dapo_cli.tracking.base import Tracker

MAX_MODEL_ARTIFACT_BYTES = 64 * 2**20
"""Final checkpoints up to this size are uploaded to MLflow; larger ones are logged by path."""


def derive_seed(seed: int, *parts: Any) -> int:
    """A 31-bit seed from the run seed and a purpose/step path, stable across processes and resumes."""
    text = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


def git_commit() -> str:
    """The commit of the ``dapo`` code that runs: HEAD of the checkout the package is imported from
    (``+dirty`` when it has uncommitted changes), else of the working directory, else ``unknown``."""
    package_dir = Path(__file__).resolve().parent
    for where in (package_dir, Path.cwd()):
        try:
            head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
            if head.returncode != 0 or not head.stdout.strip():
                continue
            status = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=5, check=False)
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")
    return "unknown"


@dataclasses.dataclass
class RunData:
    """A run's datasets read once: templated training prompts (too-long ones dropped), validation problems."""

    format: Callable[[Any], str]
    """Messages → the templated prompt text of the run's tokenizer."""
    count: Callable[[str], int]
    """Text → its number of tokens."""
    train_prompts: list[Prompt]
    train_dropped: int
    val_problems: list[Any]
    train_rows: list[int]
    """Rows read from each of ``data.train_files`` (and ``val_rows`` of ``data.val_files``)."""
    val_rows: list[int]

    def manifest(self, data: DataConfig) -> dict[str, Any]:
        """The dataset manifest's entries common to every algorithm (the caller adds its own after them)."""
        return {
            "train": dataset_manifest(data.train_files, self.train_rows, data.synthetic_train_size),
            "val": dataset_manifest(data.val_files, self.val_rows, data.synthetic_val_size),
            "train_prompts": len(self.train_prompts),
            "train_prompts_dropped_too_long": self.train_dropped,
        }


def read_run_data(data: DataConfig, tokenizer: Any) -> RunData:
    """``data.train_files`` as templated prompts (those over ``data.max_prompt_length`` dropped) and
    ``data.val_files`` as problems (ids prefixed with the file's index when there are several)."""
    from dapo_cli.eval.problems import group_problems
    from dapo_cli.models import format_prompt

    def fmt(messages: Any) -> str:
        return format_prompt(tokenizer, messages)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    train_rows_by_spec = [load_rows(s, split="train", synthetic_size=data.synthetic_train_size) for s in data.train_files]
    train_prompts, dropped = build_prompts([r for rows in train_rows_by_spec for r in rows], fmt, count, data.max_prompt_length)
    val_rows_by_spec = [load_rows(s, split="val", synthetic_size=data.synthetic_val_size) for s in data.val_files]
    val_problems = [
        dataclasses.replace(p, problem_id=f"{i}:{p.problem_id}") if len(val_rows_by_spec) > 1 else p
        for i, rows in enumerate(val_rows_by_spec)
        for p in group_problems(rows)
    ]
    return RunData(
        format=fmt, count=count, train_prompts=train_prompts, train_dropped=dropped, val_problems=val_problems,
        train_rows=[len(r) for r in train_rows_by_spec], val_rows=[len(r) for r in val_rows_by_spec],
    )


def run_tags(command: str, *, seed: int, variant: str, run_dir: Path) -> dict[str, str]:
    """The tags every training run carries (either algorithm): what ran, with which code, seed and
    variant, and where its files are."""
    return {
        "dapo.command": command,
        "dapo.git_commit": git_commit(),
        "dapo.seed": str(seed),
        "dapo.variant": variant,
        "dapo.run_dir": str(run_dir.resolve()),
    }


def upload_model(tracker: Tracker, model_dir: Path, artifact_path: str) -> None:
    """Copy a saved model folder into MLflow's artifacts when it is at most
    :data:`MAX_MODEL_ARTIFACT_BYTES` (a larger one is recorded by its path only)."""
    size = sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file())
    if size <= MAX_MODEL_ARTIFACT_BYTES:
        tracker.log_artifact(model_dir, artifact_path)


def read_model_info(model_dir: Path) -> dict[str, Any]:
    """The tiny model's ``dapo_model.json`` (base accuracy, warm-start recipe), when present."""
    path = model_dir / "dapo_model.json"
    if path.is_file():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return {}
    return {}
