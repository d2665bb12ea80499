"""Where a training step's generation rounds come from: a :class:`RoundSource`.

A *round* is ``data.prompts_per_round`` prompts (``gen_batch_size``, or ``train_batch_size`` when 0) drawn
from the prompt stream, of which this rank samples its share (:func:`~dapo_cli.config.schema.rank_share`),
``n`` responses for each, and the weight *version* that sampled them (versions count completed
steps: the initial policy is version 0, or the checkpoint's step after ``--resume``). :class:`RoundPlanner`
draws each round's prompts and seed, and :func:`sampling_params` builds how the run samples.

* :class:`InlineRounds` (``rollout.worker: inline``, the synchronous loop): the rollout engine in
  this process generates each round when the step asks for it, between updates, always with the
  newest weights.
* :class:`WorkerRounds` (``rollout.worker: process``, auto when
  ``rollout.max_staleness > 0``): a worker process generates rounds ahead, up to ``max_staleness``
  steps, while the trainer updates; its process is ``worker.py``.

``loop.collect_batch`` asks a source for rounds one at a time and decides (staleness, dynamic
sampling) what to train on; the source decides nothing. Every rank has its own source; requests
are made in the same order on every rank, so round ``j`` of a step is the same prompts' shares.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from dapo_cli.config import Config
from dapo_cli.config.schema import rank_share
from dapo_cli.data.loader import Prompt, PromptStream
from dapo_cli.engine.base import TrainingEngine
from dapo_cli.engine.dist import Collective, SingleProcess
from dapo_cli.errors import EnvironmentFailure
from dapo_cli.rollout.base import RolloutEngine, Rollouts, SamplingParams
from dapo_cli.runs import derive_seed
from dapo_cli.train.sync_check import PROBE_PROMPTS, check_gap, probe_gap
from dapo_cli.train.worker import POLL_S, WorkerSpec, worker_main

START_TIMEOUT_S = 600.0
"""Longest the trainer waits for a worker to load its policy (a 32B folder from a slow disk takes minutes)."""


@dataclass
class Round:
    """One generation round on this rank: its prompts (this rank's share), what was sampled, and with which weights."""

    prompts: list[Prompt]
    rollouts: Rollouts
    version: int
    """Weight version of the policy that sampled every response of the round."""


class RoundSource(Protocol):
    """Rounds for ``loop.collect_batch``, and what the loop tells the source around each update."""

    def next_round(self, step: int) -> Round:
        """The next round for ``step`` (blocks until it is generated)."""
        ...

    def before_update(self, step: int, rounds_used: int) -> None:
        """Step ``step`` has its batch (``rounds_used`` rounds examined); the trainer updates next."""
        ...

    def after_update(self, engine: TrainingEngine, version: int, *, updated: bool) -> dict[str, float]:
        """The update of step ``version`` is done (``updated``: the weights changed): make later rounds use them.
        Returns timing metrics (``timing/weight_sync`` and, for the worker, ``async/*``)."""
        ...

    def stream_state(self) -> dict[str, int]:
        """The prompt stream's state to checkpoint: positioned at the first prompt no trained round has used."""
        ...

    def close(self) -> None:
        """Stop whatever the source runs beside the trainer (idempotent)."""
        ...


def sampling_params(cfg: Config, *, seed: int, validation: bool = False) -> SamplingParams:
    """How the run samples, the one place it is built. Training rounds: ``rollout.temperature`` / ``top_p`` /
    ``top_k`` up to ``rollout.max_response_length``, with the engine's log-probs of its samples (the train-inference
    mismatch metric, truncated IS and the decoupled objective use them). ``validation``: ``validation.temperature``
    / ``top_p`` (no top-k) up to ``validation.max_tokens`` (0: the response limit), without log-probs."""
    r, v = cfg.rollout, cfg.validation
    if validation:
        return SamplingParams(temperature=v.temperature, top_p=v.top_p, top_k=0, max_tokens=v.max_tokens or r.max_response_length,
                              seed=seed)
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_response_length, seed=seed,
                          logprobs=True)


class RoundPlanner:
    """Draws each round's prompts (this rank's share) and derives its sampling seed from the step it is
    planned for and its index among that step's rounds: the synchronous loop's seeds, whichever source
    generates. One process keeps its historical seeds; an engine that keys its random streams by prompt
    text (``rollout/fast.py``) needs no rank either, so its samples do not depend on the world size."""

    def __init__(self, stream: PromptStream, cfg: Config, dist: Collective, *, seeds_per_prompt: bool) -> None:
        self.stream, self.cfg, self.dist = stream, cfg, dist
        self.per_round = cfg.data.prompts_per_round
        self.share = rank_share(cfg.data, dist.world_size)
        self.rank_part = [dist.rank] if dist.world_size > 1 and not seeds_per_prompt else []
        self.planned: dict[int, int] = {}

    def plan(self, step: int) -> tuple[list[Prompt], SamplingParams]:
        index = self.planned.get(step, 0)
        self.planned[step] = index + 1
        params = sampling_params(self.cfg, seed=derive_seed(self.cfg.trainer.seed, "rollout", step, index, *self.rank_part))
        rank = self.dist.rank
        prompts = self.stream.next(self.per_round)[rank * self.share : (rank + 1) * self.share]
        return prompts, params


class InlineRounds:
    """The synchronous loop: ``rollout`` generates each round on request, with the newest weights.

    With vLLM (``rollout.engine=vllm``) and ``rollout.sync_check_gap > 0``, every wake-up or sync after an update
    is followed by the probe of :mod:`dapo_cli.train.sync_check` (``pad_id``: the tokenizer's), whose gap is logged
    (``rollout/sync_probe_gap``) and stops the run above the bound."""

    def __init__(
        self, rollout: RolloutEngine, stream: PromptStream, cfg: Config, dist: Collective | None = None, *, version: int = 0,
        pad_id: int | None = None,
    ) -> None:
        self.rollout = rollout
        self.stream = stream
        self.dist = dist or SingleProcess()
        self.planner = RoundPlanner(stream, cfg, self.dist, seeds_per_prompt=rollout.seeds_per_prompt)
        self.version = version
        self.pad_id = pad_id
        self.probe: list[str] = []
        """The sync check's prompts: the first ones this rank drew (fixed for the run)."""

    def next_round(self, step: int) -> Round:
        prompts, params = self.planner.plan(step)
        if not self.probe:
            self.probe = [p.text for p in prompts[:PROBE_PROMPTS]]
        out = self.rollout.generate([p.text for p in prompts], self.planner.cfg.rollout.n, params)
        return Round(prompts, out, self.version)

    def before_update(self, step: int, rounds_used: int) -> None:
        self.rollout.sleep()  # a colocated engine hands its GPU memory to the update

    def after_update(self, engine: TrainingEngine, version: int, *, updated: bool) -> dict[str, float]:
        """Wake the engine (vLLM after a level-2 sleep: with the weights synced again, never without) or, after an
        update, sync it (a sleeping vLLM wakes its weights, loads, then wakes its KV cache); then the sync check."""
        t0 = time.perf_counter()
        self.version = version
        metrics: dict[str, float] = {}
        if updated:
            self.rollout.sync_weights(engine)  # in memory, from engine.export_weights(), one tensor at a time
            metrics["timing/weight_sync"] = time.perf_counter() - t0
        else:
            self.rollout.wake_up()
        metrics.update(self.check_sync(engine, version))
        return metrics

    def check_sync(self, engine: TrainingEngine, version: int) -> dict[str, float]:
        """The sync check (vLLM with ``rollout.sync_check_gap > 0``, once the probe's prompts are known): its gap, or
        :class:`EnvironmentFailure` above the bound."""
        r = self.planner.cfg.rollout
        if r.engine != "vllm" or r.sync_check_gap <= 0 or not self.probe or self.pad_id is None:
            return {}
        gap = probe_gap(
            self.rollout, engine, self.probe, temperature=r.temperature, pad_id=self.pad_id, dist=self.dist,
            seed=derive_seed(self.planner.cfg.trainer.seed, "sync-probe"),
        )
        check_gap(gap, r.sync_check_gap, version)
        return {"rollout/sync_probe_gap": gap}

    def stream_state(self) -> dict[str, int]:
        return self.stream.state_dict()

    def close(self) -> None:
        pass


@dataclass
class Pending:
    """A requested round: its key, its prompts, and the stream's state before they were drawn."""

    key: int
    prompts: list[Prompt]
    stream_state: dict[str, int]


class WorkerRounds:
    """A :class:`~dapo_cli.train.rounds.RoundSource` whose rounds a worker process generates, up to
    ``rollout.max_staleness`` steps ahead (0: each round on request, with the newest weights, as inline)."""

    def __init__(
        self, cfg: Config, stream: PromptStream, dist: Collective, engine: TrainingEngine, *, model_path: str,
        version: int, threads: int, seeds_per_prompt: bool,
    ) -> None:
        self.stream, self.n = stream, cfg.rollout.n
        self.max_staleness = cfg.rollout.max_staleness
        self.planner = RoundPlanner(stream, cfg, dist, seeds_per_prompt=seeds_per_prompt)
        self.pending: deque[Pending] = deque()
        self.next_key = 0
        self.totals = {"wait": 0.0, "generate": 0.0, "idle": 0.0, "sync": 0.0}
        ctx = mp.get_context("spawn")
        self.staging = {name: t.detach().to("cpu", copy=True).contiguous().share_memory_() for name, t in engine.export_weights()}
        self.version = ctx.Value("q", version, lock=False)
        self.lock = ctx.Lock()
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        spec = WorkerSpec(cfg.rollout.engine, str(engine.device), model_path, cfg.model.dtype, cfg.rollout.batch_size, threads,
                          os.getpid())
        self.process: Any = ctx.Process(
            target=worker_main, args=(spec, self.staging, self.version, self.lock, self.requests, self.results),
            name=f"dapo-rollout-worker-{dist.rank}", daemon=True,
        )
        self.process.start()
        try:
            self.receive(timeout=START_TIMEOUT_S, expect="ready")
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ the RoundSource protocol

    def next_round(self, step: int) -> Round:
        if not self.pending:
            self.request(step)
        head = self.pending.popleft()
        t0 = time.perf_counter()
        _, key, out, version, generate_s, idle_s, sync_s = self.receive(timeout=None, expect="round")
        self.totals["wait"] += time.perf_counter() - t0
        if key != head.key:  # one worker serves requests in order; anything else is a bug, not a race to recover from
            raise RuntimeError(f"rollout worker answered request {key}, expected {head.key}")
        self.totals["generate"] += generate_s
        self.totals["idle"] += idle_s
        self.totals["sync"] += sync_s
        return Round(head.prompts, out, int(version))

    def before_update(self, step: int, rounds_used: int) -> None:
        """Queue ``max_staleness`` steps' worth of rounds (as many per step as step ``step`` examined), so the
        worker generates while the trainer updates; a round queued now is planned for step ``step + 1 + j``."""
        per_step = max(1, rounds_used)
        while len(self.pending) < self.max_staleness * per_step:
            self.request(step + 1 + len(self.pending) // per_step)

    def after_update(self, engine: TrainingEngine, version: int, *, updated: bool) -> dict[str, float]:
        t0 = time.perf_counter()
        with self.lock:
            if updated:
                for name, tensor in engine.export_weights():
                    self.staging[name].copy_(tensor)
            self.version.value = version
        metrics = {
            "timing/weight_sync": time.perf_counter() - t0,
            "timing/trainer_wait_rollouts": self.totals["wait"],
            "timing/worker_generate": self.totals["generate"],
            "timing/worker_wait_weights": self.totals["idle"] + self.totals["sync"],
        }
        self.totals = dict.fromkeys(self.totals, 0.0)
        return metrics

    def stream_state(self) -> dict[str, int]:
        return self.pending[0].stream_state if self.pending else self.stream.state_dict()

    def close(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(Exception):
            self.requests.put(None)
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()
            process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
        for q in (self.requests, self.results):
            q.cancel_join_thread()
            q.close()

    # ------------------------------------------------------------ plumbing

    def request(self, step: int) -> None:
        state = self.stream.state_dict()
        prompts, params = self.planner.plan(step)
        self.pending.append(Pending(self.next_key, prompts, state))
        self.requests.put((self.next_key, [p.text for p in prompts], self.n, params))
        self.next_key += 1

    def receive(self, *, timeout: float | None, expect: str) -> tuple[Any, ...]:
        """The worker's next message (``expect``: its kind); a worker that failed or died raises here."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                message = self.results.get(timeout=POLL_S)
            except queue.Empty:
                if self.process is None or not self.process.is_alive():
                    code = None if self.process is None else self.process.exitcode
                    raise EnvironmentFailure(
                        f"the rollout worker process died (exit code {code}{': killed, e.g. out of memory' if code == -9 else ''}); "
                        "dapo train --resume continues from the last complete checkpoint"
                    ) from None
                if deadline is not None and time.monotonic() > deadline:
                    raise EnvironmentFailure(f"the rollout worker process did not start within {timeout:.0f} s") from None
                continue
            if message[0] == "error":
                raise RuntimeError(f"rollout worker failed: {message[1]}")
            if message[0] != expect:
                raise RuntimeError(f"rollout worker sent {message[0]!r}, expected {expect!r}")
            return message


def open_rounds(
    cfg: Config, rollout: RolloutEngine, stream: PromptStream, dist: Collective, engine: TrainingEngine, *,
    model_path: str, version: int, worker: bool, worker_threads: int, pad_id: int | None = None,
) -> RoundSource:
    """The run's round source: the worker process (``worker``, the session's reading of ``rollout.worker``) with
    ``worker_threads`` torch threads, else inline (``pad_id``: the tokenizer's, for the sync check). ``engine``'s
    current weights (after any resume) are the worker's first version, ``version``."""
    if not worker:
        return InlineRounds(rollout, stream, cfg, dist, version=version, pad_id=pad_id)
    return WorkerRounds(
        cfg, stream, dist, engine, model_path=model_path, version=version, threads=worker_threads,
        seeds_per_prompt=rollout.seeds_per_prompt,
    )

