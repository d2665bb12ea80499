"""Files a checkpoint folder from elsewhere may hold: a pickle that writes a marker file when it is unpickled
(what a hostile file holds), an older dapo's ``.pt`` state files (:func:`to_legacy`) and config layout
(:func:`as_written_by`, after the fixtures in ``tests/config/older_configs/``).

``plant(path, marker)`` writes it with ``torch.save`` (the format of the ``.pt`` files older dapo checkpoints
hold); :func:`live` proves a payload really runs when unpickled in full, so a test that sees no marker after
dapo read the folder shows that dapo did not unpickle it, not that the payload is a dud.
"""

from __future__ import annotations

import pathlib
from pathlib import Path

import torch


class Payload:
    """Unpickling this calls ``Path(marker).write_text("ran")``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.write_text, (pathlib.Path(self.marker), "ran"))


def plant(path: Path, marker: Path, **plain: object) -> Path:
    """``path`` as a torch file holding ``plain`` values plus the payload (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**plain, "payload": Payload(marker)}, path)
    return path


def live(tmp: Path) -> bool:
    """True when a planted file written here runs its payload once unpickled in full (then cleaned up)."""
    marker = tmp / "live-marker"
    path = plant(tmp / "live.pt", marker)
    torch.load(path, weights_only=False)  # the test's own proof that the payload is real; dapo never does this
    ran = marker.read_text() == "ran"
    marker.unlink()
    path.unlink()
    return ran


def to_legacy(checkpoint: Path) -> Path:
    """Rewrite a checkpoint of this dapo as an older dapo wrote it: ``trainer_state.pt`` holding rank 0's RNG
    state, ``engine/optimizer.pt`` (``torch.save``, the same values); the new state files removed."""
    import json

    from dapo_cli.statefiles import read_state

    state = json.loads((checkpoint / "trainer_state.json").read_text())
    rng = checkpoint / "rng" / "rank_00000.safetensors"
    torch.save({**state, "rng": read_state(rng)}, checkpoint / "trainer_state.pt")
    (checkpoint / "trainer_state.json").unlink()
    rng.unlink()
    optimizer = checkpoint / "engine" / "optimizer.safetensors"
    torch.save(read_state(optimizer), checkpoint / "engine" / "optimizer.pt")
    optimizer.unlink()
    return checkpoint


OLDER_CONFIGS = Path(__file__).resolve().parent / "config" / "older_configs"
"""config.yaml files as dapo wrote them at earlier commits (each names its commit)."""


def as_written_by(saved: dict, commit: str) -> dict:
    """``saved`` (a config as nested dicts) with only the keys the config dapo wrote at ``commit`` has, and no
    ``schema_version``: how that older dapo would have saved this config."""
    import yaml

    def keep(data: dict, older: dict) -> dict:
        return {k: keep(v, older[k]) if isinstance(v, dict) else v for k, v in data.items() if k in older}

    return keep(saved, yaml.safe_load((OLDER_CONFIGS / f"{commit}.yaml").read_text()))
