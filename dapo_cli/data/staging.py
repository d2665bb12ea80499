"""Several output files that appear together or not at all.

    with staged_outputs() as stage:
        write_table(rows, stage.path_for(out))          # a temporary beside ``out``
        stage.path_for(manifest).write_text(text)
    # here every file is in place; on any exception none is, and nothing is left behind

Each file is written to a temporary sibling of its destination (same directory, so the
final rename cannot cross filesystems). Only when every one is complete are they renamed
into place, in the order they were staged (the manifest, which records the others'
hashes, goes last). Before a destination is replaced its old file is kept under a hard
link (a copy where links are not supported), so a rename that fails half way puts every
earlier destination back as it was. A failure anywhere (a full disk, a read-only or
missing destination, a directory where a file should go) removes every temporary, the
backups and each directory this stage created, and leaves existing outputs unchanged.
An :class:`OSError` becomes a one-line :class:`~dapo_cli.errors.UserError` naming the
destination.

What no rename scheme can give: a process killed (SIGKILL, power loss) *during* the
final renames, which take microseconds, can leave some destinations new and others old;
it never leaves a torn file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dapo_cli.errors import UserError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _reason(exc: OSError) -> str:
    """One line: the OS's reason (``No space left on device``) or the library's message."""
    return exc.strerror or " ".join(str(exc).split()) or type(exc).__name__


@dataclass
class StagedOutputs:
    """Temporaries waiting to be renamed onto their destinations (see the module docstring)."""

    staged: list[tuple[Path, Path]] = field(default_factory=list)
    """(temporary, destination) in staging order."""
    created_dirs: list[Path] = field(default_factory=list)
    """Directories made for the destinations, outermost first."""
    current: Path | None = None
    """The destination being written (named in the error of a failed write)."""

    def path_for(self, destination: str | os.PathLike[str]) -> Path:
        """A new empty temporary file beside ``destination`` for the caller to write."""
        final = Path(destination)
        self.current = final
        if final.is_dir():
            raise UserError(f"output {final} is a directory; give a file path")
        self._make_parents(final.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        os.close(fd)
        self.staged.append((Path(tmp), final))
        return Path(tmp)

    def _make_parents(self, parent: Path) -> None:
        missing = []
        existing = parent
        while not existing.exists() and existing != existing.parent:
            missing.append(existing)
            existing = existing.parent
        if not existing.is_dir():
            raise UserError(f"cannot write into {parent}: {existing} is a file, not a directory")
        for directory in reversed(missing):
            directory.mkdir()
            self.created_dirs.append(directory)

    def commit(self) -> None:
        """Rename every temporary onto its destination; on a failure put back what was there."""
        mode = 0o666 & ~_umask()  # mkstemp makes 0600; give the mode a plain open() would
        for tmp, _ in self.staged:
            os.chmod(tmp, mode)
        done: list[tuple[Path, Path | None]] = []  # (destination, backup of its old file or None)
        try:
            for tmp, final in self.staged:
                self.current = final
                if final.is_dir():
                    raise UserError(f"output {final} is a directory; give a file path")
                backup = self._backup(final) if final.exists() else None
                try:
                    os.replace(tmp, final)
                except BaseException:
                    if backup is not None:
                        backup.unlink(missing_ok=True)
                    raise
                done.append((final, backup))
        except BaseException:
            for final, backup in reversed(done):
                if backup is not None:
                    os.replace(backup, final)
                else:
                    final.unlink(missing_ok=True)
            raise
        for _, backup in done:
            if backup is not None:
                backup.unlink(missing_ok=True)
        self.staged.clear()
        self.created_dirs.clear()

    @staticmethod
    def _backup(final: Path) -> Path:
        backup = final.with_name(f".{final.name}.{secrets.token_hex(4)}.old")
        try:
            os.link(final, backup)
        except OSError:
            shutil.copy2(final, backup)
        return backup

    def abort(self) -> None:
        """Remove every temporary and each directory this stage created (destinations untouched)."""
        for tmp, _ in self.staged:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        for directory in reversed(self.created_dirs):
            with contextlib.suppress(OSError):
                directory.rmdir()
        self.staged.clear()
        self.created_dirs.clear()


@contextlib.contextmanager
def staged_outputs() -> Iterator[StagedOutputs]:
    """A :class:`StagedOutputs` committed when the block ends; aborted (and OSError made one line) on an exception."""
    stage = StagedOutputs()
    try:
        yield stage
        stage.commit()
    except OSError as exc:
        stage.abort()
        where = stage.current if stage.current is not None else "the outputs"
        raise UserError(f"cannot write {where}: {_reason(exc)}; nothing was written") from None
    except BaseException:
        stage.abort()
        raise
