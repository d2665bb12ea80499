"""The ``dapo`` command line: parse, load config, call one ``run_*`` function.

Commands live one per module in this package; each is wrapped by
:func:`~dapo_cli.cli.common.handles_errors`, so user errors exit 2 with one line. Click's own
usage errors (unknown option or command, bad value, missing argument) are one ``error:`` line
and exit 2 as well (:class:`DapoGroup`); ``--help`` is Typer's.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from dapo_cli.cli import ablate as _ablate
from dapo_cli.cli import config_cmd as _config
from dapo_cli.cli import eval as _eval
from dapo_cli.cli import init_model as _init_model
from dapo_cli.cli import lint as _lint
from dapo_cli.cli import prepare as _prepare
from dapo_cli.cli import report as _report
from dapo_cli.cli import train as _train
from dapo_cli.cli.common import handles_errors, one_line_usage_errors


class DapoGroup(TyperGroup):
    """The ``dapo`` group: a usage error in it or in a command prints one ``error:`` line, exit 2."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        with one_line_usage_errors():  # the group's own arguments: an unknown command, ``dapo --bogus``
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with one_line_usage_errors():  # the command's arguments, parsed when it is invoked
            return super().invoke(ctx)


app = typer.Typer(
    name="dapo",
    cls=DapoGroup,
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
