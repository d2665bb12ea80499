"""The ``dapo`` command line: parse, load config, call one ``run_*`` function.

Commands live one per module in this package; each is wrapped by
:func:`~dapo_cli.cli.common.handles_errors`, so user errors exit 2 with one line.
"""

from __future__ import annotations

import typer

from dapo_cli.cli import ablate as _ablate
from dapo_cli.cli import config_cmd as _config
from dapo_cli.cli import eval as _eval
from dapo_cli.cli import init_model as _init_model
from dapo_cli.cli import lint as _lint
from dapo_cli.cli import prepare as _prepare
from dapo_cli.cli import report as _report
from dapo_cli.cli import train as _train
from dapo_cli.cli.common import handles_errors

app = typer.Typer(
    name="dapo",
    help="DAPO experiments: prepare data, train, evaluate avg@K, run the ablation ladder (all recorded in MLflow).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("prepare-data")(handles_errors(_prepare.prepare_data))
app.command("init-model")(handles_errors(_init_model.init_model))
app.command("train")(handles_errors(_train.train))
app.command("eval")(handles_errors(_eval.eval_command))
app.command("ablate")(handles_errors(_ablate.ablate))
app.command("report")(handles_errors(_report.report))
app.command("config")(handles_errors(_config.config_command))
app.command("lint", epilog=_lint.EPILOG)(handles_errors(_lint.lint))


def main() -> None:
    """Console-script entry point."""
    app()
