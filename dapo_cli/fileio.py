"""Atomic file and directory writes: nothing half-written is ever left behind.

Every writer in the project goes through these helpers: the data lands in a
temporary sibling first and is renamed into place only once complete, so an
interrupted command leaves either the old file or the new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    The caller writes a file at the yielded path (with any library). On an
    exception the temporary file is removed and ``path`` is untouched.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():  # mkstemp makes it 0600; give it the mode a plain open() would
            os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, final)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; swap it into place on success.

    An existing directory at ``path`` is replaced only after the new one is
    complete. On an exception the temporary directory is removed.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700; give it the mode of a plain mkdir
        if final.exists():
            old = final.with_name(f".{final.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


class UnreadableJson(ValueError):
    """JSON text that :func:`load_json` cannot read; the message says why, without the text."""


def load_json(text: str) -> Any:
    """``json.loads(text)``, every way it fails an :class:`UnreadableJson` that says why.

    Bounded: json recurses once per nesting level, so a value nested past the recursion limit (about a
    thousand levels; dapo's own files nest a few) raises RecursionError, and Python refuses to convert an
    integer of more than ``sys.get_int_max_str_digits()`` digits (4,300) with a plain ValueError. Both are
    damage, reported in one line like a syntax error, never a traceback.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        why = f"not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}"
    except RecursionError:
        why = "nested too deeply to read"
    except ValueError:  # int() past sys.get_int_max_str_digits()
        why = f"a number of more than {sys.get_int_max_str_digits():,} digits"
    raise UnreadableJson(why)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def safetensors_problem(file: Path) -> str | None:
    """Why ``file`` is no complete safetensors file (None: it is), from its header alone.

    A safetensors file is an 8-byte little-endian header length, a JSON header mapping each
    tensor to ``data_offsets`` in the data that follows, and the data: a file cut short, a
    garbage header or a header promising more bytes than are there is found without loading.
    """
    import struct

    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            if size < 8:
                return f"is truncated ({size} bytes)"
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > min(size - 8, 100 * 2**20):
                return "has a corrupt header (not a safetensors file, or truncated)"
            header = json.loads(f.read(header_len))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    except (ValueError, UnicodeDecodeError):
        return "has a corrupt header (not valid JSON)"
    if not isinstance(header, dict):
        return "has a corrupt header (not a JSON object)"
    ends = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"has a corrupt header (tensor {name!r} has no data_offsets)"
        ends.append(offsets[1])
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        return f"is truncated or corrupt: {size} bytes, its header promises {expected}"
    return None


_SPECIAL_KINDS = (
    ("S_ISFIFO", "is a named pipe (FIFO), not a file"),
    ("S_ISCHR", "is a character device, not a file"),
    ("S_ISBLK", "is a block device, not a file"),
    ("S_ISSOCK", "is a socket, not a file"),
)


def special_file_problem(path: str | os.PathLike[str]) -> str | None:
    """What makes ``path`` neither a regular file, a directory nor a missing path, or None.

    An input from elsewhere that is a FIFO blocks a reader forever, a link to ``/dev/zero`` never ends,
    and a symbolic-link loop makes ``Path.resolve`` raise; ``is_file`` and ``is_dir`` say False for all
    of them, so without this a reader calls them "not found". The phrase follows the path in an error
    line (``input x.jsonl is a character device, not a file (it leads to /dev/zero)``).
    """
    import errno
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return "is a symbolic link loop" if exc.errno == errno.ELOOP else None
    for test, phrase in _SPECIAL_KINDS:
        if getattr(stat, test)(mode):
            target = os.path.realpath(path)
            return phrase + (f" (it leads to {target})" if target != os.path.abspath(path) else "")
    return None


def refuse_special(path: str | os.PathLike[str], what: str) -> None:
    """A UserError when ``path`` is a FIFO, a device, a socket or a symbolic-link loop (:func:`special_file_problem`):
    ``<what> <path> is a named pipe (FIFO), not a file; give a regular file``."""
    from dapo_cli.errors import UserError
    from dapo_cli.redact import escape_controls

    problem = special_file_problem(path)
    if problem:
        raise UserError(f"{what} {escape_controls(os.fspath(path))} {problem}; give a regular file")
