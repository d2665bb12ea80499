"""`dapo eval` (placeholder until the eval issue lands)."""

from __future__ import annotations

from typing import Annotated

import typer

from dapo_cli.cli.common import not_built


def eval_command(
    checkpoint: Annotated[str | None, typer.Argument(help="A save_pretrained directory or a run checkpoint.")] = None,
) -> None:
    """Evaluate avg@K / pass@k / maj@K of a checkpoint (DAPO protocol: AIME 2024, avg@32)."""
    not_built("eval", "the evaluation protocol lands with the eval issue")
