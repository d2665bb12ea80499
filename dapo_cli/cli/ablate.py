"""`dapo ablate` (placeholder until the ablation issue lands)."""

from __future__ import annotations

from typing import Annotated

import typer

from dapo_cli.cli.common import not_built


def ablate(
    config: Annotated[str | None, typer.Argument(help="Experiment YAML (default: the embedded tiny experiment).")] = None,
    ladder: Annotated[bool, typer.Option("--ladder", help="The paper's cumulative ladder (naive GRPO → DAPO).")] = False,
    grid: Annotated[bool, typer.Option("--grid", help="The full factorial of the technique toggles.")] = False,
) -> None:
    """Run the DAPO ablation ladder or a technique grid as MLflow parent/child runs."""
    not_built("ablate", "the ablation runner lands with the ablation issue")
