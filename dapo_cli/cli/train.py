"""`dapo train`: the DAPO RL loop on a config, each technique switchable from the command line."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated

import typer

from dapo_cli.cli.common import SetOption
from dapo_cli.cli.options import ConfigArg, resolve
from dapo_cli.tracking import PARENT_RUN_ENV


def _toggle(name: str, what: str) -> object:
    return typer.Option(f"--{name}/--no-{name}", help=f"{what} (default: as in the config).", show_default=False)


def train(
    config: ConfigArg = None,
    sets: SetOption = None,
    clip_higher: Annotated[bool | None, _toggle("clip-higher", "Decoupled clip: epsilon_high 0.28 vs = epsilon_low")] = None,
    dynamic_sampling: Annotated[bool | None, _toggle("dynamic-sampling", "Keep only groups with mixed accuracy, resample to fill")] = None,
    token_level_loss: Annotated[bool | None, _toggle("token-level-loss", "token-mean vs seq-mean-token-mean aggregation")] = None,
    overlong_shaping: Annotated[bool | None, _toggle("overlong-shaping", "Soft overlong punishment (Eq. 13)")] = None,
    overlong_filtering: Annotated[bool | None, _toggle("overlong-filtering", "Drop truncated responses from the loss")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run (and its MLflow run) from its last checkpoint.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the cluster plan: batch arithmetic, world-size checks, per-GPU memory per phase (loads no weights, needs no GPU).")] = False,
    world_size: Annotated[int | None, typer.Option("--world-size", help="With --dry-run: ranks (GPUs) to plan for (default: $WORLD_SIZE, else 1).", show_default=False)] = None,
    gpus_per_node: Annotated[int | None, typer.Option("--gpus-per-node", help="With --dry-run: GPUs per node (default 8).", show_default=False)] = None,
    gpu_memory_gib: Annotated[float | None, typer.Option("--gpu-memory-gib", help="With --dry-run: memory of one GPU in GiB (default 80).", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="With --dry-run: print the plan as JSON.")] = False,
    as_yaml: Annotated[bool, typer.Option("--yaml", help="With --dry-run: print the resolved config as YAML instead of the plan.")] = False,
    algo: Annotated[str | None, typer.Option("--algo", help="dapo (decoupled clip, online; the default) or direct-advantage (step-level critic, offline); overrides the config's algo.", show_default=False)] = None,
    iterations: Annotated[int | None, typer.Option("--iterations", help="direct-advantage: iterations (each trained actor is the next reference); sets direct_advantage.iterations.", show_default=False)] = None,
    from_phase: Annotated[str | None, typer.Option("--from-phase", help="direct-advantage: rerun the latest iteration from this phase (generate, mc_values, critic, advantages, actor, evaluate), reusing the stored earlier ones.", show_default=False)] = None,
) -> None:
    """Train a policy with DAPO (or any subset of its techniques) and record the run in MLflow."""
    toggles = {"clip-higher": clip_higher, "dynamic-sampling": dynamic_sampling, "token-level-loss": token_level_loss,
               "overlong-shaping": overlong_shaping, "overlong-filtering": overlong_filtering}
    if algo is not None or iterations is not None:
        from dapo_cli.direct_advantage.command import algo_overrides

        sets = algo_overrides(sets, algo, iterations, toggles)
    cfg = resolve(
        config,
        sets,
        clip_higher=clip_higher,
        dynamic_sampling=dynamic_sampling,
        token_level_loss=token_level_loss,
        overlong_shaping=overlong_shaping,
        overlong_filtering=overlong_filtering,
    )
    plan_options = {"--world-size": world_size, "--gpus-per-node": gpus_per_node, "--gpu-memory-gib": gpu_memory_gib,
                    "--json": as_json or None, "--yaml": as_yaml or None}
    if cfg.algo == "direct-advantage" or from_phase is not None:
        from dapo_cli.direct_advantage.command import train_direct_advantage

        train_direct_advantage(cfg, config=config, sets=sets, resume=resume, from_phase=from_phase, dry_run=dry_run,
                               plan_options=plan_options)
        return
    if dry_run:
        if as_yaml:
            from dapo_cli.config import dump_yaml

            typer.echo(dump_yaml(cfg), nl=False)
            return
        from dapo_cli.errors import UserError
        from dapo_cli.plan import DEFAULT_GPU_GIB, DEFAULT_GPUS_PER_NODE, make_plan
        from dapo_cli.plan.render import render, to_json

        plan = make_plan(
            cfg, world_size=world_size, config_name=config or "experiments/tiny.yaml (embedded)",
            gpu_memory_gib=DEFAULT_GPU_GIB if gpu_memory_gib is None else gpu_memory_gib,
            gpus_per_node=DEFAULT_GPUS_PER_NODE if gpus_per_node is None else gpus_per_node,
        )
        if as_json:
            typer.echo(to_json(plan))
        else:
            render(plan)
        failed = [c.message for c in plan.checks if c.hard and not c.ok]
        if failed:
            raise UserError(f"the settings cannot run at world size {plan.world_size}: {failed[0]}")
        return
    used = [name for name, value in plan_options.items() if value is not None]
    if used:
        from dapo_cli.errors import UserError

        raise UserError(f"{', '.join(used)} only work with --dry-run (add --dry-run, or drop them)")
    from dapo_cli.train import run_train

    toggles = {
        "clip-higher": clip_higher,
        "dynamic-sampling": dynamic_sampling,
        "token-level-loss": token_level_loss,
        "overlong-shaping": overlong_shaping,
        "overlong-filtering": overlong_filtering,
    }
    # `dapo ablate` children started as processes (--launcher print/slurm, ablate.nproc > 1) get
    # DAPO_PARENT_RUN_ID, so the child's MLflow run nests under the ablation's parent run, and
    # DAPO_EXTRA_TAGS (a JSON object: its ablate.* tags).
    from dapo_cli.ablate.runner import extra_tags_from_env

    from dapo_cli.cli.preflight import check_train, removing_new_dirs

    check_train(cfg, resume=resume)  # before a run dir is claimed or an MLflow run opened
    parent = os.environ.get(PARENT_RUN_ENV) or None
    with removing_new_dirs(Path(cfg.trainer.output_dir) / cfg.tracking.experiment):
        summary = run_train(
            cfg,
            resume=resume,
            command=command_line("train", config, sets, toggles, resume=resume),
            parent_run_id=parent,
            extra_tags=extra_tags_from_env(),
        )
    if summary.get("stopped"):  # the collapse guard: the run is recorded, but it did not train to the end
        from dapo_cli.errors import COLLAPSED, RunStopped

        raise RunStopped(summary["stopped"], COLLAPSED)


def command_line(
    name: str, config: str | None, sets: list[str] | None, toggles: dict[str, bool | None], *, resume: bool = False
) -> str:
    """The command as parsed (recorded as the run's ``dapo.command`` tag), quoted for a shell."""
    words = ["dapo", name, *([config] if config else [])]
    for item in sets or ():
        words += ["--set", item]
    words += [f"--{k}" if v else f"--no-{k}" for k, v in toggles.items() if v is not None]
    if resume:
        words.append("--resume")
    return shlex.join(words)
