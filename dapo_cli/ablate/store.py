"""Every MLflow read of ``dapo ablate`` / ``dapo report``: the store, an ablation's parent and children,
metric histories and per-problem tables, one finished child as a :class:`~dapo_cli.ablate.results.ChildResult`.

This module imports no MLflow: its client comes from :func:`dapo_cli.tracking.mlflow.open_client`. The runner
writes through its tracker and this module reads.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dapo_cli.ablate.results import COMPUTE_METRICS, CURVE_METRICS, MECHANISM_METRICS, SAMPLES_METRIC, VAL_CURVE, ChildResult
from dapo_cli.errors import UserError

SUPERSEDED_TAG = "ablate.superseded"
"""Tag of a child run that a rerun started afresh: kept for the record, ignored by the report and by reruns."""
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def mlflow_client(tracking_uri: str, *, create: bool = False) -> Any:
    """An ``MlflowClient`` on the configured store (``$MLFLOW_TRACKING_URI`` / ``sqlite:///mlflow.db`` if empty).

    ``create``: make the store if it does not exist (``dapo ablate``); reading (``dapo report``) never does.
    """
    from dapo_cli.tracking.mlflow import open_client

    return open_client(tracking_uri, create=create)


def find_parent(client: Any, experiment: str, ablation_id: str) -> Any | None:
    """The parent run tagged ``ablate.id = ablation_id`` in ``experiment`` (newest), or None."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None or not re.fullmatch(r"[0-9a-f]+", ablation_id):
        return None
    runs = client.search_runs([exp.experiment_id], f"tags.`ablate.id` = '{ablation_id}'", order_by=["attributes.start_time DESC"])
    return runs[0] if runs else None


BASE_CONFIG_ARTIFACT = "ablation_config.yaml"
"""The parent run's artifact holding the ablation's base config as the dapo that started it saved it."""


def find_older_parent(client: Any, experiment: str, mode: str, variants: str, same_base: Callable[[Any], bool]) -> Any | None:
    """The newest parent run of ``mode`` with exactly these ``variants`` (comma-separated) whose base config,
    read back from :data:`BASE_CONFIG_ARTIFACT` as YAML, passes ``same_base``: an ablation an older dapo started
    (its ``ablate.id`` hashed the config as that dapo's schema had it), or None."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None or "'" in variants + mode:  # names never hold a quote; the filter could not say it
        return None
    query = f"tags.`ablate.mode` = '{mode}' and tags.`ablate.variants` = '{variants}'"
    for run in client.search_runs([exp.experiment_id], query, order_by=["attributes.start_time DESC"]):
        text = artifact_text(client, run.info.run_id, BASE_CONFIG_ARTIFACT)
        if text is not None and same_base(yaml.safe_load(text)):
            return run
    return None


def child_runs(client: Any, parent: Any, *, include_superseded: bool = False) -> list[Any]:
    """Runs nested under ``parent`` (oldest first), without those tagged ``ablate.superseded`` unless asked."""
    pid = parent.info.run_id
    runs = client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{pid}'", order_by=["attributes.start_time ASC"]
    )
    return [r for r in runs if include_superseded or r.data.tags.get(SUPERSEDED_TAG) != "true"]


def resolve_parent(client: Any, target: str) -> Any:
    """``dapo report`` target → parent run: a parent run id, an ablation name, or an experiment (its newest ablation)."""
    from dapo_cli.tracking.mlflow import get_run_or_none

    if _RUN_ID.match(target):
        run = get_run_or_none(client, target)
        if run is not None:
            if "ablate.id" not in run.data.tags:
                raise UserError(f"run {target} is not an ablation parent run (no ablate.id tag)")
            return run
    experiments = client.search_experiments()
    ids = [e.experiment_id for e in experiments]
    plain = re.fullmatch(r"[A-Za-z0-9._+-]+", target) is not None  # ablation names never hold anything else
    by_name = client.search_runs(ids, f"tags.`ablate.name` = '{target}'", order_by=["attributes.start_time DESC"]) if ids and plain else []
    if by_name:
        return by_name[0]
    exp = client.get_experiment_by_name(target)
    if exp is not None:
        runs = client.search_runs([exp.experiment_id], "tags.`ablate.id` != ''", order_by=["attributes.start_time DESC"])
        if runs:
            return runs[0]
    known = client.search_runs(ids, "tags.`ablate.id` != ''", max_results=20) if ids else []
    names = sorted({r.data.tags.get("ablate.name", "") for r in known} - {""})
    hint = f"; ablations in this store: {', '.join(names)}" if names else "; this store holds no ablation"
    raise UserError(f"no ablation parent run, ablation name or experiment named '{target}'{hint}")


def variant_of(tags: dict[str, str]) -> str:
    """A child run's variant in its ablation: ``ablate.variant`` (its axis settings included,
    ``dapo@max_staleness=1``), else the trainer's ``dapo.variant`` (the technique state alone)."""
    return tags.get("ablate.variant") or tags.get("dapo.variant", "?")


def history(client: Any, run_id: str, key: str) -> dict[int, float]:
    """``step -> value`` of a metric (the last value logged at each step)."""
    return {m.step: m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)}


def artifact_text(client: Any, run_id: str, path: str) -> str | None:
    """The text of run ``run_id``'s artifact ``path`` (None when it has none)."""
    with tempfile.TemporaryDirectory(prefix="dapo-report-") as tmp:
        try:
            local = client.download_artifacts(run_id, path, tmp)
        except Exception:  # the artifact store raises various types for a missing file
            return None
        return Path(local).read_text(encoding="utf-8")


def per_problem_table(client: Any, run_id: str, step: int) -> dict[str, float]:
    """``problem_id -> correct / samples`` from the trainer's ``val/per_problem_step_<step>.json`` ({} if absent)."""
    text = artifact_text(client, run_id, f"val/per_problem_step_{step:06d}.json")
    if text is None:
        return {}
    data = json.loads(text)
    cols = data["columns"]
    rows = [dict(zip(cols, r)) for r in data["data"]]
    return {str(r["problem_id"]): float(r["correct"]) / float(r["samples"]) for r in rows if float(r["samples"]) > 0}


def child_table(client: Any, child: ChildResult, step: int) -> dict[str, float]:
    """``child``'s per-problem table at validation ``step``: the final one is read already, others once each."""
    if step == child.final_step:
        return child.per_problem
    if step not in child.tables:
        child.tables[step] = per_problem_table(client, child.run_id, step)
    return child.tables[step]


def read_child(client: Any, run: Any) -> ChildResult | None:
    """A FINISHED child's results, or None (unfinished, or no validation recorded)."""
    if run.info.status != "FINISHED" or "validation.k" not in run.data.params:
        return None
    rid, k = run.info.run_id, int(run.data.params["validation.k"])
    avg = history(client, rid, f"val/avg_at_{k}")
    if not avg:
        return None
    step = max(avg)
    stderr = history(client, rid, f"val/avg_at_{k}_stderr").get(step, math.nan)
    return ChildResult(
        run_id=rid,
        variant=variant_of(run.data.tags),
        seed=int(run.data.tags.get("dapo.seed", "0")),
        k=k,
        final_step=step,
        avg=avg[step],
        stderr=stderr,
        per_problem=per_problem_table(client, rid, step),
        curves={VAL_CURVE: avg, **{key: history(client, rid, key)
                                   for key in (*CURVE_METRICS[1:], *MECHANISM_METRICS, *COMPUTE_METRICS, SAMPLES_METRIC)}},
    )
