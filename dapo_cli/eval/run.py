"""Sample K responses per problem, score them, summarise; outputs and resume for ``dapo eval``.

Two layers:

* the library the trainer also calls for validation, :func:`evaluate_problems`
  (engine + problems + prompts in, :class:`EvalResult` out; no Typer, no rich, no
  config objects), built from :func:`generate_records` and :func:`summarize`;
* :func:`run_eval`, the whole command: resolve checkpoint and dataset, resume from
  ``--output DIR``, generate, write ``generations.parquet`` / ``summary.json``, and
  record an MLflow run.

Problems are generated in fixed batches of ``batch_problems`` problems (batch ``b``
always holds the same problems), and batch ``b`` samples with seed ``seed + b``, so a
resumed run produces exactly the samples an uninterrupted run would have.

A batch is as many whole problems as one generate call holds: ``--batch-size // K``, or
with ``--batch-size 0`` (auto, the default) up to 64 sequences per call, where per-step
overhead is spent (:func:`~dapo_cli.eval.limits.sequences_per_call`).

Memory is bounded whatever ``--avg`` is: no generate call holds more than
:func:`sequences_per_call` sequences (``--batch-size``; auto: 64, or one problem's K up to
:data:`~dapo_cli.eval.limits.MAX_SEQUENCES_PER_CALL`), so K samples of one problem beyond that
are drawn in chunks (chunk ``c > 0`` of batch ``b`` with seed ``seed + b + c·B``, B the
number of batches); and :func:`check_memory` refuses, with one line naming the setting
to lower, a run whose samples could not be held in this machine's memory.

Speed: the seconds inside ``engine.generate`` are timed (:mod:`dapo_cli.eval.speed`), and
``eval/samples_per_s`` / ``eval/gen_tokens_per_s`` of the samples this invocation generated
are logged and reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dapo_cli.config.schema import EvalConfig
from dapo_cli.errors import LISTED_AS_NAMES, UserError, unknown_name
from dapo_cli.eval import metrics as M
from dapo_cli.eval.generations import (
    CHECKPOINT_FILE,
    GENERATIONS_FILE,
    SUMMARY_FILE,
    GenerationCheckpoint,
    SampleRecord,
    write_generations,
)
from dapo_cli.eval.limits import check_memory, problems_per_call, sequences_per_call
from dapo_cli.eval.problems import Problem
from dapo_cli.eval.speed import Stopwatch, prefill_counts, throughput
from dapo_cli.fileio import write_json_atomic
from dapo_cli.rollout.base import RolloutEngine, SamplingParams

@dataclass
class EvalResult:
    """Metrics (keys from :func:`~dapo_cli.eval.metrics.metric_keys`), every sample, and one dict per problem."""

    metrics: dict[str, float]
    records: list[SampleRecord]
    per_problem: list[dict[str, Any]]


class ProgressSink(Protocol):
    """Receives progress in samples (the CLI shows a rich bar; the library default shows nothing)."""

    def start(self, total: int, completed: int) -> None: ...

    def advance(self, samples: int) -> None: ...


class NullProgress:
    """A progress sink that shows nothing."""

    def start(self, total: int, completed: int) -> None:
        pass

    def advance(self, samples: int) -> None:
        pass


def check_k(k: int, pass_k: Sequence[int]) -> None:
    """K >= 1 and 1 <= k <= K for every pass@k; UserError naming the fix otherwise."""
    if k < 1:
        raise UserError(f"--avg must be at least 1 (got {k})")
    bad = [j for j in pass_k if not 1 <= j <= k]
    if bad:
        raise UserError(f"--pass-k values must lie in 1..{k} (= --avg); got {', '.join(map(str, bad))}")


def problem_batches(num_problems: int, batch_problems: int) -> list[range]:
    """Fixed consecutive batches of problem indices (``batch_problems <= 0``: one batch)."""
    size = batch_problems if batch_problems > 0 else max(num_problems, 1)
    return [range(start, min(start + size, num_problems)) for start in range(0, num_problems, size)]


def batch_params(params: SamplingParams, batch_index: int) -> SamplingParams:
    """``params`` with seed ``seed + batch_index`` (unseeded stays unseeded)."""
    if params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + batch_index)


def generate_calls(num_problems: int, k: int, max_sequences: int | None) -> list[tuple[range, int]]:
    """(problem positions, samples per problem) of each generate call of one batch.

    One call when ``num_problems * k <= max_sequences`` (or ``max_sequences`` is None);
    else groups of ``max_sequences // k`` problems; and when ``k > max_sequences``, one
    problem per call in chunks of at most ``max_sequences`` samples. No call exceeds
    ``max_sequences`` sequences.
    """
    if max_sequences is None or num_problems * k <= max_sequences:
        return [(range(num_problems), k)]
    if max_sequences < 1:
        raise ValueError(f"max_sequences must be >= 1, got {max_sequences}")
    if k <= max_sequences:
        size = max_sequences // k
        return [(range(start, min(start + size, num_problems)), k) for start in range(0, num_problems, size)]
    return [
        (range(i, i + 1), min(max_sequences, k - done)) for i in range(num_problems) for done in range(0, k, max_sequences)
    ]


def generate_batch(
    engine: RolloutEngine,
    problems: Sequence[Problem],
    prompts: Sequence[str],
    *,
    k: int,
    params: SamplingParams,
    verifier: str,
    max_sequences: int | None = None,
    seed_stride: int = 1,
    stopwatch: Stopwatch | None = None,
) -> list[SampleRecord]:
    """Sample ``k`` responses for each of ``problems`` (templated ``prompts``) and score them.

    At most ``max_sequences`` sequences per ``engine.generate`` call (None: one call for
    the batch); call ``c`` (see :func:`generate_calls`) samples with seed
    ``params.seed + c * seed_stride``, so call 0 is the single call of an unchunked batch.
    ``stopwatch`` (if given) times each ``engine.generate`` call.
    """
    from dapo_cli.rewards import score_batch

    seen: dict[str, int] = {}
    records = []
    for call, (positions, n) in enumerate(generate_calls(len(problems), k, max_sequences)):
        call_params = params
        if call and params.seed is not None:
            call_params = dataclasses.replace(params, seed=params.seed + call * seed_stride)
        with stopwatch if stopwatch is not None else contextlib.nullcontext():
            rollouts = engine.generate([prompts[i] for i in positions], n, call_params)
        owners = [problems[positions[int(i)]] for i in rollouts.prompt_index.tolist()]
        scores, accs, preds = score_batch(verifier, rollouts.texts, [p.ground_truth for p in owners])
        lengths = rollouts.lengths.tolist()
        truncated = rollouts.truncated.tolist()
        for i, problem in enumerate(owners):
            index = seen[problem.problem_id] = seen.get(problem.problem_id, -1) + 1
            records.append(
                SampleRecord(
                    problem.problem_id, index, rollouts.texts[i], preds[i], bool(accs[i]), float(scores[i]),
                    problem.ground_truth, int(lengths[i]), bool(truncated[i]),
                )
            )
        del rollouts  # the token tensors of one call at a time
    return records


def generate_records(
    engine: RolloutEngine,
    problems: Sequence[Problem],
    prompts: Sequence[str],
    *,
    k: int,
    params: SamplingParams,
    verifier: str,
    batch_problems: int = 0,
    skip_batches: frozenset[int] = frozenset(),
    on_batch: Callable[[int, list[SampleRecord]], None] | None = None,
    max_sequences: int | None = None,
    stopwatch: Stopwatch | None = None,
) -> list[SampleRecord]:
    """Records of every batch not in ``skip_batches``; ``on_batch(b, records)`` after each.

    ``max_sequences``: most sequences per generate call (None: one call per batch); see
    :func:`generate_batch` (chunk ``c`` of batch ``b`` samples with seed ``seed + b + c·B``).
    ``stopwatch`` (if given) sums the seconds spent in ``engine.generate``.
    """
    if len(prompts) != len(problems):
        raise ValueError(f"{len(problems)} problems but {len(prompts)} prompts")
    out: list[SampleRecord] = []
    batches = problem_batches(len(problems), batch_problems)
    for b, idx in enumerate(batches):
        if b in skip_batches:
            continue
        records = generate_batch(
            engine,
            [problems[i] for i in idx],
            [prompts[i] for i in idx],
            k=k,
            params=batch_params(params, b),
            verifier=verifier,
            max_sequences=max_sequences,
            seed_stride=len(batches),
            stopwatch=stopwatch,
        )
        if on_batch is not None:
            on_batch(b, records)
        out.extend(records)
    return out


def summarize(problems: Sequence[Problem], records: Sequence[SampleRecord], *, k: int, pass_k: Sequence[int] = ()) -> EvalResult:
    r"""Metrics over ``problems`` from exactly ``k`` records per problem.

    * ``avg@K`` = mean ``acc`` over all :math:`P K` samples (= mean per-problem accuracy);
    * ``pass@k`` = mean over problems of the unbiased estimator (:func:`~dapo_cli.eval.metrics.pass_at_k`);
    * ``maj@K`` = share of problems whose majority answer is correct (:func:`~dapo_cli.eval.metrics.majority_correct`);
    * ``avg@K_stderr`` and ``avg@K_ci95_low/high`` over per-problem accuracies;
    * ``mean_length`` (tokens) and ``truncation_rate`` over all samples.
    """
    check_k(k, pass_k)
    by_problem: dict[str, list[SampleRecord]] = {p.problem_id: [] for p in problems}
    for r in records:
        if r.problem_id not in by_problem:
            raise ValueError(f"record for unknown problem {r.problem_id}")
        by_problem[r.problem_id].append(r)
    per_problem = []
    ordered: list[SampleRecord] = []
    for problem in problems:
        samples = sorted(by_problem[problem.problem_id], key=lambda r: r.sample_index)
        if len(samples) != k:
            raise ValueError(f"problem {problem.problem_id} has {len(samples)} samples, expected {k}")
        ordered.extend(samples)
        majority, maj_ok = M.majority_correct([r.pred for r in samples], [r.acc for r in samples])
        correct = sum(r.acc for r in samples)
        per_problem.append(
            {
                "problem_id": problem.problem_id,
                "correct": correct,
                "samples": k,
                "accuracy": correct / k,
                "majority": majority,
                "majority_correct": maj_ok,
                "ground_truth": problem.ground_truth,
                "problem": problem.raw_problem,
            }
        )
    accuracy = [row["accuracy"] for row in per_problem]
    low, high = M.bootstrap_ci(accuracy)
    values: dict[str, float] = {
        f"avg@{k}": sum(r.acc for r in ordered) / len(ordered),
        **{f"pass@{j}": M.mean_pass_at_k([(k, row["correct"]) for row in per_problem], j) for j in pass_k},
        f"maj@{k}": sum(row["majority_correct"] for row in per_problem) / len(per_problem),
        f"avg@{k}_stderr": M.standard_error(accuracy),
        f"avg@{k}_ci95_low": low,
        f"avg@{k}_ci95_high": high,
        "mean_length": sum(r.length for r in ordered) / len(ordered),
        "truncation_rate": sum(r.truncated for r in ordered) / len(ordered),
        "num_problems": float(len(problems)),
        "num_samples": float(len(ordered)),
    }
    return EvalResult(metrics={key: values[key] for key in M.metric_keys(k, pass_k)}, records=ordered, per_problem=per_problem)


def evaluate_problems(
    engine: RolloutEngine,
    problems: list[Problem],
    prompts: list[str],
    *,
    k: int,
    params: SamplingParams,
    verifier: str,
    pass_k: Sequence[int] = (),
    batch_problems: int = 0,
    max_sequences: int | None = None,
) -> EvalResult:
    """Sample ``k`` responses per problem with ``engine``, score with ``verifier``, summarise.

    ``prompts[i]`` is ``problems[i]``'s templated prompt. ``batch_problems`` problems go
    to the engine per batch (0: all at once), in calls of at most ``max_sequences``
    sequences (None: one call per batch). The trainer may prefix the metric keys
    (``val/``) and must pass them through :func:`~dapo_cli.eval.metrics.tracking_metrics`
    for MLflow.
    """
    check_k(k, pass_k)
    records = generate_records(
        engine, problems, prompts, k=k, params=params, verifier=verifier, batch_problems=batch_problems,
        max_sequences=max_sequences,
    )
    return summarize(problems, records, k=k, pass_k=pass_k)


# --------------------------------------------------------------------------- outputs


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN: undefined statistics (e.g. stderr of one problem) become null."""
    return value if math.isfinite(value) else None


def summary_dict(result: EvalResult, settings: Mapping[str, Any]) -> dict[str, Any]:
    """What ``summary.json`` holds: ``metrics`` (exact metric keys), ``settings``, ``per_problem``."""
    return {
        "metrics": {key: finite_or_none(v) for key, v in result.metrics.items()},
        "settings": dict(settings),
        "per_problem": result.per_problem,
    }


def write_outputs(directory: Path, result: EvalResult, settings: Mapping[str, Any]) -> dict[str, Path]:
    """Write ``generations.parquet`` and ``summary.json`` into ``directory`` (each atomically)."""
    paths = {"generations": directory / GENERATIONS_FILE, "summary": directory / SUMMARY_FILE}
    write_generations(result.records, paths["generations"])
    write_json_atomic(paths["summary"], summary_dict(result, settings))
    return paths


# --------------------------------------------------------------------------- checkpoint and engine

def resolve_checkpoint(spec: str) -> str:
    """A loadable model: a ``save_pretrained`` dir, ``<ckpt>/model/``, ``builtin:tiny``,
    ``gguf:NAME``, or a hub id.

    A checkpoint of ours (``<ckpt>/model/`` + ``<ckpt>/trainer_state.pt``) resolves to
    its ``model/``. ``builtin:tiny`` is built (once, cached) with the embedded tiny
    experiment's ``model.tiny`` settings, as ``dapo train`` would; ``gguf:NAME`` is the
    imported folder of a registered GGUF file.
    """
    from dapo_cli.models.loading import NAMED_MODEL_PREFIXES

    if spec.startswith(NAMED_MODEL_PREFIXES):
        from dapo_cli.config import load_config
        from dapo_cli.warmstart import ensure_model

        return str(ensure_model(spec, load_config(None).model.tiny))
    path = Path(spec).expanduser()
    if path.is_dir():
        for candidate in (path / "model", path):
            if (candidate / "config.json").is_file():
                return str(candidate.resolve())
        raise UserError(
            f"{path} holds no config.json: give a save_pretrained directory, a checkpoint dir containing "
            "model/, or builtin:tiny"
        )
    if path.exists():
        raise UserError(f"checkpoint {path} is a file; give a save_pretrained directory")
    from dapo_cli.models.loading import is_hub_id

    if is_hub_id(spec):
        return spec  # load_policy fetches it, or fails with a one-line error offline
    raise UserError(f"checkpoint not found: {spec} (give a save_pretrained directory or builtin:tiny)")


# --------------------------------------------------------------------------- the whole command


@dataclass(frozen=True)
class EvalOptions:
    """Everything ``dapo eval`` needs, defaults already resolved from ``EvalConfig``."""

    checkpoint: str
    dataset: str
    k: int
    pass_k: tuple[int, ...]
    temperature: float
    top_p: float
    max_tokens: int
    verifier: str
    engine: str
    batch_size: int
    seed: int
    output: Path | None = None
    limit: int | None = None
    tracking_backend: str = "mlflow"
    tracking_uri: str = ""
    experiment: str | None = None
    """None: the training run's experiment when the checkpoint records one (see :mod:`dapo_cli.eval.links`), else ``dapo``."""
    table_rows: int = EvalConfig.table_rows
    """Most samples in the MLflow generations table (0: none; see :mod:`dapo_cli.eval.table`)."""
    memory_limit_bytes: int | None = None
    """Most memory an evaluation may plan to hold (None: this machine's, see :func:`memory_limit`)."""
    tensor_parallel_size: int = 1
    """``--engine vllm``: GPUs the engine spans (vLLM's ``mp`` executor when more than one)."""


@dataclass
class EvalReport:
    """What :func:`run_eval` did: the result, its settings, where things went."""

    result: EvalResult
    settings: dict[str, Any]
    layout: str
    resumed_problems: int
    run_id: str
    outputs: dict[str, Path]
    speed: dict[str, float] = dataclasses.field(default_factory=dict)
    """What this invocation generated and how fast (keys :data:`~dapo_cli.eval.speed.SPEED_KEYS`)."""


def eval_settings(opts: EvalOptions, model: str, source: Path, num_problems: int) -> dict[str, Any]:
    """Everything that determines the samples; a resumed run must match them exactly.

    ``sequences_per_call`` is recorded only when it splits one problem's K samples
    (K > it), the only case where it changes the samples.
    """
    from dapo_cli.fileio import sha256_file

    chunked = opts.k > sequences_per_call(opts.k, opts.batch_size)
    return {
        "checkpoint": model,
        "dataset": opts.dataset,
        "dataset_sha256": sha256_file(source),
        "num_problems": num_problems,
        "avg_k": opts.k,
        "pass_k": list(opts.pass_k),
        "temperature": opts.temperature,
        "top_p": opts.top_p,
        "max_tokens": opts.max_tokens,
        "verifier": opts.verifier,
        "engine": opts.engine,
        "batch_size": opts.batch_size,
        "batch_problems": problems_per_call(opts.k, opts.batch_size),
        "seed": opts.seed,
        "limit": opts.limit,
        **({"sequences_per_call": sequences_per_call(opts.k, opts.batch_size)} if chunked else {}),
    }


def run_name(model: str, dataset: str, k: int, label: str = "") -> str:
    """``eval-<label, else the model dir or its checkpoint>-<dataset>-avg<K>`` (label: the training
    run and step, ``DAPO s0@60``, when the checkpoint names them)."""
    path = Path(model)
    label = label or (path.parent.name if path.name == "model" else path.name)
    return f"eval-{label}-{Path(dataset).stem}-avg{k}"


def run_eval(
    opts: EvalOptions,
    *,
    progress: ProgressSink | None = None,
    log: Callable[[str], None] = lambda _message: None,
    clock: Callable[[], float] = time.perf_counter,
) -> EvalReport:
    """Evaluate ``opts.checkpoint`` on ``opts.dataset`` (see the module docstring); ``clock`` times
    generation (a test injects a fake one)."""
    from dapo_cli.config.schema import TrackingConfig
    from dapo_cli.eval.links import (link_runs, read_source, recorded_elsewhere, resolve_tracking, source_label,
                                      source_tags)
    from dapo_cli.eval.problems import read_problems
    from dapo_cli.eval.table import log_generations_table
    from dapo_cli.rewards import VERIFIERS
    from dapo_cli.tracking import start_run

    sink = progress if progress is not None else NullProgress()
    check_k(opts.k, opts.pass_k)
    if opts.verifier not in VERIFIERS:
        raise unknown_name("verifier", opts.verifier, VERIFIERS, listed=LISTED_AS_NAMES)
    if opts.limit is not None and opts.limit < 1:
        raise UserError(f"--limit must be at least 1 (got {opts.limit})")
    if opts.table_rows < 0:
        raise UserError(f"--table-rows must be 0 or more (got {opts.table_rows})")
    if opts.tensor_parallel_size < 1 or (opts.tensor_parallel_size > 1 and opts.engine != "vllm"):
        raise UserError(f"--tensor-parallel-size {opts.tensor_parallel_size}: a whole number >= 1, above 1 only with --engine vllm")
    check_memory(opts, 1)  # before anything loads: even one problem may not fit
    from dapo_cli.components import build_eval_rollout
    from dapo_cli.config.schema import ROLLOUT_ENGINES

    if opts.engine not in ROLLOUT_ENGINES:
        raise unknown_name("engine", opts.engine, ROLLOUT_ENGINES, listed=LISTED_AS_NAMES)
    model = resolve_checkpoint(opts.checkpoint)
    found = read_problems(opts.dataset, opts.limit)  # every row read is checked; --limit reads only what it needs
    problems, layout = found.problems, found.layout
    prompt_bytes = max(sum(len(m["content"].encode("utf-8")) for m in p.messages) for p in problems)
    check_memory(opts, len(problems), prompt_bytes)
    settings = eval_settings(opts, model, found.source, len(problems))
    batches = problem_batches(len(problems), settings["batch_problems"])
    # a resumed --output DIR: its partial file checked against these batches and K before anything runs
    checkpoint = GenerationCheckpoint(opts.output, settings, batches=[[problems[i].problem_id for i in b] for b in batches], k=opts.k)
    previous = checkpoint.records()
    resumed = sum(len(batches[b]) for b in checkpoint.done)
    params = SamplingParams(temperature=opts.temperature, top_p=opts.top_p, max_tokens=opts.max_tokens, seed=opts.seed)
    source = read_source(model)  # the training run this checkpoint came from, if it records one
    uri, experiment = resolve_tracking(opts.tracking_uri, opts.experiment, source, opts.tracking_backend)
    elsewhere = recorded_elsewhere(uri, source) if opts.tracking_backend != "null" else None
    if elsewhere:
        log(elsewhere)
    tracking = TrackingConfig(backend=opts.tracking_backend, tracking_uri=uri, experiment=experiment)
    todo = len(checkpoint.done) < len(batches)
    # the model loads before the run opens: a checkpoint that fails to load leaves no MLflow run behind
    engine, format_prompt = build_eval_rollout(
        opts.engine, model, opts.batch_size, log, messages=[p.messages for p in problems], max_tokens=opts.max_tokens,
        max_sequences=sequences_per_call(opts.k, opts.batch_size), tensor_parallel_size=opts.tensor_parallel_size,
    ) if todo else (None, None)
    try:
        prompts = [format_prompt(p.messages) for p in problems] if todo else []
        if engine is not None:  # a prompt over the context fails here, with no run opened
            engine.check_prompts(prompts, opts.max_tokens)
        tags = {"dapo.command": "eval", "dapo.checkpoint": model, **source_tags(source)}
        name = run_name(model, opts.dataset, opts.k, source_label(source))
        with start_run(tracking, name, tags=tags) as tracker:
            tracker.log_params(settings)
            new: list[SampleRecord] = []
            stopwatch = Stopwatch(clock)
            counts = prefill_counts(engine)
            if todo:

                def on_batch(b: int, records: list[SampleRecord]) -> None:
                    checkpoint.append(b, records)
                    sink.advance(len(records))

                sink.start(len(problems) * opts.k, resumed * opts.k)
                new = generate_records(
                    engine, problems, prompts, k=opts.k, params=params,
                    verifier=opts.verifier, batch_problems=settings["batch_problems"],
                    skip_batches=frozenset(checkpoint.done), on_batch=on_batch,
                    max_sequences=sequences_per_call(opts.k, opts.batch_size), stopwatch=stopwatch,
                )
            result = summarize(problems, previous + new, k=opts.k, pass_k=opts.pass_k)
            after = prefill_counts(engine)
            speed = throughput(new, stopwatch.seconds, {k: after[k] - counts[k] for k in after} if counts and after else None)
            tracker.log_metrics({**M.tracking_metrics(result.metrics), **speed})  # NaN rates (nothing new) are skipped
            tracker.log_table(result.per_problem, "per_problem.json")
            log_generations_table(tracker, result.records, {p.problem_id: p.raw_problem for p in problems}, max_rows=opts.table_rows)
            link_runs(tracker, source, f"{Path(opts.dataset).name} avg@{opts.k} = {result.metrics[f'avg@{opts.k}']:.4f}", name)
            with tempfile.TemporaryDirectory(prefix="dapo-eval-") as tmp:
                outputs = write_outputs(opts.output if opts.output is not None else Path(tmp), result, settings)
                tracker.log_artifact(outputs["generations"], "eval")
                tracker.log_artifact(outputs["summary"], "eval")
    finally:
        if engine is not None:
            engine.close()  # vLLM: its engine core, before the process exits
    return EvalReport(
        result=result,
        settings=settings,
        layout=layout,
        resumed_problems=resumed,
        run_id=tracker.run_id,
        outputs=outputs if opts.output is not None else {},
        speed=speed,
    )
