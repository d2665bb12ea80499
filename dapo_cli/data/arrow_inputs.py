"""Arrow inputs: Hugging Face ``datasets`` folders (``save_to_disk``) and bare ``.arrow`` files, read with pyarrow.

A ``Dataset.save_to_disk(path)`` folder holds ``dataset_info.json``, ``state.json`` (its
``_data_files`` list the shards in order) and ``data-00000-of-000NN.arrow`` shards in the
Arrow IPC *stream* format. A ``DatasetDict.save_to_disk(path)`` folder holds
``dataset_dict.json`` (``{"splits": [...]}``) and one such folder per split: the
``train`` split is read, or the only split; with several splits and no ``train`` the
split must be named as ``path/<split>``. A bare ``.arrow`` file may be in the stream
format (as ``datasets`` writes it) or the file format (``ARROW1`` magic). The
``datasets`` library is never imported.

The folder's JSON files are untrusted: read only when small, and a shard name must be
a plain file name inside the folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from dapo_cli.errors import UserError

ARROW_FILE_MAGIC = b"ARROW1"
STREAM_CONTINUATION = b"\xff\xff\xff\xff"
"""First bytes of an Arrow IPC stream (the continuation marker before the schema message)."""

MAX_STATE_BYTES = 1 << 20
"""Largest ``state.json`` / ``dataset_dict.json`` read."""


@dataclass(frozen=True)
class ArrowFolder:
    """The shards of one split of a ``datasets`` folder, in order."""

    files: tuple[Path, ...]
    split: str | None
    splits: tuple[str, ...] = ()
    """Every split of a DatasetDict folder (empty for a single Dataset folder)."""


def is_datasets_folder(path: Path) -> bool:
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def _small_json(path: Path) -> Any:
    if path.stat().st_size > MAX_STATE_BYTES:
        raise UserError(f"{path} is over {MAX_STATE_BYTES:,} bytes; this is not a datasets folder's metadata")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise UserError(f"{path} is not valid JSON; is this a Hugging Face datasets folder?") from None


def _plain_names(value: Any) -> list[str] | None:
    """The shard names of ``state.json``'s ``_data_files`` (plain file names), else None."""
    if not isinstance(value, list) or not all(isinstance(d, dict) and isinstance(d.get("filename"), str) for d in value):
        return None
    names = [d["filename"] for d in value]
    return names if all(n and Path(n).name == n and n not in (".", "..") for n in names) else None


def _split_files(folder: Path) -> tuple[tuple[Path, ...], str | None]:
    state = _small_json(folder / "state.json")
    names = _plain_names(state.get("_data_files")) if isinstance(state, dict) else None
    if names is None:
        raise UserError(f"{folder / 'state.json'} does not list its data files (_data_files); is this a save_to_disk folder?")
    files = tuple(folder / n for n in names)
    missing = next((f for f in files if not f.is_file()), None)
    if missing is not None:
        raise UserError(f"{folder}: data file {missing.name} listed in state.json is missing")
    if not files:
        raise UserError(f"{folder} holds no data files")
    split = state.get("_split")
    return files, split if isinstance(split, str) else None


def resolve_folder(path: Path) -> ArrowFolder:
    """The shards to read from a ``datasets`` folder (a Dataset, or a DatasetDict: which split, above)."""
    if (path / "state.json").is_file():
        files, split = _split_files(path)
        return ArrowFolder(files, split)
    info = _small_json(path / "dataset_dict.json")
    splits = info.get("splits") if isinstance(info, dict) else None
    if not isinstance(splits, list) or not splits or not all(isinstance(s, str) and Path(s).name == s for s in splits):
        raise UserError(f"{path / 'dataset_dict.json'} does not list its splits; is this a save_to_disk folder?")
    if "train" in splits:
        chosen = "train"
    elif len(splits) == 1:
        chosen = splits[0]
    else:
        raise UserError(f"{path} is a DatasetDict with splits {', '.join(splits)} and no train split; give one as {path}/<split>")
    if not (path / chosen / "state.json").is_file():
        raise UserError(f"{path}: split folder {chosen}/ with a state.json is missing")
    files, _ = _split_files(path / chosen)
    return ArrowFolder(files, chosen, tuple(splits))


def is_arrow_ipc(head: bytes) -> bool:
    """Whether the first bytes of a file are those of an Arrow IPC file or stream."""
    return head.startswith((ARROW_FILE_MAGIC, STREAM_CONTINUATION))


def _cannot_read(path: Path, exc: Exception) -> UserError:
    return UserError(f"cannot read {path} as Arrow IPC: {' '.join(str(exc).split())}")


def _open(source: pa.NativeFile) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """Schema and batches of an IPC file (``ARROW1`` magic) or stream."""
    if source.read(len(ARROW_FILE_MAGIC)) == ARROW_FILE_MAGIC:
        reader = pa.ipc.open_file(source)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
    source.seek(0)
    stream = pa.ipc.open_stream(source)
    return stream.schema, iter(stream)


def iter_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The record batches of one Arrow IPC file (file or stream format), memory-mapped."""
    try:
        with pa.memory_map(str(path)) as source:
            yield from _open(source)[1]
    except (pa.ArrowInvalid, OSError) as exc:
        raise _cannot_read(path, exc) from None


def schema_and_rows(files: tuple[Path, ...]) -> tuple[list[str], int]:
    """Column names (all shards must agree) and the total row count, without converting any row to Python."""
    columns: list[str] | None = None
    rows = 0
    for path in files:
        try:
            with pa.memory_map(str(path)) as source:
                schema, batches = _open(source)
                rows += sum(batch.num_rows for batch in batches)
        except (pa.ArrowInvalid, OSError) as exc:
            raise _cannot_read(path, exc) from None
        if columns is None:
            columns = list(schema.names)
        elif list(schema.names) != columns:
            raise UserError(f"{path} has other columns than {files[0]}; the shards of one split must agree")
    return columns or [], rows
