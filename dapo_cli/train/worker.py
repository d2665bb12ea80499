"""Asynchronous rollouts: the worker process that generates while the trainer updates.

This module is what runs in the worker (:func:`worker_main`); the trainer's side is
``rounds.WorkerRounds``.

``rollout.worker: process`` (auto when ``rollout.max_staleness = k > 0``). Each rank starts one
worker (``spawn``), which loads the policy folder, builds its own in-process engine (fast | hf)
with ``rollout.worker_threads`` torch threads and then serves *round requests* in order::

    trainer (this process)                              worker process
    ───────────────────────────────────────────         ──────────────────────────────────────────
    collect step t: take rounds (request more if short)  for each request, in order:
    before_update: request k × (rounds of step t)          newest weights? copy them from shared memory
                   rounds for the next steps               generate the round, send it with its version
    update on step t's batch          ◄── overlaps ──►     (the next steps' rounds)
    after_update: copy the weights into shared memory,
                  version t                               idle when no request is left: the staleness
    checkpoint (the stream rewound to the first            bound holds it until the next weights
                untrained round)

Weights travel through one shared-memory copy of the state dict (``staging``), written by the trainer
after each step's update (``WorkerRounds.after_update``) and read by the worker before a round, under one
lock; the version number beside it says which step's update they hold. A request made after
``after_update(version=v)`` is always generated with version ``v`` or newer (the copy is written before the
request is queued), so ``loop.collect_batch`` can always get a fresh round and never waits forever on stale ones.

What is lost on a crash or ``kill -9``: the rounds requested but not yet trained on (in the queue, being
generated, or generated and waiting). The checkpoint records the prompt stream at the first prompt
of those rounds, so ``--resume`` draws them again and samples them anew with the checkpoint's weights:
no response is trained twice, and none comes from weights newer than the checkpoint.

Ctrl-C: the worker ignores SIGINT (the terminal sends it to the whole process group); the trainer stops
it on its way out. A worker whose trainer died (``kill -9``) exits by itself (parent-death signal, and it
checks its parent between requests).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

POLL_S = 0.5
"""How often a waiting side checks that the other is still alive."""


@dataclass(frozen=True)
class WorkerSpec:
    """What the worker process builds: ``engine`` (fast | hf) on the policy folder ``model_path`` in ``dtype``, on
    ``device`` (the trainer's: a colocated copy on its GPU, or the CPU)."""

    engine: str
    device: str
    model_path: str
    dtype: str
    batch_size: int
    threads: int
    parent_pid: int


class StagedWeights:
    """The shared-memory state dict as a ``WeightSource`` (what ``RolloutEngine.sync_weights`` reads)."""

    def __init__(self, staging: dict[str, torch.Tensor]) -> None:
        self.staging = staging

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.staging.items()


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (best effort; elsewhere the poll in the loop does it)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def worker_main(
    spec: WorkerSpec, staging: dict[str, torch.Tensor], version: Any, lock: Any, requests: Any, results: Any
) -> None:
    """The worker process: load the policy, then generate each requested round with the newest staged weights.

    Sends ``("ready",)`` once, then per request ``("round", key, rollouts, version, generate_s, idle_s, sync_s)``;
    on any failure ``("error", one line)`` (its traceback goes to stderr)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    torch.set_num_threads(spec.threads)
    try:
        from dapo_cli.components import build_policy_rollout
        from dapo_cli.models.loading import load_policy

        policy, tokenizer = load_policy(spec.model_path, device=spec.device, dtype=getattr(torch, spec.dtype))
        rollout = build_policy_rollout(spec.engine, policy, tokenizer, batch_size=spec.batch_size, shares_weights=False)
        source, mine = StagedWeights(staging), None
        results.put(("ready",))
        idle_since = time.perf_counter()
        while True:
            try:
                item = requests.get(timeout=POLL_S)
            except queue.Empty:
                if os.getppid() != spec.parent_pid:
                    return  # the trainer is gone
                continue
            if item is None:
                return
            key, texts, n, params = item
            t0 = time.perf_counter()
            with lock:
                if version.value != mine:
                    rollout.sync_weights(source)
                    mine = version.value
            t1 = time.perf_counter()
            out = rollout.generate(texts, n, params)
            t2 = time.perf_counter()
            results.put(("round", key, out, mine, t2 - t1, t0 - idle_since, t1 - t0))
            idle_since = t2
    except BaseException as exc:  # noqa: BLE001 - whatever it was, the trainer must hear of it
        traceback.print_exc()
        results.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        results.cancel_join_thread()
