"""`dapo init-model`: build (or rebuild) the tiny policy and report its base accuracy."""

from __future__ import annotations

from typing import Annotated

import typer

from dapo_cli.cli.common import SetOption, console
from dapo_cli.cli.options import ConfigArg, resolve


def init_model(
    config: ConfigArg = None,
    sets: SetOption = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Directory to write the model to (default: the builtin:tiny cache).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the cached model exists.")] = False,
) -> None:
    """Build the tiny character-level policy with a supervised warm-start (deterministic, a few minutes on 2 cores)."""
    from dapo_cli.models.init import run_init_model

    cfg = resolve(config, sets)
    summary = run_init_model(cfg, output=output, force=force)
    console.print(
        f"tiny model at [bold]{summary['path']}[/]: base accuracy {summary['base_acc']:.1%} at T=1.0, "
        f"{summary['base_acc_greedy']:.1%} greedy ({summary['sft_steps']} warm-start steps)"
    )
