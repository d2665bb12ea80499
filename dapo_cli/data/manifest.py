"""What ``dapo prepare-data`` records: per-input reports, the manifest, MLflow params and metrics.

The run they are recorded in is the caller's (:data:`OpenRun`; ``dapo prepare-data`` opens an
MLflow run): this layer knows the :class:`RunRecord` it writes to, not a tracking backend.

The manifest (``<out>.manifest.json``) holds the options, one entry per input (sha256,
the fields its problems and answers were read from and the detection report, rows per
problem, rows kept per conversion and dropped per reason), the totals under
``counts`` (``duplicates_removed``, ``conflicting_duplicates_removed`` and
``conflicting_problems`` among them) and the sha256 of every written file. It is
written with the parquet files, all or nothing: every temporary file is complete
before any is renamed into place, the manifest last (:mod:`dapo_cli.data.staging`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dapo_cli import __version__
from dapo_cli.data.convert import CONVERSIONS
from dapo_cli.data.options import PrepareOptions
from dapo_cli.data.schema import write_dapo_table
from dapo_cli.data.staging import staged_outputs
from dapo_cli.fileio import sha256_file


@dataclass
class FileReport:
    """What happened to one input: rows read, kept per conversion, dropped per reason."""

    path: str
    sha256: str
    format: str
    kind: str
    rows_read: int
    layout: str = "1 per problem"
    """Rows per distinct problem in this input (``32 per problem`` for the AIME file), as read."""
    problem_field: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    """Where problems and answers were read from: the fields of each role in order of precedence,
    whether the problem is text or chat messages, the roles named by an option, a folder's split."""
    detected: str = ""
    """The one-line detection report printed for this input (format, split, rows, layout)."""
    fields_param: str = ""
    """The layout in short, as recorded in MLflow (``input_<i>_fields``)."""
    answer_sources: dict[str, int] = field(default_factory=dict)
    kept: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)


@dataclass
class DedupCounts:
    """What deduplication found over all inputs."""

    distinct_problems: int = 0
    """Problems kept after deduplication and conflicts, before ``--limit``."""
    duplicate_rows: int = 0
    """Rows repeating an earlier row's problem and answer: removed, or written with ``--keep-duplicates``."""
    conflicting_problems: int = 0
    """Problem texts seen with more than one ground truth (all their rows dropped unless ``--keep-duplicates``)."""


def option_params(options: PrepareOptions) -> dict[str, Any]:
    """The options as flat MLflow params (paths and tuples as strings)."""
    return {
        "inputs": ",".join(str(p) for p in options.inputs),
        "output": str(options.output),
        "val_output": str(options.val_path or ""),
        "synthetic": options.synthetic or "",
        "n": options.n,
        "template": options.template or "",
        "data_source": options.data_source or "",
        "val_fraction": options.val_fraction,
        "seed": options.seed,
        "repeat": options.repeat,
        "limit": options.limit or 0,
        "keep_duplicates": options.keep_duplicates,
        "problem_field": options.fields.problem or "",
        "answer_field": options.fields.answer or "",
        "solution_field": options.fields.solution or "",
        "context_fields": ",".join(options.fields.context),
    }


def layout_params(reports: list[FileReport]) -> dict[str, str]:
    """What was detected in each input as MLflow params: ``input_<i>_fields`` (and ``input_<i>_split``)."""
    params = {}
    for number, report in enumerate(reports):
        if report.kind == "synthetic":
            continue
        params[f"input_{number}_fields"] = report.fields_param
        if "split" in report.fields:
            params[f"input_{number}_split"] = report.fields["split"]
    return params


def build_manifest(
    options: PrepareOptions, reports: list[FileReport], outputs: list[dict[str, Any]], dedup: DedupCounts
) -> dict[str, Any]:
    kept = sum((r.kept for r in reports), Counter())
    dropped = sum((r.dropped for r in reports), Counter())
    return {
        "command": "prepare-data",
        "version": __version__,
        "options": option_params(options),
        "inputs": [
            {**asdict(r), "kept": dict(sorted(r.kept.items())), "dropped": dict(sorted(r.dropped.items()))}
            for r in reports
        ],
        "counts": {
            "rows_read": sum(r.rows_read for r in reports),
            "kept": sum(kept.values()),
            "kept_by_conversion": {c: kept[c] for c in CONVERSIONS if kept[c]},
            "dropped": sum(dropped.values()),
            "dropped_by_reason": dict(sorted(dropped.items())),
            "deduplicated": not options.keep_duplicates,
            "distinct_problems": dedup.distinct_problems,
            "duplicates_removed": dropped["duplicate"],
            "duplicates_kept": dedup.duplicate_rows if options.keep_duplicates else 0,
            "conflicting_duplicates_removed": dropped["conflicting_duplicate"],
            "conflicting_problems": dedup.conflicting_problems,
        },
        "outputs": outputs,
    }


def tracking_metrics(manifest: dict[str, Any]) -> dict[str, float]:
    """The manifest's counts as ``data/...`` MLflow metrics."""
    counts = manifest["counts"]
    metrics = {"data/rows_read": counts["rows_read"], "data/kept": counts["kept"], "data/dropped": counts["dropped"]}
    metrics.update({f"data/kept_{c}": n for c, n in counts["kept_by_conversion"].items()})
    metrics.update({f"data/dropped_{r}": n for r, n in counts["dropped_by_reason"].items()})
    for name in ("distinct_problems", "duplicates_removed", "duplicates_kept", "conflicting_duplicates_removed", "conflicting_problems"):
        metrics[f"data/{name}"] = counts[name]
    metrics.update({f"data/{o['split']}_rows": o["rows"] for o in manifest["outputs"]})
    return {k: float(v) for k, v in metrics.items()}


def write_outputs(
    options: PrepareOptions,
    reports: list[FileReport],
    writes: list[tuple[str, Path, list[dict[str, Any]]]],
    dedup: DedupCounts,
) -> dict[str, Any]:
    """Write every parquet file and the manifest to temporary files, then rename them all into place.

    All or nothing (:mod:`dapo_cli.data.staging`): on a failure (full disk, read-only or
    missing destination, a directory in the way) no output, temporary or new directory
    is left, and :class:`~dapo_cli.errors.UserError` names the destination in one line.
    The manifest is renamed last.
    """
    with staged_outputs() as stage:
        outputs = []
        for split, path, rows in writes:
            tmp = stage.path_for(path)
            write_dapo_table(rows, tmp)
            outputs.append({"split": split, "path": str(path), "rows": len(rows), "sha256": sha256_file(tmp)})
        manifest = build_manifest(options, reports, outputs, dedup)
        manifest_tmp = stage.path_for(options.manifest_path)
        manifest_tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return manifest


class RunRecord(Protocol):
    """Where one preparation is recorded (a :class:`dapo_cli.tracking.Tracker` is one)."""

    run_id: str

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...


OpenRun = Callable[[PrepareOptions], AbstractContextManager[RunRecord]]
"""Opens the record of one preparation (called once the inputs are read, before anything is written)."""


class Unrecorded:
    """A preparation recorded nowhere (``run_id`` empty): the default of :func:`dapo_cli.data.prepare.run_prepare`."""

    run_id = ""

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        pass


def unrecorded(options: PrepareOptions) -> AbstractContextManager[RunRecord]:
    """The :data:`OpenRun` that records nothing."""
    return nullcontext(Unrecorded())
