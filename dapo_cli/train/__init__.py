"""`dapo train`: the DAPO RL loop and what only it uses.

* ``loop.py``     the step loop, read top to bottom: ``collect_batch`` → ``compute_advantages`` → old
                  log-probs → update → log; ``run_train`` runs one training run
* ``records.py``  what a step records: generation stats, the paper's monitors, compute, the clock (``record_step``)
* ``objective.py`` the run's objective (policy loss, correction, aggregation, entropy and KL), built once
* ``update.py``   the optimisation phases: old log-probs, the behaviour correction, ``update_policy``
* ``rounds.py``   where a step's generation rounds come from (``InlineRounds``, ``WorkerRounds``; ``RoundPlanner``:
                  each round's prompts and seed; ``sampling_params``: the run's ``SamplingParams``)
* ``worker.py``   the rollout worker process of asynchronous rollouts (spawned by ``rounds.WorkerRounds``)
* ``sync_check.py`` after each sync to vLLM, its log-probs of a fixed probe against the trainer's (``InlineRounds``)
* ``session.py``  plumbing of one run: build/restore components, record, validate, checkpoint

What ``--algo direct-advantage`` shares with this loop (seeds, run tags, the run's data) is in
``dapo_cli/runs.py``; ``batch.py``, ``diagnostics.py``, ``signals.py`` and ``checkpoint.py`` stay at the
top level, beside the other layers that use them.

The loop's public names are importable from here (``from dapo_cli.train import run_train``); they are
loaded on first use, so importing ``dapo_cli.train.worker`` in the worker process does not load the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Collected", "TrainingInterrupted", "TrainingPreempted", "collect_batch", "compute_advantages", "run_train", "score_and_shape", "step_metrics"]

if TYPE_CHECKING:
    from dapo_cli.train.loop import (
        TrainingInterrupted,
        TrainingPreempted,
        collect_batch,
        compute_advantages,
        run_train,
        score_and_shape,
    )
    from dapo_cli.train.records import Collected, step_metrics


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from dapo_cli.train import loop, records

    value = getattr(records if name in ("Collected", "step_metrics") else loop, name)
    globals()[name] = value  # later lookups skip this function
    return value
