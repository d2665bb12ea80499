"""What every command shares: consoles, the error boundary, config loading options."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from dapo_cli.errors import RunStopped, UserError

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a config value, e.g. --set trainer.lr=1e-4 (repeatable)."),
]


def handles_errors(fn: F) -> F:
    """Turn a :class:`UserError` into ``error: <message>`` on stderr and exit code 2 (no traceback);
    a :class:`RunStopped` the same way with its own exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (UserError, RunStopped) as exc:
            message = " ".join(str(exc).split()) or type(exc).__name__
            # escape: a message quoting a path or value with [brackets] is text, not rich markup
            err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=exc.exit_code if isinstance(exc, RunStopped) else 2) from None

    return wrapper  # type: ignore[return-value]
