"""What ``dapo train --resume`` reads before the run opens (``train/session.py``, ``engine/torch.py``): the run's
saved ``config.yaml`` read with the config reader's bounds, and the optimizer state checked against the model the
engine was built with before torch loads it (issue 54). The CLI cases are in tests/cli/test_cli_malformed_resume.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dapo_cli.engine.torch import OPTIMIZER_FILE, TorchEngine
from dapo_cli.errors import UserError
from dapo_cli.statefiles import read_state, write_state
from dapo_cli.train.session import read_saved_config

FIX = "put back the config.yaml the run wrote, or start a fresh run without --resume"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "config file not found: {path}"),
        (b"\x1f\x8b\x08\x00\xff\xfe\x00\x80" * 4, "config {path} is not a UTF-8 text file (byte 1)"),
        (b"data: [1,\n", "{path} is not valid YAML at line 2"),
        (b"trainer:\n  total_steps: " + b"9" * 5000 + b"\n", "{path} holds a value that cannot be read (Exceeds the limit"),
        (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "{path} nests its values too deeply to read"),
        (b"- a\n- b\n", "{path} must hold a mapping of sections"),
        (b"a: 1\na: 2\n", "{path} is not valid YAML at line 2: key 'a' is given twice"),
    ],
)
def test_the_runs_saved_config_is_read_with_the_config_readers_bounds(tmp_path: Path, content: bytes | None, problem: str) -> None:
    path = tmp_path / "config.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError) as info:
        read_saved_config(path)
    message = str(info.value)
    assert message.startswith("--resume: cannot use the run's saved config: " + problem.format(path=path))
    assert message.endswith(f"; {FIX}") and "\n" not in message
    path.write_text("trainer:\n  total_steps: 3\n")
    assert read_saved_config(path) == {"trainer": {"total_steps": 3}}


def engine_after_one_step() -> TorchEngine:
    torch.manual_seed(0)
    engine = TorchEngine(torch.nn.Linear(3, 2), lr=1e-2, weight_decay=0.0, warmup_steps=1, grad_clip=1.0)
    engine.module(torch.ones(4, 3)).square().sum().backward()
    engine.step()
    return engine


def test_optimizer_moments_that_do_not_fit_the_model_are_refused_before_torch_loads_them(tmp_path: Path) -> None:
    saved = engine_after_one_step()
    checkpoint = tmp_path / "checkpoints" / "step_000002"
    (tmp_path / "checkpoints" / "step_000001").mkdir(parents=True)
    saved.save_checkpoint(checkpoint / "engine")
    fresh = engine_after_one_step()
    fresh.load_checkpoint(checkpoint / "engine")  # as saved: loads
    state = read_state(checkpoint / "engine" / OPTIMIZER_FILE)
    state["optimizer"]["state"][1]["exp_avg"] = torch.zeros(5)  # torch's own load takes it; AdamW's step then fails
    write_state(checkpoint / "engine" / OPTIMIZER_FILE, state)
    before = {k: v.clone() for k, v in fresh.optimizer.state[fresh.optimizer.param_groups[0]["params"][1]].items()}
    with pytest.raises(UserError) as info:
        fresh.load_checkpoint(checkpoint / "engine")
    assert str(info.value) == (
        f"cannot resume from checkpoint {checkpoint}: engine/optimizer.safetensors: optimizer.state[1].exp_avg has shape [5]; "
        "the model's parameter has [2]; delete step_000002 so --resume takes step_000001, or start a fresh run without --resume"
    )
    after = fresh.optimizer.state[fresh.optimizer.param_groups[0]["params"][1]]
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing was loaded
