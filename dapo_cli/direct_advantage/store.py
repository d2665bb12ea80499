"""The run directory of a direct-advantage run: phase tables, models, and what is done.

Layout (``trainer.output_dir`` / experiment / run name)::

    runs/dapo-tiny-da/direct-advantage-s0/
        config.yaml                 the resolved config (rewritten when a restart changes later phases' settings)
        direct_advantage.json       stages done per iteration with their metrics; MLflow run ids; base validation
        iter_00/
            generate.parquet        every sampled solution; ``chosen`` marks the balanced few
            mc_values.parquet       one row per state: prefix, completions, their rewards, value target
            critic/                 backbone/ (save_pretrained) + value_head.safetensors + calibration.png
            critic.parquet          the critic's prediction for every state (split train / holdout)
            advantages.parquet      one row per (state, distinct candidate step): q, advantage, gap, kept
            actor/model/            the trained actor (save_pretrained; the next iteration's reference)
            actor.parquet           per kept candidate: target A/beta, reference and final log-probs
        summary.json

Every file is written atomically, and a stage counts as done only once recorded in
``direct_advantage.json`` (after its files), so a run killed at any point restarts at the
first stage not done (``--resume``), or at a chosen phase (``--from-phase NAME``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from dapo_cli.direct_advantage import STAGES
from dapo_cli.errors import UserError
from dapo_cli.fileio import atomic_path, write_json_atomic

STATE_FILE = "direct_advantage.json"
TABLES = {"generate": "generate", "mc_values": "mc_values", "critic": "critic", "advantages": "advantages", "actor": "actor"}


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows (same keys; scalars or lists of scalars) as a parquet file, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows) if rows else pa.table({})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise UserError(f"{path} is missing; rerun from its phase (--from-phase) or start a new run")
    return pq.read_table(path).to_pylist()


class RunStore:
    """Paths and the record of done stages of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.root = Path(run_dir)
        self.state_path = self.root / STATE_FILE
        self.state: dict[str, Any] = {"iterations": {}, "mlflow_run_ids": [], "config_changes": []}
        if self.state_path.is_file():
            self.state = json.loads(self.state_path.read_text(encoding="utf-8"))

    # ------------------------------------------------------------ paths

    def iter_dir(self, i: int) -> Path:
        return self.root / f"iter_{i:02d}"

    def table(self, i: int, phase: str) -> Path:
        return self.iter_dir(i) / f"{TABLES[phase]}.parquet"

    def critic_dir(self, i: int) -> Path:
        return self.iter_dir(i) / "critic"

    def actor_model(self, i: int) -> Path:
        return self.iter_dir(i) / "actor" / "model"

    def write(self, i: int, phase: str, rows: list[dict[str, Any]]) -> Path:
        path = self.table(i, phase)
        write_parquet(path, rows)
        return path

    def read(self, i: int, phase: str) -> list[dict[str, Any]]:
        return read_parquet(self.table(i, phase))

    # ------------------------------------------------------------ the record

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.state_path, self.state)

    def stages(self, i: int) -> dict[str, Any]:
        return self.state["iterations"].get(str(i), {})

    def done(self, i: int, stage: str) -> bool:
        return stage in self.stages(i)

    def record(self, i: int, stage: str, metrics: dict[str, float], **extra: Any) -> None:
        """Mark ``stage`` of iteration ``i`` done with its metrics (after its files are written)."""
        self.state["iterations"].setdefault(str(i), {})[stage] = {
            "metrics": metrics, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra,
        }
        self.save()

    def started(self) -> bool:
        return any(self.state["iterations"].values())

    def next_stage(self, iterations: int) -> tuple[int, str] | None:
        """The first stage not done, over ``iterations`` iterations (None: everything is done)."""
        for i in range(iterations):
            for stage in STAGES:
                if not self.done(i, stage):
                    return i, stage
        return None

    def latest_iteration(self) -> int:
        """The newest iteration with any stage done (0 when none)."""
        done = [int(k) for k, v in self.state["iterations"].items() if v]
        return max(done, default=0)

    def forget_from(self, i: int, stage: str) -> list[str]:
        """Undo ``stage`` and everything after it (this iteration's later stages, every later iteration),
        removing their files; returns what was forgotten, as ``iteration/stage``."""
        gone: list[str] = []
        start = STAGES.index(stage)
        for key in sorted(self.state["iterations"], key=int):
            it = int(key)
            if it < i:
                continue
            stages = self.state["iterations"][key]
            for name in list(stages):
                if it > i or STAGES.index(name) >= start:
                    stages.pop(name)
                    gone.append(f"{it}/{name}")
            if it > i:
                shutil.rmtree(self.iter_dir(it), ignore_errors=True)
        for name in STAGES[start:]:
            if name in TABLES:
                self.table(i, name).unlink(missing_ok=True)
            if name == "critic":
                shutil.rmtree(self.critic_dir(i), ignore_errors=True)
            if name == "actor":
                shutil.rmtree(self.actor_model(i).parent, ignore_errors=True)
        self.save()
        return gone
