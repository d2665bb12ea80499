"""What a resumed run reads back (``dapo_cli/resume_state.py``): every field of the trainer state, the RNG state
and the optimizer state checked, each wrong value one StateFileError naming the file and the field."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from dapo_cli.checkpoint import rng_state
from dapo_cli.engine.torch import warmup_constant
from dapo_cli.resume_state import TrainerState, check_optimizer_state, check_rng_state, check_trainer_state
from dapo_cli.statefiles import StateFileError, read_state, write_state

FILE = "trainer_state.json"


def trainer_state() -> dict[str, Any]:
    """What ``TrainingSession.save`` writes at step 4 of a run with 6 training prompts."""
    return {"step": 4, "stream": {"epoch": 1, "position": 2}, "barren_steps": 1, "mlflow_run_id": "0f" * 16,
            "base_val": 0.25, "last_val": 0.5, "world_size": 1}


def check(state: Any) -> TrainerState:
    return check_trainer_state(state, FILE, checkpoint_step=4, num_prompts=6)


def test_a_saved_trainer_state_passes_and_comes_back_typed() -> None:
    assert check(trainer_state()) == TrainerState(step=4, barren_steps=1, stream={"epoch": 1, "position": 2},
                                                  mlflow_run_id="0f" * 16, base_val=0.25, last_val=0.5)
    # what an older dapo or the null tracker wrote: no optional fields, an empty run id; a field a newer dapo adds
    minimal = {"step": 4, "stream": {"epoch": 0, "position": 6}, "barren_steps": 0, "mlflow_run_id": "", "later": [1]}
    assert check(minimal).mlflow_run_id is None and check(minimal).base_val is None


def edit(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(state: dict[str, Any]) -> None:
        node = state
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return apply


@pytest.mark.parametrize(("change", "message"), [
    (edit(("step",), "4"), "trainer_state.json: step is '4', not a whole number"),
    (edit(("step",), True), "step is True, not a whole number"),
    (edit(("step",), 4.0), "step is 4.0, not a whole number"),
    (edit(("step",), -1), "step is -1; it must be >= 0"),
    (edit(("step",), 3), "step is 3, but the checkpoint is step 4"),
    (edit(("step",), KeyError), "trainer_state.json lacks step"),
    (edit(("barren_steps",), 5), r"barren_steps is 5; it must be in \[0, 4\]"),
    (edit(("barren_steps",), None), "barren_steps is None, not a whole number"),
    (edit(("barren_steps",), KeyError), "lacks barren_steps"),
    (edit(("stream",), [1, 2]), r"stream is \[1, 2\], not an object of fields"),
    (edit(("stream",), KeyError), "lacks stream"),
    (edit(("stream", "position"), 7), r"stream.position is 7; it must be in \[0, 6\] \(the run has 6 training prompts\)"),
    (edit(("stream", "position"), "2"), "stream.position is '2', not a whole number"),
    (edit(("stream", "position"), KeyError), "stream lacks position"),
    (edit(("stream", "epoch"), -2), "stream.epoch is -2; it must be >= 0"),
    (edit(("stream", "epoch"), KeyError), "stream lacks epoch"),
    (edit(("mlflow_run_id",), 7), "mlflow_run_id is 7, not an MLflow run id"),
    (edit(("mlflow_run_id",), "x\x1b[2J"), r"mlflow_run_id is 'x\\x1b\[2J', not an MLflow run id"),
    (edit(("base_val",), 1.5), r"base_val is 1.5; it must be in \[0, 1\]"),
    (edit(("last_val",), float("nan")), "last_val is nan, not a finite number"),
    (edit(("last_val",), "0.5"), "last_val is '0.5', not a finite number"),
    (edit(("world_size",), 0), "world_size is 0; it must be >= 1"),
])
def test_each_field_of_the_trainer_state_is_checked(change, message) -> None:
    state = trainer_state()
    change(state)
    with pytest.raises(StateFileError, match=message):
        check(state)


def test_a_trainer_state_that_is_no_object_is_refused() -> None:
    with pytest.raises(StateFileError, match=r"trainer_state.json is \[4\], not an object of fields"):
        check([4])


def test_a_checkpoint_name_without_a_step_is_not_compared() -> None:
    assert check_trainer_state(trainer_state(), FILE, checkpoint_step=None, num_prompts=6).step == 4


# ---------------------------------------------------------------- RNG states

RNG = "rng/rank_00000.safetensors"


def test_a_saved_rng_state_passes_and_the_process_rng_is_untouched(tmp_path) -> None:
    write_state(tmp_path / "rng.safetensors", rng_state())
    saved = read_state(tmp_path / "rng.safetensors")
    before = (random.getstate(), torch.get_rng_state())
    check_rng_state(saved, RNG)
    assert random.getstate() == before[0] and torch.equal(torch.get_rng_state(), before[1])


def words(n: int, value: int = 5) -> tuple[int, ...]:
    return (value,) * (n - 1) + (n - 1,)


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s.pop("torch"), f"{RNG} lacks torch"),
    (lambda s: s.pop("python"), f"{RNG} lacks python"),
    (lambda s: s.__setitem__("torch", torch.zeros(100, dtype=torch.uint8)), "torch holds 100 bytes; this torch's generator state is"),
    (lambda s: s.__setitem__("torch", s["torch"].to(torch.int64)), "torch is a torch.int64 tensor of shape .*not a generator state"),
    (lambda s: s.__setitem__("torch", s["torch"].reshape(2, -1)), "not a generator state"),
    (lambda s: s.__setitem__("torch", [1, 2]), r"torch is \[1, 2\], not a generator state"),
    (lambda s: s.__setitem__("torch", torch.full_like(s["torch"], 255)), "torch is not a valid generator state"),
    (lambda s: s.__setitem__("python", [3, [], None]), "python is .*not a state of Python's random"),
    (lambda s: s.__setitem__("python", (3, words(10), None)), r"python\[1\] is 10 words; Python's random keeps a tuple of 625"),
    (lambda s: s.__setitem__("python", (3, words(625, 2**40), None)), r"python\[1\]\[0\] is 1099511627776; it must be in"),
    (lambda s: s.__setitem__("python", (3, (5,) * 624 + (700,), None)), "python is not a state of Python's random"),
    (lambda s: s.__setitem__("python", ("3", s["python"][1], None)), "python is not a state of Python's random"),
    (lambda s: s.__setitem__("cuda", "gpu"), "cuda is 'gpu', not a list of CUDA generator states"),
    (lambda s: s.__setitem__("cuda", [torch.zeros(3)]), r"cuda\[0\] is a torch.float32 tensor"),
])
def test_each_field_of_an_rng_state_is_checked(change, message) -> None:
    state = rng_state()
    change(state)
    with pytest.raises(StateFileError, match=message):
        check_rng_state(state, RNG)


# ---------------------------------------------------------------- optimizer and LR schedule

OPT = "engine/optimizer.safetensors"


def adamw_after_one_step() -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR, dict[str, Any]]:
    """A two-parameter model's AdamW and schedule after one step, and their state as the torch engine saves it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_constant(2))
    model(torch.ones(4, 3)).square().sum().backward()
    optimizer.step()
    scheduler.step()
    return optimizer, scheduler, {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}


def test_a_saved_optimizer_state_passes(tmp_path) -> None:
    optimizer, scheduler, state = adamw_after_one_step()
    write_state(tmp_path / "optimizer.safetensors", state)
    check_optimizer_state(read_state(tmp_path / "optimizer.safetensors"), optimizer, scheduler, OPT)
    fresh, fresh_schedule, _ = adamw_after_one_step()
    fresh.state.clear()  # an optimizer that never stepped holds no per-parameter state: nothing to compare
    check_optimizer_state({"optimizer": fresh.state_dict(), "scheduler": fresh_schedule.state_dict()}, optimizer, scheduler, OPT)


def opt(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    return edit(("optimizer", *path), value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s.pop("optimizer"), f"{OPT} lacks optimizer"),
    (lambda s: s.pop("scheduler"), f"{OPT} lacks scheduler"),
    (opt(("param_groups",), []), r"optimizer.param_groups is 0 groups; the optimizer of this model has 1"),
    (opt(("param_groups",), "all"), r"optimizer.param_groups is 'all'; the optimizer of this model has 1"),
    (opt(("param_groups", 0, "params"), [0]), r"param_groups\[0\].params lists 1 parameters; this model trains 2 in it"),
    (opt(("param_groups", 0, "params"), [0, 0]), r"param_groups\[0\].params lists parameter 0 twice"),
    (opt(("param_groups", 0, "params"), [0, "1"]), r"param_groups\[0\].params entry is '1', not a whole number"),
    (opt(("param_groups", 0, "lr"), "fast"), r"param_groups\[0\].lr is 'fast', not a finite number"),
    (opt(("param_groups", 0, "lr"), -1.0), r"param_groups\[0\].lr is -1.0; it must be in \[0, inf\]"),
    (opt(("param_groups", 0, "lr"), KeyError), r"param_groups\[0\].lr is missing"),
    (opt(("param_groups", 0, "betas"), (0.9,)), r"param_groups\[0\].betas is \(0.9,\), not a list of 2"),
    (opt(("param_groups", 0, "betas"), (0.9, 1.5)), r"param_groups\[0\].betas\[1\] is 1.5; it must be in \[0, 1\]"),
    (opt(("param_groups", 0, "eps"), float("inf")), r"param_groups\[0\].eps is inf, not a finite number"),
    (opt(("param_groups", 0, "amsgrad"), "no"), r"param_groups\[0\].amsgrad is 'no', not true/false"),
    (opt(("param_groups", 0, "foreach"), 1), r"param_groups\[0\].foreach is 1, not null or true/false"),
    (opt(("state",), [1]), r"optimizer.state is \[1\], not a map of parameters"),
    (opt(("state", 5), {}), r"optimizer.state\[5\] is the state of a parameter the param_groups do not list"),
    (opt(("state", 0), "moments"), r"optimizer.state\[0\] is 'moments', not an object of tensors"),
    (opt(("state", 0, "exp_avg"), torch.zeros(3, 3)), r"state\[0\].exp_avg has shape \[3, 3\]; the model's parameter has \[2, 3\]"),
    (opt(("state", 1, "exp_avg_sq"), torch.zeros(3)), r"state\[1\].exp_avg_sq has shape \[3\]; the model's parameter has \[2\]"),
    (opt(("state", 0, "exp_avg"), torch.zeros(2, 3, dtype=torch.int64)), r"exp_avg is a torch.int64 tensor; .* floating point"),
    (opt(("state", 0, "exp_avg"), torch.full((2, 3), float("nan"))), r"exp_avg holds NaN or infinite values"),
    (opt(("state", 0, "exp_avg_sq"), -torch.ones(2, 3)), r"exp_avg_sq holds negative values"),
    (opt(("state", 0, "exp_avg"), 0.5), r"exp_avg is 0.5, not a tensor"),
    (opt(("state", 0, "exp_avg"), KeyError), r"state\[0\] holds exp_avg_sq, step; Adam's state is step, exp_avg, exp_avg_sq"),
    (opt(("state", 0, "step"), torch.tensor(-1.0)), r"state\[0\].step is -1.0; it must be in \[0, inf\]"),
    (opt(("state", 0, "step"), torch.ones(2)), r"state\[0\].step is a torch.float32 tensor of shape \[2\], not a finite number"),
    (edit(("scheduler", "last_epoch"), "x"), r"scheduler.last_epoch is 'x', not a whole number"),
    (edit(("scheduler", "last_epoch"), -3), r"scheduler.last_epoch is -3; it must be >= 0"),
    (edit(("scheduler", "base_lrs"), [0.01, 0.01]), r"scheduler.base_lrs is \[0.01, 0.01\], not a list of 1"),
    (edit(("scheduler", "lr_lambdas"), KeyError), r"scheduler lacks lr_lambdas"),
    (edit(("scheduler",), 3), r"scheduler is 3, not an object of fields"),
])
def test_each_field_of_the_optimizer_state_is_checked_against_the_model(change, message) -> None:
    optimizer, scheduler, saved = adamw_after_one_step()
    state = copy.deepcopy(saved)
    change(state)
    with pytest.raises(StateFileError, match=message):
        check_optimizer_state(state, optimizer, scheduler, OPT)
