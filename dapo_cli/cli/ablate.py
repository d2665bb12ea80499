"""`dapo ablate`: the DAPO ladder or a technique grid as MLflow parent/child runs, resumable, reported.

The work happens in :mod:`dapo_cli.ablate`; this module parses, prints the plan and the table.
Without CONFIG it runs the embedded ``experiments/tiny-ladder.yaml`` (built for ablations).
"""

from __future__ import annotations

import difflib
import os
import shlex
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from dapo_cli.cli.common import Panel, SetOption, console, err_console
from dapo_cli.config.techniques import TECHNIQUES
from dapo_cli.errors import UserError

EXAMPLES = [
    ("dapo ablate --ladder", "The paper's ladder (naive GRPO → DAPO) on the embedded experiments/tiny-ladder.yaml; resumable."),
    ("dapo ablate --ladder --dry-run", "The plan and a time estimate (one timed step in a temporary folder); records and builds nothing."),
    ("dapo ablate --grid dynamic_sampling --axis rollout.max_staleness=0,1 --seeds 2 --set trainer.total_steps=20",
     "Dynamic sampling on/off × synchronous/asynchronous rollouts: 4 variants, two seeds each, 20 steps per child; "
     "the report pairs the two staleness values at each technique state."),
    ("dapo ablate experiments/tiny.yaml --ladder --launcher print",
     "One dapo train command per child (for a scheduler), nested under one MLflow parent run."),
]

if TYPE_CHECKING:
    from dapo_cli.ablate.variants import AblationPlan


def looks_like_techniques(text: str) -> bool:
    """True when ``text`` is a comma-separated list of technique names (the ``--grid a,b`` argument)."""
    names = [n.strip().replace("-", "_") for n in text.split(",")]
    return bool(names) and all(n in TECHNIQUES for n in names)


def meant_as_techniques(text: str) -> bool:
    """True when ``text`` (not an existing file) reads as a technique list rather than a config path:
    it has a comma, or it is one bare word (no path separator, no ``.yaml``/``.yml``) that names or
    nearly names a technique. Such a word with unknown names is a technique error, not "config not found"."""
    if looks_like_techniques(text) or "," in text:
        return True
    word = text.strip().replace("-", "_")
    if "/" in word or "\\" in word or word.lower().endswith((".yaml", ".yml", ".json")):
        return False
    return bool(difflib.get_close_matches(word, TECHNIQUES, n=1, cutoff=0.6))


class Launcher(str, Enum):
    local = "local"
    print = "print"
    slurm = "slurm"


def split_arguments(args: list[str], grid: bool) -> tuple[str | None, str | None]:
    """``[CONFIG] [TECHNIQUES]`` in any order → (config path, technique list); TECHNIQUES only with --grid.

    A word that names an existing file is the config; a comma-separated list of technique
    names is the grid's subset (``--grid clip_higher,dynamic_sampling``).
    """
    from dapo_cli.ablate.variants import parse_techniques

    config: str | None = None
    techniques: str | None = None
    for word in args:
        if not Path(word).exists() and meant_as_techniques(word):
            parse_techniques(word)  # unknown names: "unknown technique 'foo'; valid: ..."
            if not grid:
                raise UserError(f"'{word}' lists techniques; that subset is for --grid (the ladder always adds all five)")
            if techniques is not None:
                raise UserError(f"two technique lists ('{techniques}', '{word}'); give one comma-separated list")
            techniques = word
        elif config is None:
            config = word
        else:
            raise UserError(f"unexpected argument '{word}'; usage: dapo ablate [CONFIG] (--ladder | --grid [TECHNIQUES])")
    return config, techniques


def ablate(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[CONFIG] [TECHNIQUES]",
            help="Experiment YAML (default: the embedded experiments/tiny-ladder.yaml, not the single-run tiny.yaml); "
            "after --grid, the techniques to vary (comma-separated, default all five).",
            show_default=False,
        ),
    ] = None,
    ladder: Annotated[bool, typer.Option("--ladder", help="The paper's cumulative ladder (naive GRPO → DAPO), 6 variants.", rich_help_panel=Panel.TECHNIQUES)] = False,
    grid: Annotated[bool, typer.Option("--grid", help="The full factorial of the technique toggles (all five: 32 variants).", rich_help_panel=Panel.TECHNIQUES)] = False,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only this variant (repeatable).", show_default="every variant", rich_help_panel=Panel.TECHNIQUES)] = None,
    skip: Annotated[list[str] | None, typer.Option("--skip", help="Leave out this variant (repeatable).", show_default="none", rich_help_panel=Panel.TECHNIQUES)] = None,
    axis: Annotated[
        list[str] | None,
        typer.Option(
            "--axis", metavar="KEY=V1,V2",
            help="A config setting as one more dimension: every variant once per value, named like "
            "dapo@max_staleness=1, e.g. --axis rollout.max_staleness=0,1 (repeatable: the product). "
            "Not a technique's own keys (--grid varies those) nor trainer.seed (--seeds).",
            show_default="none", rich_help_panel=Panel.TECHNIQUES,
        ),
    ] = None,
    seeds: Annotated[str | None, typer.Option(
        "--seeds", help="Seeds per variant: trainer.seed + 0..N-1; auto: in waves until every comparison is decided "
        "(--max-seeds, --equivalence; docs/ablation-statistics.md).", show_default="ablate.seeds of the config",
        rich_help_panel=Panel.RUN)] = None,
    max_seeds: Annotated[int, typer.Option("--max-seeds", help="With --seeds auto: the most seeds a variant gets.", rich_help_panel=Panel.RUN)] = 6,
    equivalence: Annotated[float, typer.Option("--equivalence", help="With --seeds auto: a Δ inside ± this many points is 'equivalent'.", rich_help_panel=Panel.RUN)] = 3.0,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            help="Local launcher: train up to N children at the same time, each as its own dapo train process "
            "(output in <ablation>/logs/<child>.log); 1: one after another in this process.",
            show_default="ablate.jobs of the config", rich_help_panel=Panel.RUN,
        ),
    ] = None,
    sets: SetOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and a time estimate, train nothing.", rich_help_panel=Panel.RUN)] = False,
    calibrate: Annotated[
        bool, typer.Option("--calibrate/--no-calibrate", help="With --dry-run: time one RL step to estimate the total (skipped when the policy is not in the cache: a dry run builds nothing).", rich_help_panel=Panel.RUN)
    ] = True,
    launcher: Annotated[
        Launcher | None,
        typer.Option(
            help="local: train here, one child after another (torchrun processes when ablate.nproc > 1; "
            "--jobs N: up to N at once); "
            "print: emit one dapo train (or torchrun) command per child; slurm: submit one job per child "
            "through submitit (ablate.slurm.*), wait, then report.",
            show_default="ablate.launcher of the config", rich_help_panel=Panel.RUN,
        ),
    ] = None,
    detach: Annotated[bool, typer.Option(
        "--detach", help="Slurm launcher: submit the jobs and return (they outlive this command); the same command with "
        "--status, or run again, re-attaches and writes the report when all are done.", rich_help_panel=Panel.RUN)] = False,
    status: Annotated[bool, typer.Option(
        "--status", help="Where every child is (MLflow, and Slurm for the slurm launcher's jobs); starts nothing. "
        "Once every child has finished, writes the report as a rerun would.", rich_help_panel=Panel.RUN)] = False,
    html: Annotated[bool, typer.Option("--html", help="Also write report.html.", rich_help_panel=Panel.OUTPUT)] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No per-step lines from the children (the overall progress stays).", rich_help_panel=Panel.OUTPUT)] = False,
) -> None:
    """Run the DAPO ablation ladder or a technique grid as MLflow parent/child runs, then report."""
    from dapo_cli.ablate.axes import parse_axes
    from dapo_cli.ablate.variants import make_ablation, parse_techniques
    from dapo_cli.cli.options import resolve

    if ladder == grid:
        raise UserError("give exactly one of --ladder (the paper's progression) or --grid (a factorial of the toggles)")
    words = list(args or [])
    config, techniques = split_arguments(words, grid)
    if config is None:  # the ablation experiment, not the single-run default; children get its path
        from dapo_cli.config.load import EMBEDDED_LADDER, embedded_experiment_path

        config = str(embedded_experiment_path(EMBEDDED_LADDER))
    auto = seeds == "auto"
    if auto and (max_seeds < 2 or not equivalence >= 0):
        raise UserError(f"--seeds auto needs --max-seeds >= 2 and --equivalence >= 0, got {max_seeds} and {equivalence}")
    if seeds is not None and not auto and not (seeds.isdigit() and len(seeds) <= 18 and int(seeds) >= 1):
        shown = seeds if len(seeds) <= 20 else f"{seeds[:20]}… ({len(seeds):,} characters)"
        raise UserError(f"--seeds must be a positive number or auto, got '{shown}'")
    cfg = resolve(config, [*(sets or []), f"ablate.jobs={jobs}"] if jobs is not None else sets)  # validated: jobs >= 1
    plan = make_ablation(
        cfg,
        mode="ladder" if ladder else "grid",
        techniques=parse_techniques(techniques),
        only=only or [],
        skip=skip or [],
        seeds=max_seeds if auto else cfg.ablate.seeds if seeds is None else int(seeds),
        axes=parse_axes(axis or [], cfg, sets or []),
    )
    command = command_line(words, ladder=ladder, only=only, skip=skip, seeds=seeds, sets=sets, jobs=jobs, axes=axis)
    if auto:
        command += shlex.join(["", "--max-seeds", str(max_seeds), "--equivalence", f"{equivalence:g}"])
    if dry_run:
        print_plan(plan)
        print_estimate(plan, calibrate)
        if auto:
            from dapo_cli.ablate.sequential import comparison_pairs, plan_text, wave_sizes

            names = [v.name for v in plan.variants]
            console.print(Text(plan_text(names, comparison_pairs(names, ladder), wave_sizes(min(3, max_seeds), max_seeds),
                                         equivalence)))
        return
    chosen = launcher.value if launcher is not None else cfg.ablate.launcher
    if detach and (chosen != "slurm" or status):
        raise UserError("--detach is for --launcher slurm (the jobs outlive the command), without --status")
    if auto and chosen != "local":
        raise UserError(f"--seeds auto decides each wave from the last one's results: it needs --launcher local, not {chosen}")
    from dapo_cli.cli.preflight import check_train
    from dapo_cli.tracking.credentials import move_credentials

    # the children inherit the credentials through the environment; the plan and every record hold the bare URI
    cfg.tracking.tracking_uri = move_credentials(cfg.tracking.tracking_uri, "tracking.tracking_uri")
    if chosen == "local":
        check_train(cfg)  # the children train here: output dir, dtype, model, data and store first
    elif cfg.tracking.backend != "null":
        from dapo_cli.cli.common import check_tracking_uri

        check_tracking_uri(cfg.tracking.tracking_uri, create=True, what="tracking.tracking_uri", experiment=cfg.tracking.experiment)
    if status and not show_status(plan, chosen):
        return
    if chosen == "print":
        from dapo_cli.ablate.runner import print_launch
        from dapo_cli.tracking.tags import PARENT_RUN_ENV

        outcome = print_launch(plan, command=command, config_path=config, sets=sets or [])
        for line in outcome.commands:
            typer.echo(line)
        err_console.print(
            f"parent run {outcome.parent_run_id} ({outcome.name}); each command nests under it through ${PARENT_RUN_ENV}. "
            f"When they finish: dapo report {outcome.parent_run_id}",
            highlight=False,
            markup=False,
        )
        from dapo_cli.tracking.credentials import PASSWORD_VAR, USERNAME_VAR

        if os.environ.get(USERNAME_VAR) or os.environ.get(PASSWORD_VAR):  # set by us from the URI, or by the user
            err_console.print(f"the commands hold no tracking credentials: export ${USERNAME_VAR} and ${PASSWORD_VAR} "
                              "where they run", highlight=False, markup=False)
        return
    from dapo_cli.ablate.runner import run_ablation, slurm_launch
    from dapo_cli.cli.report import print_report

    if chosen == "slurm":  # refuse before printing anything
        from dapo_cli.ablate.slurm import check_resources, require_submitit

        require_submitit()
        check_resources(cfg.ablate)
    print_plan(plan)

    def log(message: str) -> None:
        err_console.print(message, highlight=False, markup=False)

    try:
        if chosen == "slurm":
            outcome = slurm_launch(plan, command=command, config_path=config, sets=sets or [], html=html, log=log,
                                   detach=detach)
        elif auto:
            outcome = run_auto(plan, ladder, max_seeds, equivalence, command=command, config_path=config, sets=sets or [],
                               quiet=quiet, html=html, log=log)
        else:
            outcome = run_ablation(plan, command=command, config_path=config, sets=sets or [], quiet=quiet, html=html, log=log)
    except KeyboardInterrupt:  # the parent (and a training child) ended KILLED; finished children are kept
        from dapo_cli.cli.train import EXIT_INTERRUPTED

        log(f"interrupted; the same command resumes the ablation (finished children are skipped): {command}")
        raise typer.Exit(code=EXIT_INTERRUPTED) from None
    if detach:
        console.print(f"MLflow parent run: {outcome.parent_run_id}; where the jobs are: {command} --launcher slurm --status",
                      highlight=False, markup=False)
        return
    if outcome.report is not None:
        print_report(outcome.report)
    for name, path in outcome.files.items():
        console.print(f"{name}: {path}", highlight=False, markup=False)
    console.print(f"MLflow parent run: {outcome.parent_run_id}", highlight=False, markup=False)


def show_status(plan: AblationPlan, launcher: str) -> bool:
    """``--status``: one line per child, read only; True when every child has finished (the caller then writes the
    report as a rerun does), False when some are still to come."""
    from dapo_cli.ablate.runner import ablation_status, continued

    plan = continued(plan)
    if launcher == "slurm":
        from dapo_cli.ablate.slurm import job_state_reader

        job_state = job_state_reader(plan)
    else:
        def job_state(_child: object) -> None:
            return None
    lines, done = ablation_status(plan, job_state)
    for line in lines:
        console.print(line, highlight=False, markup=False)
    total = len(plan.children)
    console.print(f"{done}/{total} children finished" + ("; writing the report" if done == total else
                  "; the report is written once all have (the same command again, with or without --status)"),
                  highlight=False, markup=False)
    return done == total


def run_auto(plan, ladder: bool, max_seeds: int, equivalence: float, **run_kwargs):
    """``--seeds auto`` with the local launcher: one ``run_ablation`` per wave (finished children reused, so the
    same command resumes), the variants of the open comparisons only; the waves printed at the end. The parent
    records the rule's setup (``ablate.sequential``), from which every report replays the waves."""
    import dataclasses

    from dapo_cli.ablate.runner import run_ablation
    from dapo_cli.ablate.sequential import Setup, comparison_pairs, run_waves, seed_diffs, wave_sizes, waves_text

    names = [v.name for v in plan.variants]
    looks = wave_sizes(min(3, max_seeds), max_seeds)
    setup = Setup(tuple(plan.seeds), tuple(looks), equivalence, ladder)
    last = {}

    def train_wave(n: int, wanted: list[str], before: int) -> None:
        wave = dataclasses.replace(plan, seeds=plan.seeds[:n], wave=frozenset(wanted), wave_from=before, sequential=setup)
        last["outcome"], last["seeds"] = run_ablation(wave, **run_kwargs), plan.seeds[:n]

    def diffs_of(variant: str, vs: str) -> list[float]:
        report = last["outcome"].report
        avg = {(c.variant, c.seed): 100 * c.avg for c in (report.children if report else [])}
        return seed_diffs(avg, last["seeds"], variant, vs)

    waves = run_waves(names, comparison_pairs(names, ladder), looks, equivalence, train_wave, diffs_of)
    console.print(Text(waves_text(waves, fixed_children=len(names) * max_seeds, equivalence=equivalence)))
    return last["outcome"]


def command_line(
    words: list[str], *, ladder: bool, only: list[str] | None, skip: list[str] | None, seeds: int | None, sets: list[str] | None,
    jobs: int | None = None, axes: list[str] | None = None,
) -> str:
    """The command as parsed (the parent's ``dapo.command`` tag)."""
    out = ["dapo", "ablate", *words, "--ladder" if ladder else "--grid"]
    for flag, values in (("--axis", axes), ("--only", only), ("--skip", skip), ("--set", sets)):
        for v in values or ():
            out += [flag, v]
    for flag, value in (("--seeds", seeds), ("--jobs", jobs)):
        if value is not None:
            out += [flag, str(value)]
    return shlex.join(out)


SHORT = {"overlong_filtering": "OF", "clip_higher": "CH", "overlong_shaping": "SOP", "token_level_loss": "TLL",
         "dynamic_sampling": "DS"}
"""Column heads of the plan table (the legend is printed under it)."""


def print_plan(plan: AblationPlan) -> None:
    """Variants (with their technique state and the paper's row), seeds, run dirs and the ablation id."""
    from dapo_cli.config import TECHNIQUES

    table = Table(title=Text(f"{plan.name}: {plan.mode}, {len(plan.variants)} variants × {len(plan.seeds)} seeds"))
    table.add_column("rung", justify="right")
    for t in TECHNIQUES:
        table.add_column(SHORT[t], justify="center")
    for axis in plan.axes:
        table.add_column(axis.short, justify="center")
    table.add_column("paper row (AIME24 avg@32)")
    table.add_column("variant", overflow="fold")
    for i, v in enumerate(plan.variants):
        state = dict(v.state)
        paper = f"{v.label} ({v.paper:.0f})" if v.paper is not None else "—"
        settings = [Text(value) for _, value in v.axes]
        table.add_row(str(i), *("✓" if state[t] else "·" for t in TECHNIQUES), *settings, paper, Text(v.name))
    console.print(table)
    console.print(
        "  ".join([*(f"{SHORT[t]} = {t}" for t in TECHNIQUES), *(f"{a.short} = {a.key}" for a in plan.axes)]) + "\n"
        f"seeds {', '.join(map(str, plan.seeds))}; {plan.base.trainer.total_steps} steps per child; "
        f"run dirs {plan.base.trainer.output_dir}/{plan.base.tracking.experiment}/{plan.name}/<variant>-s<seed>; "
        f"ablation id {plan.ablation_id}",
        highlight=False,
        markup=False,
    )


def print_estimate(plan: AblationPlan, calibrate: bool) -> None:
    """The number of children, what a real run would build first, and, unless --no-calibrate, a wall-time
    estimate from one timed step. Builds nothing: without a ready policy there is no step to time."""
    from dapo_cli.ablate.estimate import calibrate as run_calibration
    from dapo_cli.ablate.estimate import policy_to_build

    n = len(plan.children)
    build = policy_to_build(plan.base)
    if build is not None:
        console.print(f"would build: {build}", highlight=False, markup=False)
    if not calibrate:
        console.print(f"{n} child runs; time estimate skipped (--no-calibrate)", highlight=False, markup=False)
        return
    if build is not None:
        console.print(
            f"{n} child runs; time estimate skipped: it times one step of the policy, which a dry run does not build "
            "(build it first, or see the wall time in the config's header)",
            highlight=False,
            markup=False,
        )
        return
    est = run_calibration(plan)
    console.print(
        f"{n} child runs; one step of {est.variant} took {est.step_s:.1f} s (incl. model load and a checkpoint) → "
        f"≈ {est.total_s / 60:.1f} min for {n} × {est.steps} steps"
        + (f", {est.jobs} children at a time" if est.jobs > 1 else "")
        + ", plus validations and extra dynamic-sampling rounds",
        highlight=False,
        markup=False,
    )
