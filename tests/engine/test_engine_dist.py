"""Ranks and collectives: the launcher's environment, the world of one, and a real gloo group."""

from __future__ import annotations

import pytest
import torch

from dapo_cli.engine.dist import ProcessGroup, SingleProcess, gather_cat, init_collective, launch_env, reduce_sums
from dapo_cli.errors import UserError

FULL = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_no_launcher_variables_mean_a_plain_single_process():
    assert launch_env({}) is None
    assert isinstance(init_collective("cpu", {}), SingleProcess)
    assert isinstance(init_collective("cpu", {**FULL, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}), SingleProcess)


def test_the_launcher_variables_are_read():
    assert launch_env(FULL) == {"RANK": 1, "LOCAL_RANK": 1, "WORLD_SIZE": 2}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0"}, "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set; launch with: torchrun"),
        ({**FULL, "MASTER_PORT": ""}, "MASTER_PORT not set"),
        ({**FULL, "WORLD_SIZE": "two"}, "must be integers"),
        ({**FULL, "RANK": "2"}, "RANK=2 is outside WORLD_SIZE=2"),
    ],
)
def test_an_incomplete_or_wrong_launch_is_a_one_line_error(env, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        launch_env(env)


def test_a_world_of_one_reduces_to_the_identity():
    one = SingleProcess()
    t = torch.tensor([1.0, -2.0])
    for op in ("sum", "max", "min"):
        out = one.all_reduce(t, op)
        assert torch.equal(out, t) and out is not t
    with pytest.raises(ValueError, match="unknown reduction"):
        one.all_reduce(t, "mean")
    assert one.all_gather_object({"a": 1}) == [{"a": 1}]
    assert one.broadcast_object(3) == 3 and one.is_main
    # sums of counts stay exact in float64 (2**53 + 1 is not a float32)
    assert reduce_sums(one, {"tokens": 2.0**40 + 1, "seqs": 3}) == {"seqs": 3.0, "tokens": 2.0**40 + 1}
    assert reduce_sums(one, {}) == {}
    cat = gather_cat(one, {"x": torch.arange(3)})
    assert torch.equal(cat["x"], torch.arange(3))


def test_a_real_gloo_group_of_one_runs_every_collective(monkeypatch):
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    group = ProcessGroup("gloo")
    try:
        assert (group.rank, group.world_size, group.backend) == (0, 1, "gloo")
        t = torch.tensor([1.0, 5.0])
        for op in ("sum", "max", "min"):
            assert torch.equal(group.all_reduce(t, op), t)
        assert group.all_gather_object(("a", 1)) == [("a", 1)]
        assert group.broadcast_object([1, 2]) == [1, 2]
        group.barrier()
        assert reduce_sums(group, {"n": 4.0}) == {"n": 4.0}
    finally:
        group.close()
    assert not dist.is_initialized()
