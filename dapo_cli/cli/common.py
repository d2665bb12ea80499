"""What every command shares: consoles, the error boundary, help layout (examples, panels),
config loading options, and the checks of paths and stores a command is about to write (run
before anything is created)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from dapo_cli.errors import RunStopped, UserError, environment_failure
from dapo_cli.redact import escape_controls, redact

console = Console()
"""Results (run dirs, MLflow run ids, metrics, tables): stdout."""
err_console = Console(stderr=True)
"""Logs, progress and errors: stderr."""

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
"""Every command (and the group) takes ``-h`` as well as ``--help``."""


class Panel:
    """Titles of the rich help panels options are grouped in (one spelling for every command)."""

    CONFIG = "Config"
    DATA = "Data"
    SAMPLING = "Sampling"
    TECHNIQUES = "Techniques"
    RUN = "Run"
    OUTPUT = "Output"
    TRACKING = "Tracking"
    CLUSTER = "Cluster plan (--dry-run)"
    ALGO = "Algorithm"


Examples = Sequence[tuple[str, str]]
"""``(command line, what it does)`` pairs: a command module's ``EXAMPLES``."""


def examples_epilog(examples: Examples) -> str:
    """The "Examples" block that ends a command's ``--help``: each command line on a line of its
    own, what it does indented under it.

    Typer's rich help keeps single line breaks of an epilog (it does not re-wrap it into one
    paragraph) and dedents it as a docstring; commands and texts are escaped, so a ``[CONFIG]``
    in them is printed, not read as rich markup. 2-4 examples per command.
    """
    if not 2 <= len(examples) <= 4:
        raise ValueError(f"a command's help shows 2-4 examples, not {len(examples)}")
    lines = ["[bold]Examples[/]"]
    for command, what in examples:
        lines += [f"[cyan]{escape(command)}[/]", f"    {escape(what)}"]
    return "\n".join(lines)


SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a config value, e.g. --set trainer.lr=1e-4 (repeatable).",
                 show_default="none", rich_help_panel=Panel.CONFIG),
]

QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress and no per-step logs on stderr: only errors, and the results on stdout.",
                       rich_help_panel=Panel.OUTPUT),
]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="More detail on stderr (every metric of every step).", rich_help_panel=Panel.OUTPUT),
]


def verbosity(quiet: bool, verbose: bool) -> int:
    """-1 (``--quiet``), 0 or 1 (``--verbose``); both at once is a UserError."""
    if quiet and verbose:
        raise UserError("give one of --quiet or --verbose, not both")
    return -1 if quiet else int(verbose)


def print_error(message: str) -> None:
    """``error: <message>`` on stderr, on one line (whitespace and newlines collapsed)."""
    # a URI's password never reaches the terminal, nor a control character a quoted name or value holds
    text = escape_controls(redact(" ".join(message.split()))) or "unknown error"
    # escape: a message quoting a path or value with [brackets] is text, not rich markup
    err_console.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)


def handles_errors(fn: F) -> F:
    """Turn a :class:`UserError` into ``error: <message>`` on stderr and exit code 2 (no traceback);
    a :class:`RunStopped` the same way with its own exit code; and a failure of the machine (a full
    disk, a path that cannot be written: :func:`~dapo_cli.errors.environment_failure`) into one line and
    exit 5. Any other exception is a bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (UserError, RunStopped) as exc:
            print_error(str(exc) or type(exc).__name__)
            raise typer.Exit(code=exc.exit_code if isinstance(exc, RunStopped) else 2) from None
        except Exception as exc:
            failure = environment_failure(exc)
            if failure is None:
                raise
            print_error(str(failure))
            raise typer.Exit(code=failure.exit_code) from None

    return wrapper  # type: ignore[return-value]


def _click_error_types() -> tuple[type[BaseException], ...]:
    """Click's exception base as this Typer raises it (Typer >= 0.2x vendors Click; older ones use it)."""
    found: list[type[BaseException]] = []
    base = getattr(typer, "TyperException", None)
    if isinstance(base, type):
        found.append(base)
    try:
        import click

        found.append(click.ClickException)
    except ImportError:  # pragma: no cover - a Typer that vendors Click may come without it
        pass
    return tuple(found)


CLICK_ERRORS = _click_error_types()


def usage_message(exc: BaseException) -> str:
    """Click's message of a usage error (unknown option, bad value, missing argument) on one line,
    with where to look: ``No such option: --bogus; see 'dapo eval --help'``."""
    format_message = getattr(exc, "format_message", None)
    text = " ".join(str(format_message() if callable(format_message) else exc).split()).rstrip(".")
    text = text.replace("Value error, ", "")  # Typer's wording of a bad choice: "Value error, 'x' is not one of ..."
    ctx = getattr(exc, "ctx", None)
    if ctx is not None and getattr(ctx, "command_path", ""):
        text += f"; see '{ctx.command_path} --help'"
    return text


@contextlib.contextmanager
def one_line_usage_errors() -> Iterator[None]:
    """Click's usage errors as ``error: <message>`` and their exit code (2), instead of Typer's box.

    ``dapo`` without arguments still shows the help (Click raises that as a usage error too).
    """
    try:
        yield
    except CLICK_ERRORS as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" or not hasattr(exc, "exit_code"):
            raise
        print_error(usage_message(exc))
        raise typer.Exit(code=int(getattr(exc, "exit_code", 2) or 2)) from None


# ---------------------------------------------------------------- checks before writing


def nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (what creating ``path`` would write into),
    spelt as the user gave it (``afile`` for ``afile/x``; ``.`` for a new relative path)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def check_writable_dir(path: Path, what: str) -> None:
    """``path`` is a directory that exists or can be created, and can be written; else a UserError.

    Nothing is created. ``what`` names the setting in the message (``--output``, ``trainer.output_dir``).
    """
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path} is a file, not a directory; give a directory (or remove the file)")
    _check_can_create(path, what)


def _check_can_create(path: Path, what: str, *, inside: bool = False) -> None:
    """The nearest existing ancestor of ``path`` (of its parent with ``inside``: a file to be replaced) is a
    directory this process can write."""
    base = nearest_existing(path.parent if inside else path)
    if not base.is_dir():
        raise UserError(f"{what} {path} is inside {base}, which is a file, not a directory; give another {what}")
    if not os.access(base, os.W_OK | os.X_OK):
        reason = "is on a read-only file system" if _read_only_fs(base) else "is not writable"
        raise UserError(f"{what} {path}: {base} {reason}; give a writable {what}")


def check_output_file(path: Path, what: str) -> None:
    """``path`` can be written as a file: not a directory, inside a writable directory; else a UserError.

    Nothing is created. Commands call it before they open an MLflow run, so an output that cannot be
    written leaves no store and no FAILED run behind.
    """
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; give a file path such as {path / 'train.parquet'}")
    _check_can_create(path, what, inside=True)


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


MLFLOW_SCHEMES = frozenset(
    {"", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc"}
)
"""URI schemes MLflow's tracking client accepts without plugins (``postgresql+psycopg2`` counts as postgresql)."""


def _plugin_schemes() -> set[str]:
    """Schemes of installed MLflow tracking-store plugins (entry points ``mlflow.tracking_store``)."""
    from importlib.metadata import entry_points

    try:
        return {ep.name for ep in entry_points(group="mlflow.tracking_store")}
    except (OSError, TypeError, ValueError):  # a broken distribution's metadata must not break the check
        return set()


def check_tracking_uri(configured: str, *, create: bool, what: str = "--tracking-uri", experiment: str | None = None) -> str:
    """The MLflow store a command will use is one it can open: a known URI scheme; for ``sqlite:///``, a
    database file in a writable directory (``create``) or an existing one; for an ``http(s)://`` server, one
    that answers and lets this user in (and read ``experiment``, when given:
    :func:`~dapo_cli.tracking.server.check_server`).

    Nothing is created; returns the resolved URI (config, else ``$MLFLOW_TRACKING_URI``, else
    ``sqlite:///mlflow.db``). The store itself is opened later; this catches what would
    otherwise fail only after a model loaded or a run directory was claimed.
    """
    from urllib.parse import urlparse

    from dapo_cli.tracking.mlflow import resolve_tracking_uri, sqlite_path, sqlite_store_problem

    uri = resolve_tracking_uri(configured)
    source = what if configured else ("$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default store")
    try:
        scheme = urlparse(uri).scheme.split("+", 1)[0].lower()
    except ValueError as exc:
        raise UserError(f"MLflow store '{uri}' (from {source}) is not a valid URI ({exc}); use e.g. sqlite:///mlflow.db or http://host:5000") from None
    if len(scheme) == 1:  # a Windows drive letter: a local path
        scheme = ""
    if scheme not in MLFLOW_SCHEMES and scheme not in _plugin_schemes():
        raise UserError(
            f"MLflow store '{uri}' (from {source}) has an unsupported scheme '{scheme}:'; "
            "use sqlite:///mlflow.db, a file: path, or an http(s):// server"
        )
    if scheme == "sqlite" and not uri.startswith("sqlite:///"):
        raise UserError(f"MLflow store '{uri}' (from {source}): a SQLite store is sqlite:///relative.db or sqlite:////absolute.db")
    db = sqlite_path(uri)
    if db is None:
        from dapo_cli.tracking.server import check_server, is_server

        if is_server(uri):
            check_server(uri, experiment)
        return uri
    if db.is_dir():
        raise UserError(f"MLflow store {uri} (from {source}): {db} is a directory; name a database file, e.g. {db / 'mlflow.db'}")
    problem = sqlite_store_problem(db)
    if problem:
        raise UserError(f"MLflow store {uri} (from {source}): {problem}")
    if not create and not db.is_file():
        return uri  # reading: the store's own check says "no MLflow store at ..."
    base = nearest_existing(db.parent)
    if not base.is_dir():
        raise UserError(f"MLflow store {uri} (from {source}): {base} is a file, not a directory; put the database elsewhere")
    if create and not os.access(base, os.W_OK | os.X_OK):
        reason = "is on a read-only file system" if _read_only_fs(base) else "is not writable"
        raise UserError(f"MLflow store {uri} (from {source}): {base} {reason}; use a writable directory or --no-track / tracking.backend=null")
    if create and db.is_file() and not os.access(db, os.W_OK):
        raise UserError(f"MLflow store {uri} (from {source}): {db} is read-only; use a writable store or --no-track / tracking.backend=null")
    return uri
