"""State files without pickle (``dapo_cli/statefiles.py``): exact round trips of what checkpoints hold, damaged
files named, older ``.pt`` files read by torch's weights-only reader, a planted pickle refused unrun."""

from __future__ import annotations

import json
import random

import pytest
import torch
from foreign_files import live, plant
from safetensors.torch import save_file

from dapo_cli.checkpoint import rng_state, set_rng_state
from dapo_cli.engine.torch import warmup_constant
from dapo_cli.errors import UserError
from dapo_cli.statefiles import RefusedFile, StateFileError, decode, encode, read_legacy, read_state, write_state


def adamw_after_one_step() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_constant(2))
    model(torch.ones(4, 3)).square().sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def test_types_survive_the_round_trip_exactly(tmp_path) -> None:
    obj = {
        "none": None, "flag": True, "count": 3, "x": 0.1, "nan": float("nan"), "text": "a", "list": [1, (2, 3)],
        "by_index": {0: {"t": torch.arange(3)}, 1: "b"}, "__dunder": 1, "empty": {}, "scalar": torch.tensor(2.5),
        "bytes": torch.tensor([0, 255], dtype=torch.uint8), "pair": (0.9, 0.999),
    }
    write_state(tmp_path / "s.safetensors", obj)
    back = read_state(tmp_path / "s.safetensors")
    assert back["list"] == [1, (2, 3)] and isinstance(back["list"][1], tuple) and back["pair"] == (0.9, 0.999)
    assert list(back["by_index"]) == [0, 1] and torch.equal(back["by_index"][0]["t"], torch.arange(3))
    assert back["scalar"].shape == () and float(back["scalar"]) == 2.5 and back["bytes"].dtype == torch.uint8
    assert back["nan"] != back["nan"] and back["__dunder"] == 1 and back["none"] is None and back["flag"] is True
    assert (back["count"], back["x"], back["text"], back["empty"]) == (3, 0.1, "a", {})


def test_an_optimizer_restored_from_its_state_file_steps_exactly_like_the_original(tmp_path) -> None:
    model, optimizer, scheduler = adamw_after_one_step()
    write_state(tmp_path / "optimizer.safetensors", {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()})
    twin, twin_opt, twin_sched = adamw_after_one_step()  # same weights; its optimizer state is then overwritten
    state = read_state(tmp_path / "optimizer.safetensors")
    twin_opt.load_state_dict(state["optimizer"])
    twin_sched.load_state_dict(state["scheduler"])
    for m, opt, sched in ((model, optimizer, scheduler), (twin, twin_opt, twin_sched)):
        m(torch.ones(4, 3)).square().sum().backward()
        opt.step()
        sched.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    assert twin_opt.param_groups[0]["betas"] == (0.9, 0.999) and twin_sched.state_dict() == scheduler.state_dict()


def test_rng_states_restore_the_same_draws(tmp_path) -> None:
    write_state(tmp_path / "rng.safetensors", rng_state())
    expected = (random.random(), torch.rand(3))
    set_rng_state(read_state(tmp_path / "rng.safetensors"))
    assert random.random() == expected[0] and torch.equal(torch.rand(3), expected[1])


def test_objects_outside_the_state_types_are_a_programming_error() -> None:
    with pytest.raises(TypeError, match="not set"):
        encode({"a": {1, 2}}, {})


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"__tensor__": "t9"}, "names a tensor 't9'"),
        ({"__items__": [[1]]}, "not a list of \\[key, value\\] pairs"),
        ({"__items__": [[[1], 2]]}, "dict key"),
        ({"__class__": "os.system"}, "unknown entry '__class__'"),
    ],
)
def test_a_tree_of_unknown_shape_is_refused(node, message) -> None:
    with pytest.raises(StateFileError, match=message):
        decode(node, {})


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda p: p.write_bytes(b"\x01"), "is truncated"),
        (lambda p: save_file({"a": torch.zeros(2)}, str(p)), "without a dapo state"),
        (lambda p: save_file({}, str(p), metadata={"dapo.tree": "{oops"}), "not valid JSON"),
    ],
)
def test_a_damaged_state_file_is_named(tmp_path, write, message) -> None:
    path = tmp_path / "s.safetensors"
    write(path)
    with pytest.raises(StateFileError, match=message):
        read_state(path)


def test_an_older_dapos_pt_files_are_read_by_the_weights_only_reader(tmp_path) -> None:
    """What the checkpoints of older dapo versions held (trainer state with the RNG state, AdamW + LambdaLR):
    plain values and tensors, which torch's weights-only reader builds with no allow-list."""
    _, optimizer, scheduler = adamw_after_one_step()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp_path / "optimizer.pt")
    state = {"stream": {"epoch": 0, "position": 8}, "barren_steps": 0, "mlflow_run_id": "abc", "base_val": 0.25,
             "last_val": None, "world_size": 1, "rng": rng_state(), "step": 2}
    torch.save(state, tmp_path / "trainer_state.pt")
    back = read_legacy(tmp_path / "trainer_state.pt", fix="unused")
    assert back["stream"] == state["stream"] and back["rng"]["python"] == state["rng"]["python"]
    assert read_legacy(tmp_path / "optimizer.pt", fix="unused")["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)


def test_a_planted_pickle_is_refused_with_one_line_and_never_runs(tmp_path) -> None:
    assert live(tmp_path)
    marker = tmp_path / "marker"
    path = plant(tmp_path / "trainer_state.pt", marker, step=3)
    with pytest.raises(RefusedFile) as refused:
        read_legacy(path, fix="start from its model/ folder")
    message = str(refused.value)
    assert isinstance(refused.value, UserError) and "\n" not in message
    assert message.startswith(f"{path} is refused: torch's safe reader (weights_only) cannot read it (Unsupported global")
    assert message.endswith("dapo never unpickles a file in full, which can run code from it; start from its model/ folder")
    assert not marker.exists()


def test_a_state_file_holds_no_pickle(tmp_path) -> None:
    """The tree is JSON in the safetensors header: readable by any JSON parser, with no code in it."""
    write_state(tmp_path / "s.safetensors", {"pair": (1, 2)})
    data = (tmp_path / "s.safetensors").read_bytes()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert json.loads(header["__metadata__"]["dapo.tree"]) == {"pair": {"__tuple__": [1, 2]}}


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ('{"step": ' + "9" * 5000 + "}", r"s.safetensors holds a state that is unreadable \(a number of more than 4,300 digits\)"),
        ("[" * 100_000 + "]" * 100_000, r"holds a state that is unreadable \(nested too deeply to read\)"),
        ("[" * 900 + "]" * 900, r"nested too deeply to read"),  # json's recursion or decode's, whichever runs out first
    ],
)
def test_a_state_tree_past_the_read_bounds_is_one_error_not_a_traceback(tmp_path, tree, message) -> None:
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(600)
    try:
        save_file({}, str(tmp_path / "s.safetensors"), metadata={"dapo.tree": tree})
        with pytest.raises(StateFileError, match=message):
            read_state(tmp_path / "s.safetensors")
    finally:
        sys.setrecursionlimit(limit)


def test_a_damaged_checkpoints_error_names_the_checkpoint_before_it(tmp_path) -> None:
    from dapo_cli.statefiles import unreadable

    for name in ("step_000002", "step_000010"):
        (tmp_path / name).mkdir()
    error = unreadable(tmp_path / "step_000010", StateFileError("trainer_state.json: step is '\x1b'"))
    assert str(error) == (f"cannot resume from checkpoint {tmp_path / 'step_000010'}: trainer_state.json: step is '\\x1b'; "
                          "delete step_000010 so --resume takes step_000002, or start a fresh run without --resume")
