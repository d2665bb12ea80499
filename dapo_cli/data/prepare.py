"""``dapo prepare-data``: raw files (or a synthetic task) → DAPO parquet + manifest + MLflow run.

    result = run_prepare(PrepareOptions(inputs=(Path("raw.jsonl"),), output=Path("train.parquet")))

Pipeline, in input order (files, then rows):

1. stream each file (:func:`dapo_cli.data.readers.open_input`), its layout detected from its
   fields or named by the field options (:mod:`dapo_cli.data.layouts`); raw records go through
   :func:`~dapo_cli.data.convert.convert`, already-prepared DAPO rows are
   re-validated (integer ground truth, non-empty prompt) and keep their prompt,
   data source and integer ``extra_info.index``;
2. keep the first row of each distinct problem across all inputs (same problem text
   with case and whitespace folded, same integer ground truth: :mod:`dapo_cli.data.dedup`);
   a problem text seen with two ground truths is dropped entirely
   (``conflicting_duplicate``). Only kept rows are held in memory;
3. number the problems without an integer index after the highest kept index, apply
   ``--limit``, split off ``--val-fraction`` of the problems (seeded; copies of a
   problem stay together), repeat each problem ``--repeat`` times (the avg@K layout);
4. write ``<out>``, ``<out stem>.val.parquet`` and ``<out>.manifest.json``
   all or nothing (all temporary files complete before any is renamed into place, the
   manifest last; a failure leaves none of them: :mod:`dapo_cli.data.staging`),
   then record params, counts and the manifest in the run the caller opens (``open_run``:
   ``dapo prepare-data`` opens an MLflow run; the data layer knows no tracking backend).

The same input, options and seed give byte-identical parquet files. Every per-row
step is linear in the row's text; problems over
:data:`~dapo_cli.data.convert.MAX_PROBLEM_CHARS` characters (``problem_too_long``) and
answers longer than a verifier reads (``answer_too_long``) are dropped.

Deduplication is on by default and applies to every input. A training set holding
each prompt N times (DAPO-Math-17K as released: ~17 k prompts, each ~100 times,
~1.79 M rows) weights no prompt differently, since all are repeated alike, but makes
an epoch N times longer, puts copies of one prompt in the same batch, and turns
"one pass over the data" and per-epoch reshuffling into N passes. A file in the
K-copies evaluation layout (``aime-2024.parquet``: 30 problems × 32) is collapsed
too: its shape (identical copies of each problem) is the same as an accidentally
repeated training set's, so no rule can keep one and not the other; ``dapo eval``
samples ``--avg K`` times per distinct problem and never needs the copies; and
``--repeat K`` writes the layout back. ``--keep-duplicates`` writes every valid row
as read: copies of a problem share its index and its side of the split, and a file
in the K-copies layout keeps it (and refuses ``--repeat``).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_cli.config.validate import MAX_AVG_K
from dapo_cli.data.convert import MAX_PROBLEM_CHARS, Converted, Dropped, convert
from dapo_cli.data.dedup import (
    ProblemIndex,
    describe_layout,
    normalize_problem,
    problem_text,
    prompt_text,
    template_problem,
    uniform_copies,
)
from dapo_cli.data.manifest import (
    DedupCounts,
    FileReport,
    OpenRun,
    layout_params,
    option_params,
    tracking_metrics,
    unrecorded,
    write_outputs,
)
from dapo_cli.data.options import DEFAULT_SYNTHETIC_N, PrepareOptions
from dapo_cli.data.readers import InputSource, open_input
from dapo_cli.data.schema import DAPO_INSTRUCTION, make_row
from dapo_cli.errors import UserError
from dapo_cli.fileio import refuse_special
from dapo_cli.rewards.bounds import MAX_GROUND_TRUTH_CHARS

DEFAULT_DATA_SOURCE = "math_dapo"
"""``data_source`` of converted rows (verl picks the DAPO reward by it)."""

MAX_ROWS = 2_000_000
"""The most rows one ``prepare-data`` run writes (problems x ``--repeat``, or ``--n``), checked before a row is
built: DAPO-Math-17k as released (1.79 M rows, the 17k problems in copies) fits; ``--n 10**12`` or ``--repeat 10**9``
is refused at once instead of running out of memory (100,000 synthetic rows took 0.7 GB)."""
MAX_REPEAT = MAX_AVG_K
"""``--repeat``'s bound: ``dapo eval --avg``'s."""
_INTEGER = re.compile(r"-?[0-9]+")  # ASCII: "１２" (fullwidth) would never match a model's "12"

problem_key = normalize_problem
"""Deduplication text key (case folded, whitespace runs collapsed); see :mod:`dapo_cli.data.dedup`."""


@dataclass(frozen=True)
class PrepareResult:
    """Counts, output paths and the manifest of one :func:`run_prepare`."""

    output: Path
    val_output: Path | None
    manifest_path: Path
    manifest: dict[str, Any]
    files: tuple[FileReport, ...]
    train_rows: int
    val_rows: int
    run_id: str
    dedup: DedupCounts = field(default_factory=DedupCounts)

    @property
    def kept(self) -> Counter[str]:
        return sum((f.kept for f in self.files), Counter())

    @property
    def dropped(self) -> Counter[str]:
        return sum((f.dropped for f in self.files), Counter())

    @property
    def rows_read(self) -> int:
        return sum(f.rows_read for f in self.files)

    @property
    def duplicates_removed(self) -> int:
        """Rows dropped as exact duplicates (not counting ``conflicting_duplicate``)."""
        return self.dropped["duplicate"]


@dataclass
class _Problem:
    """One kept problem: its rows (one; every copy with ``--keep-duplicates``) before numbering and splitting."""

    key: bytes
    """Digest of the normalised problem text."""
    index: int | None
    """The integer index of a prepared input (None: numbered later)."""
    split: str | None = None
    """Forced split (synthetic tasks draw train and val from disjoint partitions)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    positions: list[tuple[int, int]] = field(default_factory=list)
    """(input number, row number) of each row: the output keeps the input's row order."""
    reports: list[FileReport] = field(default_factory=list)
    """The input each row came from (its counts change when the row is dropped later)."""

    def add(self, row: dict[str, Any], position: tuple[int, int], report: FileReport) -> None:
        self.rows.append(row)
        self.positions.append(position)
        self.reports.append(report)

    def drop(self, reason: str) -> None:
        """Move every row of this problem from its input's kept counts to ``dropped[reason]``."""
        for row, report in zip(self.rows, self.reports, strict=True):
            report.kept[row["extra_info"]["conversion"]] -= 1
            report.dropped[reason] += 1


# ---------------------------------------------------------------------------
# Validation and small helpers


def validate_options(options: PrepareOptions) -> None:
    """UserError (one line) for every inconsistent option, before any file is read."""
    if bool(options.inputs) == bool(options.synthetic):
        raise UserError("give input files or --synthetic NAME (exactly one of them)")
    if not 0 <= options.val_fraction < 1:
        raise UserError(f"--val-fraction must be in [0, 1), got {options.val_fraction}")
    if not 1 <= options.repeat <= MAX_REPEAT:
        raise UserError(f"--repeat must be in [1, {MAX_REPEAT}], got {options.repeat:,}")
    if options.limit is not None and options.limit < 1:
        raise UserError(f"--limit must be >= 1, got {options.limit}")
    if options.n < 1:
        raise UserError(f"--n must be >= 1, got {options.n}")
    if options.synthetic and options.n * options.repeat > MAX_ROWS:  # counted before a row is generated
        raise UserError(f"--n {options.n:,} x --repeat {options.repeat} = {options.n * options.repeat:,} rows; at most "
                        f"{MAX_ROWS:,} per run")
    if options.fields.named() and options.synthetic:
        raise UserError("field options (--problem-field, ...) apply to input files, not to --synthetic")
    if any(not name.strip() for _, name in options.fields.named()):
        raise UserError("a field option names an empty field")
    if options.template is not None and "{problem}" not in options.template:
        raise UserError("--template must contain {problem} where the problem text goes")
    paths = [p for p in (options.output, options.val_path, options.manifest_path) if p is not None]
    for path in paths:
        refuse_special(path, "output")
    for path in options.inputs:
        refuse_special(path, "input")
    outputs = [p.resolve() for p in paths]
    if len(set(outputs)) != len(outputs):
        raise UserError("the output, validation output and manifest paths must differ")
    for path in paths:
        if path.is_dir():
            raise UserError(f"output {path} is a directory; give a file path such as {path / 'train.parquet'}")
        blocking = next((a for a in path.parents if a.exists()), None)
        if blocking is not None and not blocking.is_dir():
            raise UserError(f"cannot write {path}: {blocking} is a file, not a directory")
    for path in options.inputs:
        if path.resolve() in outputs:
            raise UserError(f"output {path} is also an input; write to another file")


def _schema_row(row: dict[str, Any], *, template: str | None, data_source: str | None) -> dict[str, Any]:
    """A prepared row in exactly :data:`dapo_cli.data.schema.DAPO_SCHEMA` (extra columns dropped, missing fields filled)."""
    extra = dict(row.get("extra_info") or {})
    reward = row.get("reward_model") or {}
    truth = str(reward.get("ground_truth")).strip()
    raw_problem = extra.get("raw_problem") or template_problem(row)
    prompt = [{"content": str(m.get("content") or ""), "role": str(m.get("role") or "user")} for m in row["prompt"]]
    if template is not None and raw_problem:
        prompt = [{"content": template.replace("{problem}", raw_problem), "role": "user"}]
    return {
        "data_source": data_source or row.get("data_source") or DEFAULT_DATA_SOURCE,
        "prompt": prompt,
        "ability": row.get("ability") or "MATH",
        "reward_model": {"ground_truth": truth, "style": reward.get("style") or "rule-lighteval/MATH_v2"},
        "extra_info": {
            "index": None,
            "raw_problem": raw_problem,
            "split": extra.get("split"),
            "original_answer": extra.get("original_answer") or truth,
            "conversion": extra.get("conversion") or "integer",
        },
    }


def _malformed(row: dict[str, Any]) -> bool:
    """Whether a prepared row's cells lack the types the output schema needs (a JSON row can hold anything).

    ``prompt`` a list of messages (dicts), ``reward_model`` a dict, ``extra_info`` a dict or
    null (missing or null prompt and reward_model are dropped later as ``empty_prompt`` and
    ``no_answer``), and every text cell copied to the output a string or null.
    """
    prompt, reward, extra = row.get("prompt") or [], row.get("reward_model") or {}, row.get("extra_info")
    if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
        return True
    if not isinstance(reward, dict) or not (extra is None or isinstance(extra, dict)):
        return True
    texts = [row.get("data_source"), row.get("ability"), reward.get("style")]
    texts += [(extra or {}).get(key) for key in ("raw_problem", "split", "original_answer", "conversion")]
    return not all(value is None or isinstance(value, str) for value in texts)


def _prepared_reason(row: dict[str, Any]) -> str | None:
    """Why a prepared row is dropped (None: kept). Linear in the row's text."""
    if _malformed(row):
        return "malformed_row"
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if truth is None or not str(truth).strip():
        return "no_answer"
    truth = str(truth).strip()
    if len(truth) > MAX_GROUND_TRUTH_CHARS:
        return "answer_too_long"  # no verifier reads it (dapo_cli.rewards.bounds)
    if not _INTEGER.fullmatch(truth):
        return "non_integer_ground_truth"
    prompt = prompt_text(row)
    if len(problem_text(row)) > MAX_PROBLEM_CHARS or len(prompt) > MAX_PROBLEM_CHARS + len(DAPO_INSTRUCTION):
        return "problem_too_long"
    if not prompt.strip():
        return "empty_prompt"
    return None


def _index_key(value: Any) -> int | None:
    """An integer ``extra_info.index`` (``12`` or ``"12"``); None for anything else (a UUID string, null)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value)
    return None


# ---------------------------------------------------------------------------
# Collecting problems from inputs


class _Collector:
    """Every kept problem in input order, placed by one :class:`~dapo_cli.data.dedup.ProblemIndex`."""

    def __init__(self, options: PrepareOptions) -> None:
        self.options = options
        self.seen: ProblemIndex[_Problem] = ProblemIndex()
        self.problems: list[_Problem] = []
        self.counts = DedupCounts()

    def offer(
        self,
        text: str,
        truth: str,
        build: Callable[[], dict[str, Any]],
        position: tuple[int, int],
        report: FileReport,
        copies: Counter[tuple[bytes, int]],
        *,
        conversion: str,
        index: int | None = None,
        split: str | None = None,
    ) -> _Problem | None:
        """Place one valid row; the new problem it starts, or None (a copy, or a conflicting answer).

        ``build`` makes the output row; it is called only for rows that are kept.
        """
        seen = self.seen.find(text, truth)
        copies[(seen.digest, seen.truth)] += 1
        if seen.known:
            self.counts.duplicate_rows += 1
            if self.options.keep_duplicates and seen.owner is not None:
                seen.owner.add(build(), position, report)
                report.kept[conversion] += 1
            else:
                report.dropped["duplicate"] += 1
            return None
        if seen.conflict and not self.options.keep_duplicates:
            self.seen.add(seen, None)
            report.dropped["conflicting_duplicate"] += 1
            return None
        problem = _Problem(seen.digest, index, split)
        problem.add(build(), position, report)
        report.kept[conversion] += 1
        self.seen.add(seen, problem)
        self.problems.append(problem)
        return problem

    def finish(self) -> list[_Problem]:
        """The kept problems, less every problem whose text turned out to have another ground truth."""
        conflicting = self.seen.conflicting()
        self.counts.conflicting_problems = len(conflicting)
        if conflicting and not self.options.keep_duplicates:
            for problem in self.problems:
                if problem.key in conflicting:
                    problem.drop("conflicting_duplicate")
            self.problems = [p for p in self.problems if p.key not in conflicting]
        self.counts.distinct_problems = len(self.problems)
        return self.problems


def _collect_raw(source: InputSource, report: FileReport, collector: _Collector, number: int) -> None:
    options = collector.options
    template = options.template or DAPO_INSTRUCTION
    answer_sources: Counter[str] = Counter()
    copies: Counter[tuple[bytes, int]] = Counter()
    for raw in source.raw_problems():
        answer_sources[raw.answer_source] += 1
        result = Dropped(raw.drop) if raw.drop is not None else convert(raw.problem, raw.answer)
        if not isinstance(result, Converted):
            report.dropped[result.reason] += 1
            continue

        def build(result: Converted = result, answer: str | None = raw.answer) -> dict[str, Any]:
            return make_row(
                result.problem,
                result.ground_truth,
                index=0,  # numbered once every input is read
                template=template,
                data_source=options.data_source or DEFAULT_DATA_SOURCE,
                original_answer=answer,
                conversion=result.conversion,
            )

        collector.offer(raw.problem, result.ground_truth, build, (number, raw.row), report, copies, conversion=result.conversion)
    report.answer_sources = dict(sorted(answer_sources.items()))
    report.layout = describe_layout(copies)


def _collect_prepared(
    rows: Iterable[dict[str, Any]],
    report: FileReport,
    collector: _Collector,
    number: int,
    split: str | None = None,
) -> list[_Problem]:
    """The new problems of valid prepared rows; an index already used in this file is renumbered."""
    options = collector.options
    copies: Counter[tuple[bytes, int]] = Counter()
    used: set[int] = set()
    problems = []
    for position, row in enumerate(rows):
        reason = _prepared_reason(row)
        if reason is not None:
            report.dropped[reason] += 1
            continue
        extra = row.get("extra_info") or {}

        def build(row: dict[str, Any] = row) -> dict[str, Any]:
            return _schema_row(row, template=options.template, data_source=options.data_source)

        problem = collector.offer(
            problem_text(row),
            str(row["reward_model"]["ground_truth"]),
            build,
            (number, position),
            report,
            copies,
            conversion=extra.get("conversion") or "integer",
            index=_index_key(extra.get("index")),
            split=split,
        )
        if problem is not None:
            problems.append(problem)
            if problem.index is not None and problem.index in used:
                problem.index = None  # two problems under one index: the later one is numbered after the rest
            elif problem.index is not None:
                used.add(problem.index)
    report.layout = describe_layout(copies)
    k = uniform_copies(copies)
    if options.keep_duplicates and k > 1 and options.repeat > 1:
        raise UserError(f"{report.path} is already in the {k}-copies layout; drop --repeat (or --keep-duplicates)")
    return problems


def _report_for(source: InputSource) -> FileReport:
    fields = source.layout.as_dict() if source.layout is not None else {}
    if source.split is not None:
        fields["split"] = source.split
    return FileReport(
        path=str(source.path),
        sha256=source.sha256(),
        format=source.format,
        kind=source.kind,
        rows_read=source.rows_read,
        problem_field=source.problem_field,
        fields=fields,
        detected=source.describe(),
        fields_param=source.layout.compact() if source.layout is not None else "prepared DAPO rows",
    )


def collect(options: PrepareOptions) -> tuple[list[_Problem], list[FileReport], DedupCounts]:
    """Every kept problem in input order, one report per input (or per synthetic split), and the dedup counts."""
    collector = _Collector(options)
    reports: list[FileReport] = []
    if options.synthetic:
        from dapo_cli.data.synthetic import (
            generate_rows,  # imported lazily: only this path needs it
        )

        n_val = max(1, round(options.n * options.val_fraction)) if options.val_fraction > 0 else 0
        if n_val >= options.n:
            raise UserError(f"--n {options.n} is too small to split off --val-fraction {options.val_fraction}")
        for split, count in (("train", options.n - n_val), ("val", n_val)):
            if count <= 0:
                continue
            rows = tuple(generate_rows(options.synthetic, count, options.seed, split))
            report = FileReport(f"synthetic:{options.synthetic}:{split}", "", "synthetic", "synthetic", len(rows))
            reports.append(report)
            _collect_prepared(rows, report, collector, len(reports), split if n_val else None)
        return collector.finish(), reports, collector.counts
    for number, path in enumerate(options.inputs):
        source = open_input(path, options.fields)
        report = _report_for(source)
        reports.append(report)
        if source.kind == "dapo":
            earlier = collector.problems[:]
            _shift(_collect_prepared(source.records(), report, collector, number), earlier)
        else:
            _collect_raw(source, report, collector, number)
    return collector.finish(), reports, collector.counts


def _shift(new: list[_Problem], earlier: list[_Problem]) -> list[_Problem]:
    """Shift a prepared file's indices past earlier ones when they collide (the file's layout is kept)."""
    used = {p.index for p in earlier if p.index is not None}
    mine = [p.index for p in new if p.index is not None]
    if used and mine and used.intersection(mine):
        offset = max(used) + 1 - min(mine)
        for problem in new:
            problem.index = None if problem.index is None else problem.index + offset
    return new


# ---------------------------------------------------------------------------
# Numbering, limiting, splitting


def _number(problems: list[_Problem]) -> None:
    """Give problems without an index consecutive indices after the highest index, in input order."""
    next_index = max((p.index for p in problems if p.index is not None), default=-1) + 1
    for problem in problems:
        if problem.index is None:
            problem.index = next_index
            next_index += 1


def _split(problems: list[_Problem], options: PrepareOptions) -> tuple[list[_Problem], list[_Problem]]:
    """(train, val): forced splits as given, else a seeded sample of ``val_fraction`` of the problems."""
    if options.val_fraction <= 0:
        return problems, []
    if any(p.split is not None for p in problems):
        return [p for p in problems if p.split != "val"], [p for p in problems if p.split == "val"]
    if len(problems) < 2:
        raise UserError(f"--val-fraction needs at least 2 problems, only {len(problems)} kept")
    n_val = min(max(round(len(problems) * options.val_fraction), 1), len(problems) - 1)
    chosen = set(random.Random(options.seed).sample(range(len(problems)), n_val))
    return [p for i, p in enumerate(problems) if i not in chosen], [p for i, p in enumerate(problems) if i in chosen]


def _rows(problems: list[_Problem], split: str | None, repeat: int) -> list[dict[str, Any]]:
    """Output rows in input row order, each repeated ``repeat`` times in a row, with index and split set."""
    out = []
    for problem in problems:
        for position, row in zip(problem.positions, problem.rows, strict=True):
            extra = dict(row["extra_info"], index=problem.index)
            if split is not None:
                extra["split"] = split
            out.extend((position, dict(row, extra_info=extra)) for _ in range(repeat))
    out.sort(key=lambda item: item[0])  # stable: repeats stay together
    return [row for _, row in out]


def run_prepare(options: PrepareOptions, open_run: OpenRun = unrecorded) -> PrepareResult:
    """Prepare, write and record one dataset; UserError (nothing written) on bad input.

    ``open_run(options)`` opens the record of the run (``dapo prepare-data``: an MLflow run),
    after the inputs are read and before anything is written; by default nothing is recorded.
    """
    validate_options(options)
    problems, reports, dedup = collect(options)
    if not problems:
        dropped = sum((r.dropped for r in reports), Counter())
        reasons = ", ".join(f"{reason} {n}" for reason, n in dropped.most_common()) or "no rows"
        raise UserError(f"every row was dropped ({reasons}); nothing to write")
    _number(problems)
    if options.limit is not None:
        for problem in problems[options.limit :]:
            problem.drop("limit")
        problems = problems[: options.limit]
    for report in reports:
        report.kept = +report.kept  # drop the zero counts left by conflicts and --limit
    rows = len(problems) * options.repeat
    if rows > MAX_ROWS:  # counted before a row is built
        raise UserError(f"{len(problems):,} problems x --repeat {options.repeat} = {rows:,} rows; at most {MAX_ROWS:,} "
                        "per run: a smaller --repeat or --limit")
    train, val = _split(problems, options)
    split_name = "train" if val else None
    writes = [("train", options.output, _rows(train, split_name, options.repeat))]
    if options.val_path is not None:
        writes.append(("val", options.val_path, _rows(val, "val", options.repeat)))
    with open_run(options) as record:
        manifest = write_outputs(options, reports, writes, dedup)
        record.log_params({**option_params(options), **layout_params(reports)})
        record.log_metrics(tracking_metrics(manifest), step=0)
        record.log_artifact(options.manifest_path)
        run_id = record.run_id
    outputs = manifest["outputs"]
    return PrepareResult(
        output=options.output,
        val_output=options.val_path,
        manifest_path=options.manifest_path,
        manifest=manifest,
        files=tuple(reports),
        train_rows=outputs[0]["rows"],
        val_rows=outputs[1]["rows"] if len(outputs) > 1 else 0,
        run_id=run_id,
        dedup=dedup,
    )

