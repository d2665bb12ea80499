"""The ``dapo`` command line: parse, load config, call one ``run_*`` function.

Commands live one per module in this package; each is wrapped by
:func:`~dapo_cli.cli.common.handles_errors`, so user errors exit 2 with one line. Click's own
usage errors (unknown option or command, bad value, missing argument) are one ``error:`` line
and exit 2 as well (:class:`DapoGroup`); ``--help`` (also ``-h``) is Typer's, each command's
ending with the examples its module lists in ``EXAMPLES`` (:func:`~dapo_cli.cli.common.examples_epilog`).
``dapo --version`` prints the installed version; ``--install-completion`` / ``--show-completion``
are Typer's shell completion.
"""

from __future__ import annotations

from importlib import metadata
from typing import Annotated, Any

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
from dapo_cli.cli.common import CONTEXT_SETTINGS, examples_epilog, handles_errors, one_line_usage_errors

DISTRIBUTION = "dapo-cli"
"""The package name ``dapo --version`` reads the version of."""

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
    add_completion=True,
    context_settings=CONTEXT_SETTINGS,
    pretty_exceptions_enable=False,
)


def package_version() -> str:
    """The installed ``dapo-cli`` version (``unknown`` when run from a tree that is not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dapo {package_version()}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """The group's own options: ``--version`` (the help text is the Typer app's)."""


COMMANDS = [
    ("prepare-data", _prepare.prepare_data, _prepare.EXAMPLES),
    ("init-model", _init_model.init_model, _init_model.EXAMPLES),
    ("train", _train.train, _train.EXAMPLES),
    ("eval", _eval.eval_command, _eval.EXAMPLES),
    ("ablate", _ablate.ablate, _ablate.EXAMPLES),
    ("report", _report.report, _report.EXAMPLES),
    ("config", _config.config_command, _config.EXAMPLES),
    ("lint", _lint.lint, _lint.EXAMPLES),
]
"""Every command: its name, function and help examples."""

for _name, _fn, _examples in COMMANDS:
    app.command(_name, epilog=examples_epilog(_examples))(handles_errors(_fn))


def main() -> None:
    """Console-script entry point (``python -m dapo_cli`` too: the program is called ``dapo`` either way)."""
    app(prog_name="dapo")
