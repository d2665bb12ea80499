"""`dapo prepare-data` (placeholder until the data issue lands)."""

from __future__ import annotations

from typing import Annotated

import typer

from dapo_cli.cli.common import not_built


def prepare_data(
    inputs: Annotated[list[str] | None, typer.Argument(help="Raw parquet/JSONL files.")] = None,
) -> None:
    """Turn raw math problems into DAPO parquet with integer answers."""
    not_built("prepare-data", "raw-file conversion lands with the rewards/data issue")
