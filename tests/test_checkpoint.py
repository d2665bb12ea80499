"""Run directories and checkpoints under concurrency, kills and corruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dapo_cli.checkpoint import CheckpointManager, RunLock, checkpoint_problem, claim_run_dir, rng_state, safetensors_problem
from dapo_cli.errors import UserError
from dapo_cli.statefiles import write_state


def complete_checkpoint(path: Path, step: int, *, legacy: bool = False) -> Path:
    """A checkpoint as this dapo writes it (trainer_state.json, rng/rank_00000.safetensors), or as an older
    dapo did (``legacy``: trainer_state.pt with rank 0's RNG state inside)."""
    (path / "model").mkdir(parents=True)
    (path / "engine").mkdir()
    if legacy:
        torch.save({"step": step, "rng": rng_state()}, path / "trainer_state.pt")
    else:
        (path / "trainer_state.json").write_text(json.dumps({"step": step}))
        write_state(path / "rng" / "rank_00000.safetensors", rng_state())
    (path / "model" / "config.json").write_text("{}")
    save_file({"w": torch.arange(8, dtype=torch.float32)}, str(path / "model" / "model.safetensors"))
    return path


def test_runs_started_together_claim_distinct_directories(tmp_path):
    a = claim_run_dir(str(tmp_path), "exp", "dapo-s0", exact=False)
    b = claim_run_dir(str(tmp_path), "exp", "dapo-s0", exact=False)
    assert (a[0], b[0]) == ("dapo-s0", "dapo-s0-2") and a[3] and b[3]
    a[2].release()
    c = claim_run_dir(str(tmp_path), "exp", "dapo-s0", exact=False)  # existing dirs are never reused
    assert c[0] == "dapo-s0-3"


def test_a_named_run_in_use_by_another_process_is_refused(tmp_path):
    name, run_dir, lock, _ = claim_run_dir(str(tmp_path), "exp", "mine", exact=True)
    with pytest.raises(UserError, match=f"is being trained by another process \\(pid {os.getpid()}\\)"):
        claim_run_dir(str(tmp_path), "exp", "mine", exact=True)
    lock.release()
    again = claim_run_dir(str(tmp_path), "exp", "mine", exact=True)
    assert again[1] == run_dir and not again[3]  # taken over, not created


@pytest.mark.slow
def test_the_lock_dies_with_its_process(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from dapo_cli.checkpoint import RunLock
        assert RunLock(Path({str(run_dir)!r})).acquire()
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert RunLock.is_held(run_dir)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert not RunLock.is_held(run_dir)  # kill -9 frees it: the run can be resumed or marked orphaned


def test_leftovers_of_a_killed_checkpoint_write_are_removed(tmp_path):
    ckpt = CheckpointManager(tmp_path)
    complete_checkpoint(ckpt.root / "step_000002", 2)
    (ckpt.root / ".step_000004.tmp" / "model").mkdir(parents=True)
    (ckpt.root / ".step_000002.old").mkdir()
    assert ckpt.clean_stale() == [".step_000002.old", ".step_000004.tmp"]
    assert sorted(p.name for p in ckpt.root.iterdir()) == ["step_000002"]


def test_resume_falls_back_to_the_newest_complete_checkpoint_and_says_why(tmp_path):
    ckpt = CheckpointManager(tmp_path)
    complete_checkpoint(ckpt.root / "step_000010", 10)
    newest = complete_checkpoint(ckpt.root / "step_000020", 20)
    weights = newest / "model" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-5])  # a write cut short
    (ckpt.root / "latest").write_text("step_000020\n")
    found, skipped = ckpt.newest_complete()
    assert found == ckpt.root / "step_000010"
    assert skipped == [
        f"step_000020: model/model.safetensors is truncated or corrupt: {len(data) - 5} bytes, its header promises {len(data)}"
    ]
    assert ckpt.latest() == ckpt.root / "step_000010"


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda p: (p / "trainer_state.json").unlink(), "trainer_state.json is missing"),
        (lambda p: (p / "trainer_state.json").write_text("{not json"), "trainer_state.json is unreadable"),
        (lambda p: (p / "rng" / "rank_00000.safetensors").unlink(), "rng/rank_00000.safetensors is missing"),
        (lambda p: (p / "rng" / "rank_00000.safetensors").write_bytes(b"\x01"), "rng/rank_00000.safetensors is truncated"),
        (lambda p: (p / "engine").rmdir(), "engine is missing"),
        (lambda p: (p / "model" / "model.safetensors").unlink(), "model/ holds no *.safetensors weights"),
        (lambda p: (p / "model" / "model.safetensors").write_bytes(b"\xff" * 16), "model/model.safetensors has a corrupt header"),
        (lambda p: (p / "model" / "model.safetensors").write_bytes(b"\x01"), "model/model.safetensors is truncated"),
        (lambda p: (p / "model" / "model.safetensors").write_bytes(b"\x02" + b"\x00" * 7 + b"[]"), "not a JSON object"),
    ],
)
def test_each_kind_of_damage_is_named(tmp_path, damage, problem):
    path = complete_checkpoint(tmp_path / "step_000001", 1)
    assert checkpoint_problem(path) is None
    damage(path)
    assert problem in checkpoint_problem(path)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda p: (p / "trainer_state.pt").write_bytes(b"not a torch file"), "trainer_state.pt is refused"),
        (lambda p: (p / "trainer_state.pt").write_bytes(b""), "trainer_state.pt is unreadable (EOFError)"),
    ],
)
def test_damage_to_an_older_dapos_checkpoint_is_named(tmp_path, damage, problem):
    path = complete_checkpoint(tmp_path / "step_000001", 1, legacy=True)
    assert checkpoint_problem(path) is None  # read with torch's weights-only reader
    assert CheckpointManager(tmp_path).load_state(path)["step"] == 1
    damage(path)
    assert problem in checkpoint_problem(path)


def test_an_intact_safetensors_file_passes_the_length_check(tmp_path):
    save_file({"a": torch.zeros(3, 5), "b": torch.ones(7, dtype=torch.int64)}, str(tmp_path / "x.safetensors"))
    assert safetensors_problem(tmp_path / "x.safetensors") is None
    with open(tmp_path / "x.safetensors", "ab") as f:
        f.write(b"extra")
    assert "its header promises" in safetensors_problem(tmp_path / "x.safetensors")



# ---------------------------------------------------------------- what a resume reads back (issue 54)


def test_a_trainer_state_that_cannot_be_parsed_is_passed_over_like_a_truncated_file(tmp_path):
    """Unreadable is damage (a crash, a disk, a copy): bounded reads name it, and --resume takes the one before."""
    path = complete_checkpoint(tmp_path / "step_000001", 1)
    for text, problem in (("[" * 100_000 + "]" * 100_000, "nested too deeply to read"),
                          ('{"step": ' + "9" * 5000 + "}", "a number of more than 4,300 digits"),
                          ('{"step": 1,', "not valid JSON: line 1 column 12: Expecting property name enclosed in double quotes")):
        (path / "trainer_state.json").write_text(text)
        assert checkpoint_problem(path) == f"trainer_state.json is unreadable ({problem})"


def test_a_trainer_state_with_wrong_values_is_refused_naming_the_field_and_the_checkpoint_before(tmp_path):
    ckpt = CheckpointManager(tmp_path)
    complete_checkpoint(ckpt.root / "step_000001", 1)
    newest = complete_checkpoint(ckpt.root / "step_000002", 2)
    state = {"step": "2", "stream": {"epoch": 0, "position": 0}, "barren_steps": 0}
    with pytest.raises(UserError) as info:
        ckpt.checked_state(newest, state, total_steps=5, num_prompts=4)
    assert str(info.value) == (f"cannot resume from checkpoint {newest}: trainer_state.json: step is '2', not a whole number; "
                               "delete step_000002 so --resume takes step_000001, or start a fresh run without --resume")
    only = complete_checkpoint(tmp_path / "other" / "checkpoints" / "step_000003", 3)
    with pytest.raises(UserError, match=r"start a fresh run without --resume \(step_000003 is the run's only checkpoint\)$"):
        ckpt.checked_state(only, {**state, "step": 3, "barren_steps": 9}, total_steps=5, num_prompts=4)


def test_a_checkpoint_past_total_steps_says_which_setting_resumes_it(tmp_path):
    path = complete_checkpoint(tmp_path / "step_000004", 4)
    state = {"step": 4, "stream": {"epoch": 0, "position": 0}, "barren_steps": 0}
    assert CheckpointManager(tmp_path).checked_state(path, state, total_steps=4, num_prompts=1).step == 4
    with pytest.raises(UserError, match=r"is step 4, past trainer.total_steps=3; resume with --set trainer.total_steps=4 or more"):
        CheckpointManager(tmp_path).checked_state(path, state, total_steps=3, num_prompts=1)


def test_an_rng_state_of_the_wrong_shape_is_refused_with_its_file_and_field(tmp_path):
    path = complete_checkpoint(tmp_path / "step_000001", 1)
    write_state(path / "rng" / "rank_00000.safetensors", {**rng_state(), "torch": torch.zeros(8, dtype=torch.uint8)})
    assert checkpoint_problem(path) is None  # a complete file: not passed over, refused when read back
    with pytest.raises(UserError, match=r"rng/rank_00000.safetensors: torch holds 8 bytes; this torch's generator state is"):
        CheckpointManager(tmp_path).rank_rng_state(path, 0, {})
    legacy = complete_checkpoint(tmp_path / "old" / "step_000001", 1, legacy=True)
    with pytest.raises(UserError, match=r"trainer_state.pt: rng: python is 7, not a state of Python's random"):
        CheckpointManager(tmp_path / "old").rank_rng_state(legacy, 0, {"rng": {"python": 7, "torch": torch.get_rng_state()}})


def test_config_differences_of_a_damaged_config_with_keys_that_are_no_strings():
    from dapo_cli.checkpoint import config_differences

    assert config_differences({1: 2, "a": {None: 1}}, {"a": {}}) == ["1", "a.None"]
