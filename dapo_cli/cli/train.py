"""`dapo train`: the DAPO RL loop on a config, each technique switchable from the command line.

Results (run dir, checkpoint, MLflow run id, final metrics; with ``--json`` one JSON object) go
to stdout; progress and per-step lines to stderr (``--quiet``: none, ``--verbose``: every metric).
Ctrl-C exits 130 and prints the command that resumes the run.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from dapo_cli.cli.common import Panel, QuietOption, SetOption, VerboseOption, console, err_console, verbosity
from dapo_cli.cli.options import (
    CLI_ORDER,
    DRY_RUN_FLAGS,
    ClipHigherToggle,
    ConfigArg,
    DryRunOptions,
    DynamicSamplingToggle,
    OverlongFilteringToggle,
    OverlongShapingToggle,
    TokenLevelLossToggle,
    resolve,
)
from dapo_cli.config.schema import ALGO_DIRECT_ADVANTAGE, ALGOS
from dapo_cli.config.techniques import Techniques
from dapo_cli.tracking import PARENT_RUN_ENV

EXAMPLES = [
    ("dapo train", "Train the tiny policy with full DAPO on CPU (the embedded experiments/tiny.yaml)."),
    ("dapo train --no-dynamic-sampling --set trainer.total_steps=10 --json",
     "Ten steps without dynamic sampling; the run's results as one JSON object on stdout."),
    ("dapo train --resume", "Continue the last run (and its MLflow run) from its newest checkpoint."),
    ("dapo train experiments/dapo-qwen2.5-32b.yaml --dry-run",
     "The cluster plan of the paper's setup: batch arithmetic and per-GPU memory (no GPU needed)."),
]

EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), as shells report it."""


def _plan_option(flag: str, help_text: str, default: str) -> object:
    return typer.Option(flag, help=f"With --dry-run: {help_text}.", show_default=default, rich_help_panel=Panel.CLUSTER)


def train(
    config: ConfigArg = None,
    sets: SetOption = None,
    clip_higher: ClipHigherToggle = None,
    dynamic_sampling: DynamicSamplingToggle = None,
    token_level_loss: TokenLevelLossToggle = None,
    overlong_shaping: OverlongShapingToggle = None,
    overlong_filtering: OverlongFilteringToggle = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run (and its MLflow run) from its last checkpoint.", rich_help_panel=Panel.RUN)] = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as one JSON object on stdout (with --dry-run: the plan).", rich_help_panel=Panel.OUTPUT)] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the cluster plan: batch arithmetic, world-size checks, per-GPU memory per phase (loads no weights, needs no GPU).", rich_help_panel=Panel.CLUSTER)] = False,
    world_size: Annotated[int | None, _plan_option("--world-size", "ranks (GPUs) to plan for", "$WORLD_SIZE, else the config's cluster.world_size, else 1")] = None,
    gpus_per_node: Annotated[int | None, _plan_option("--gpus-per-node", "GPUs per node", "the config's cluster.gpus_per_node")] = None,
    gpu_memory_gib: Annotated[float | None, _plan_option("--gpu-memory-gib", "memory of one GPU in GiB", "the config's cluster.gpu_memory_gib")] = None,
    as_yaml: Annotated[bool, typer.Option("--yaml", help="With --dry-run: print the resolved config as YAML instead of the plan.", rich_help_panel=Panel.CLUSTER)] = False,
    algo: Annotated[str | None, typer.Option("--algo", help="dapo (decoupled clip, online) or direct-advantage (step-level critic, offline); overrides the config's algo.", show_default="as in the config: dapo", rich_help_panel=Panel.ALGO)] = None,
    iterations: Annotated[int | None, typer.Option("--iterations", help="direct-advantage: iterations (each trained actor is the next reference); sets direct_advantage.iterations.", show_default="as in the config", rich_help_panel=Panel.ALGO)] = None,
    from_phase: Annotated[str | None, typer.Option("--from-phase", help="direct-advantage: rerun the latest iteration from this phase (generate, mc_values, critic, advantages, actor, evaluate), reusing the stored earlier ones.", show_default="none: a new run", rich_help_panel=Panel.ALGO)] = None,
) -> None:
    """Train a policy with DAPO (or any subset of its techniques) and record the run in MLflow."""
    from dapo_cli.signals import record_stop_requests_early

    record_stop_requests_early()  # a scheduler's warning during start-up stops the run after its first step, with a checkpoint
    toggles = Techniques(clip_higher=clip_higher, dynamic_sampling=dynamic_sampling, token_level_loss=token_level_loss,
                         overlong_shaping=overlong_shaping, overlong_filtering=overlong_filtering)
    if algo is not None or iterations is not None:
        sets = algo_overrides(sets, algo, iterations, toggles)
    cfg = resolve(config, sets, toggles)
    dry = DryRunOptions(world_size=world_size, gpus_per_node=gpus_per_node, gpu_memory_gib=gpu_memory_gib,
                        as_json=as_json, as_yaml=as_yaml)
    if cfg.algo == ALGO_DIRECT_ADVANTAGE or from_phase is not None:
        if quiet or verbose:
            from dapo_cli.errors import UserError

            raise UserError("--quiet/--verbose apply to algo dapo; algo direct-advantage prints its phases as they run")

        train_direct_advantage(cfg, config=config, sets=sets, resume=resume, from_phase=from_phase, dry_run=dry_run, dry=dry)
        return
    if dry_run:
        if dry.as_yaml:
            from dapo_cli.config import dump_yaml

            typer.echo(dump_yaml(cfg), nl=False)
            return
        from dapo_cli.errors import UserError
        from dapo_cli.plan import make_plan
        from dapo_cli.plan.render import render, to_json

        plan = make_plan(
            cfg, world_size=dry.world_size, config_name=config or "experiments/tiny.yaml (embedded)",
            gpu_memory_gib=dry.gpu_memory_gib, gpus_per_node=dry.gpus_per_node,
        )
        if dry.as_json:
            typer.echo(to_json(plan))
        else:
            render(plan)
        failed = [c.message for c in plan.checks if c.hard and not c.ok]
        if failed:
            raise UserError(f"the settings cannot run at world size {plan.world_size}: {failed[0]}")
        return
    used = [DRY_RUN_FLAGS[name] for name in dry.given() if name != "as_json"]  # --json also formats the results
    if used:
        from dapo_cli.errors import UserError

        raise UserError(f"{', '.join(used)} only {'works' if len(used) == 1 else 'work'} with --dry-run (add --dry-run, or drop "
                        f"{'it' if len(used) == 1 else 'them'})")
    level = verbosity(quiet, verbose)
    # `dapo ablate` children started as processes (--launcher print/slurm, ablate.nproc > 1) get
    # DAPO_PARENT_RUN_ID, so the child's MLflow run nests under the ablation's parent run, and
    # DAPO_EXTRA_TAGS (a JSON object: its ablate.* tags).
    from dapo_cli.tracking.tags import extra_tags_from_env

    from dapo_cli.cli.preflight import check_train, removing_new_dirs
    from dapo_cli.tracking.credentials import move_credentials

    # a password in the URI would be recorded in config.yaml, summary.json, dapo_run.json and the run's params
    cfg.tracking.tracking_uri = move_credentials(cfg.tracking.tracking_uri, "tracking.tracking_uri")
    check_train(cfg, resume=resume)  # before a run dir is claimed or an MLflow run opened
    from dapo_cli.train import run_train  # the loop's imports take seconds: after the checks, which fail fast

    parent = os.environ.get(PARENT_RUN_ENV) or None
    try:
        with removing_new_dirs(Path(cfg.trainer.output_dir) / cfg.tracking.experiment):
            summary = run_train(
                cfg,
                resume=resume,
                command=command_line("train", config, sets, toggles, resume=resume),
                parent_run_id=parent,
                extra_tags=extra_tags_from_env(),
                quiet=level < 0,
                verbose=level > 0,
            )
    except KeyboardInterrupt as exc:
        from dapo_cli.errors import PREEMPTED
        from dapo_cli.train import TrainingPreempted

        report_interrupt(exc, command_line("train", config, sets, toggles, resume=True),
                         command_line("train", config, sets, toggles))
        raise typer.Exit(code=PREEMPTED if isinstance(exc, TrainingPreempted) else EXIT_INTERRUPTED) from None
    print_results(summary, as_json=as_json)
    if summary.get("stopped"):  # the collapse guard: the run is recorded, but it did not train to the end
        from dapo_cli.errors import COLLAPSED, RunStopped

        raise RunStopped(summary["stopped"], COLLAPSED)


def report_interrupt(exc: KeyboardInterrupt, resume_command: str, fresh_command: str) -> None:
    """What Ctrl-C left, on stderr: the command that resumes the run, or that no checkpoint exists yet."""
    from dapo_cli.train import TrainingInterrupted, TrainingPreempted

    def say(text: str) -> None:
        err_console.print(text, highlight=False, markup=False, soft_wrap=True)

    if not isinstance(exc, TrainingInterrupted):  # before the run started: nothing was claimed or recorded
        say(f"interrupted before training started; run it again with: {fresh_command}")
    elif isinstance(exc, TrainingPreempted):
        say(f"stopped by {exc.signal_name} (a scheduler's warning: time limit or preemption) after step {exc.step}; "
            f"the MLflow run is marked KILLED; {exc.checkpoint.name if exc.checkpoint else 'no checkpoint'} is kept in {exc.run_dir}")
        say(f"resume with: {resume_command}")
    elif exc.checkpoint is not None:
        say(f"interrupted in step {exc.step}; the MLflow run is marked KILLED; {exc.checkpoint.name} is kept in {exc.run_dir}")
        say(f"resume with: {resume_command}")
    else:
        say(f"interrupted in step {exc.step}, before the first checkpoint (trainer.save_freq); the MLflow run is marked "
            f"KILLED; nothing to resume: start again with: {fresh_command}")


def results(summary: dict[str, Any]) -> dict[str, Any]:
    """The run's results as plain JSON values (a non-finite metric becomes null)."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    return clean(dict(summary))


def print_results(summary: dict[str, Any], *, as_json: bool) -> None:
    """stdout: the run dir, checkpoint, MLflow run and final metrics; or one JSON object (``--json``)."""
    data = results(summary)
    if as_json:
        typer.echo(json.dumps(data, sort_keys=True))
        return
    lines = []
    base, final = data.get("base_val"), data.get("final_val")
    if base is not None and final is not None:
        lines.append(f"held-out accuracy: {base:.3f} (base) → {final:.3f} (final), {final - base:+.3f}")
    if data.get("run_dir"):
        lines.append(f"run dir:    {data['run_dir']}")
    if data.get("checkpoint"):
        lines.append(f"checkpoint: {data['checkpoint']}")
    if data.get("mlflow_run_id"):
        from dapo_cli.tracking.mlflow import ui_lines

        lines.extend(ui_lines(data.get("tracking_uri") or "", data["mlflow_run_id"]))
    last = data.get("last_step_metrics") or {}
    if last:
        from dapo_cli.progress import SUMMARY_KEYS

        shown = [f"{label} {value:.4g}" for key, label, _ in SUMMARY_KEYS if isinstance(value := last.get(key), (int, float))]
        lines.append("last step:  " + "  ".join(shown))
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def command_line(
    name: str, config: str | None, sets: list[str] | None, toggles: Techniques, *, resume: bool = False,
    from_phase: str | None = None,
) -> str:
    """The command as parsed (recorded as the run's ``dapo.command`` tag), quoted for a shell."""
    words = ["dapo", name, *([config] if config else [])]
    for item in sets or ():
        words += ["--set", item]
    words += toggles.flags(CLI_ORDER)
    if resume:
        words.append("--resume")
    if from_phase:
        words += ["--from-phase", from_phase]
    return shlex.join(words)


# ---------------------------------------------------------------- --algo direct-advantage


def algo_overrides(sets: list[str] | None, algo: str | None, iterations: int | None, toggles: Techniques) -> list[str]:
    """``--algo`` and ``--iterations`` as ``--set`` overrides (applied after the YAML, validated with it)."""
    from dapo_cli.errors import UserError

    if algo is not None and algo not in ALGOS:
        raise UserError(f"--algo {algo}: unknown algorithm; valid: {', '.join(ALGOS)}")
    used = toggles.flags(CLI_ORDER)
    if algo == ALGO_DIRECT_ADVANTAGE and used:
        raise UserError(f"{', '.join(used)}: DAPO technique toggles do not apply to --algo direct-advantage; drop them")
    out = list(sets or [])
    if algo is not None:
        out.append(f"algo={algo}")
    if iterations is not None:
        if iterations < 1:
            raise UserError(f"--iterations {iterations} must be >= 1")
        out.append(f"direct_advantage.iterations={iterations}")
    return out


def train_direct_advantage(
    cfg: Any, *, config: str | None, sets: list[str] | None, resume: bool, from_phase: str | None, dry_run: bool,
    dry: DryRunOptions,
) -> None:
    """``dapo train`` of ``algo: direct-advantage``: its options checked, then the dry-run plan or the run."""
    from dapo_cli.errors import UserError

    if cfg.algo != ALGO_DIRECT_ADVANTAGE:
        raise UserError("--from-phase only works with algo: direct-advantage (DAPO runs resume from checkpoints with --resume)")
    cluster = [DRY_RUN_FLAGS[name] for name in dry.given() if name in ("world_size", "gpus_per_node", "gpu_memory_gib")]
    if cluster:
        raise UserError(f"{', '.join(cluster)}: the cluster plan is DAPO's; --algo direct-advantage --dry-run prints generation counts")
    if dry_run:
        if dry.as_yaml:
            from dapo_cli.config import dump_yaml

            typer.echo(dump_yaml(cfg), nl=False)
            return
        from dapo_cli.direct_advantage.workload import estimate_workload, render_workload

        render_workload(estimate_workload(cfg, config_name=config or "experiments/tiny.yaml (embedded)"), as_json=dry.as_json)
        return
    used = [DRY_RUN_FLAGS[name] for name in dry.given() if name in ("as_json", "as_yaml")]
    if used:
        raise UserError(f"{', '.join(used)} only work with --dry-run (add --dry-run, or drop them)")
    if resume and from_phase is not None:
        raise UserError("--resume and --from-phase: give one (--from-phase already continues the run)")
    from dapo_cli.tracking.tags import extra_tags_from_env
    from dapo_cli.cli.preflight import check_engines
    from dapo_cli.direct_advantage.launch import run_direct_advantage
    from dapo_cli.tracking.credentials import move_credentials

    cfg.tracking.tracking_uri = move_credentials(cfg.tracking.tracking_uri, "tracking.tracking_uri")
    check_engines(cfg)  # before a run dir is claimed or an MLflow run opened
    run_direct_advantage(
        cfg, resume=resume, from_phase=from_phase, command=command_line("train", config, sets, Techniques(), resume=resume, from_phase=from_phase),
        parent_run_id=os.environ.get(PARENT_RUN_ENV) or None, extra_tags=extra_tags_from_env(),
    )
