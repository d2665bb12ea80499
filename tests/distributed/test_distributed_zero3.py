"""ZeRO-3 on 2 gloo ranks (issue 52, items 2, 5, 6): one launch of ``zero3_worker.py`` runs every check, these
tests read what rank 0 recorded (every parameter sharded: ``stage3_param_persistence_threshold`` 0).

- the sharded load: right after it each parameter is a shard (``ds_tensor`` holds ceil(numel / 2) elements,
  ``p.data`` nothing), the rank holds half the parameter bytes (plus per-tensor padding), and the gathered
  weights are the file's; the engine's log-probs equal those of the whole model loaded by transformers;
- the weight sync (``export_weights``): the extra memory it holds at any yield, measured as the storages of
  gathered parameters plus the yielded tensors the consumer still holds, is at most the largest parameter when
  the consumer drops each tensor (one gathered at a time), and the whole model (more) when it keeps them (the
  measure sees materialisation); every tensor received equals the file's;
- ``params_finite`` gathers nothing (``GatheredParameters`` replaced by a function that raises) and catches an inf
  written into rank 1's local shard only;
- the chunked head with its weight gathered for the call: log-probs, entropies and every parameter's full
  gradient equal the full-logits path's (tolerances of tests/engine/test_chunked_head.py).
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("zero3_worker.py")

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed"),
]


@pytest.fixture(scope="module")
def zero3(tiny_model_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("zero3") / "out.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER), str(tiny_model_dir), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


def test_the_sharded_load_holds_a_shard_per_rank_and_the_files_weights(zero3):
    loaded = zero3["loaded"]
    for name, (full, local, data) in loaded["shapes"].items():
        assert local == math.ceil(full / 2) and data == 0, name  # partitioned at load, nothing whole on the rank
    total = sum(zero3["sizes"].values())
    padding = 4 * len(zero3["sizes"])  # each tensor padded to a multiple of 2 ranks: at most one float32 each
    assert total / 2 <= loaded["held_bytes"] <= total / 2 + padding
    assert loaded["max_diff"] == 0.0
    # the engine built on the sharded load scores like the whole model loaded by transformers
    torch.testing.assert_close(zero3["head"][0]["logp"], zero3["plain_logp"], rtol=0, atol=1e-5)


def test_the_sync_gathers_one_parameter_at_a_time_and_sends_the_trainers_weights(zero3):
    largest, total = max(zero3["sizes"].values()), sum(zero3["sizes"].values())
    streamed, kept = zero3["sync"], zero3["sync_kept"]
    assert streamed["max_diff"] == 0.0 and kept["max_diff"] == 0.0
    assert 0 < streamed["peak"] <= largest  # the bounded buffer is 0 here: the consumer drops each tensor
    assert kept["peak"] >= total > 2 * largest  # a consumer that keeps them holds the whole model: the measure sees it


def test_the_memory_plans_sync_term_is_the_measured_peak(zero3, tiny_model_dir):
    import json

    from dapo_cli.plan.memory import sync_term
    from dapo_cli.plan.shape import shape_from_config

    shape = shape_from_config(json.loads((tiny_model_dir / "config.json").read_text()), "tiny")
    assert sync_term(shape, 4, zero_stage=3, lora=False).gpu == zero3["sync"]["peak"]  # float32: b = 4


def test_params_finite_checks_local_shards_without_gathering(zero3):
    assert zero3["finite"] == {"before": True, "no_gather": True, "inf_on_rank1": False, "after": True}


def test_the_chunked_head_under_zero3_gives_the_full_logits_numbers_and_gradients(zero3):
    full, chunked = zero3["head"][0], zero3["head"][3]
    assert not full["chunked"] and chunked["chunked"]
    torch.testing.assert_close(chunked["logp"], full["logp"], rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked["ent"], full["ent"], rtol=0, atol=1e-5)
    for name, g in full["grads"].items():
        # DeepSpeed's partitions add up until step: the chunked case's gradient is the running sum minus the first
        second = chunked["grads"][name] - g
        assert float(g.norm()) > 0, name
        assert float((second - g).norm()) <= 1e-5 * float(g.norm()) + 1e-7, name
