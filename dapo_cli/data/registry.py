"""Named datasets (``aime24``, ``dapo-math-17k``, …) resolved to local files, and dataset loading.

The data layer's registry: :mod:`dapo_cli.data.loader` (training prompts) and ``dapo eval``
resolve dataset specs through it.

The registry is data: ``datasets/registry.yaml`` (shipped in the package as
``dapo_cli/presets/datasets.yaml``). A name resolves to a local file, first found of:

1. ``$DAPO_DATA_DIR/<filename>`` when ``DAPO_DATA_DIR`` is set;
2. for entries with a ``repo_id``: the file in the standard Hugging Face cache
   (``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), found
   with huggingface_hub's ``try_to_load_from_cache`` -- whatever ``hf_hub_download``
   put there, or a copy in the documented ``datasets--org--name/snapshots/<sha>/`` layout;
3. ``$DAPO_CACHE/datasets/<filename>`` (``~/.cache/dapo/datasets/`` by default), the
   place for files without a hub copy;
4. a download with ``hf_hub_download`` into the Hugging Face cache (entries with a
   ``repo_id`` only, and not with ``HF_HUB_OFFLINE`` set), which fails with a one-line
   :class:`UserError` saying which file to place where when the machine is offline or
   the hub unreachable.

A known ``sha256`` is verified every time a file is resolved (found locally or
downloaded); a mismatch is a :class:`UserError`. When a registered name is loaded, the
rows found are compared with ``num_rows``: a mismatch, or an entry marked
``verified: false`` (its checksum or row count not established), prints one line on
stderr with the rows and sha256 found against what is expected.

:func:`load_dataset_rows` turns any dataset spec (a path or a name) into DAPO-schema
rows, each checked by :func:`dapo_cli.data.rows.check_row` as it is read: DAPO parquet or
JSONL directly, raw files (``problem``/``answer`` …) through the ``dapo prepare-data``
library. :func:`open_dataset` opens one without reading its rows (``dapo eval --limit``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dapo_cli.data.rows import checked_rows
from dapo_cli.data.schema import read_dapo_rows
from dapo_cli.errors import UserError
from dapo_cli.fileio import refuse_special, sha256_file

if TYPE_CHECKING:
    from dapo_cli.data.readers import InputSource

REGISTRY_RESOURCE = "datasets.yaml"
FORMATS = ("dapo", "raw")


@dataclass(frozen=True)
class DatasetEntry:
    """One registered dataset (see the header of ``datasets/registry.yaml`` for the fields)."""

    name: str
    filename: str
    format: str
    description: str
    license: str
    source_url: str
    repo_id: str | None = None
    path_in_repo: str | None = None
    sha256: str | None = None
    num_rows: int | None = None
    verified: bool = False
    """True when ``sha256`` and ``num_rows`` were checked against the published file."""
    note: str | None = None
    """Why an entry is unverified, and what is known instead (required when ``verified`` is false)."""


def registry_path() -> Path:
    """The registry file inside the installed package."""
    return Path(str(resources.files("dapo_cli") / "presets" / REGISTRY_RESOURCE))


def parse_registry(data: Any) -> dict[str, DatasetEntry]:
    """Validate the registry mapping ``name -> fields`` into :class:`DatasetEntry` objects."""
    if not isinstance(data, dict) or not data:
        raise ValueError("the dataset registry must be a non-empty mapping of name -> entry")
    entries: dict[str, DatasetEntry] = {}
    for name, fields in data.items():
        try:
            entry = DatasetEntry(name=str(name), **fields)
        except TypeError as exc:
            raise ValueError(f"dataset registry entry {name!r}: {exc}") from None
        if entry.format not in FORMATS:
            raise ValueError(f"dataset registry entry {name!r}: format must be one of {', '.join(FORMATS)}")
        if entry.repo_id is not None and entry.path_in_repo is None:
            raise ValueError(f"dataset registry entry {name!r}: repo_id needs path_in_repo")
        if entry.verified and (entry.sha256 is None or entry.num_rows is None):
            raise ValueError(f"dataset registry entry {name!r}: verified: true needs sha256 and num_rows")
        if not entry.verified and not entry.note:
            raise ValueError(f"dataset registry entry {name!r}: verified: false needs a note saying what is unverified")
        entries[entry.name] = entry
    return entries


@lru_cache(maxsize=1)
def load_registry() -> dict[str, DatasetEntry]:
    """Every registered dataset by name."""
    return parse_registry(yaml.safe_load(registry_path().read_text(encoding="utf-8")))


def get_dataset_entry(name: str) -> DatasetEntry:
    """The registry entry ``name``; an unknown name raises :class:`UserError` listing the valid ones."""
    registry = load_registry()
    if name not in registry:
        raise UserError(
            f"unknown dataset '{name}' (not a file either); registered names: {', '.join(registry)}"
        )
    return registry[name]


def cache_dir() -> Path:
    """Where files without a hub copy may be placed: ``$DAPO_CACHE/datasets`` or ``~/.cache/dapo/datasets``."""
    root = os.environ.get("DAPO_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "dapo") / "datasets"


def candidate_paths(entry: DatasetEntry) -> list[Path]:
    """Folders checked for ``entry``'s file by name, in order (the hub cache is looked up after them)."""
    paths = []
    data_dir = os.environ.get("DAPO_DATA_DIR")
    if data_dir:
        paths.append(Path(data_dir) / entry.filename)
    paths.append(cache_dir() / entry.filename)
    return paths


def places(entry: DatasetEntry) -> str:
    """Where a user can put the file by hand, for error messages."""
    where = [str(p) for p in candidate_paths(entry)]
    if entry.repo_id is not None:
        from dapo_cli.models.hub import hub_cache_dir

        where.append(f"the Hugging Face cache ({hub_cache_dir()}, as hf_hub_download would)")
    return ", or ".join(where)


def verify_sha256(path: Path, entry: DatasetEntry) -> Path:
    """``path`` when its sha256 matches the registry (or none is known); UserError otherwise."""
    if entry.sha256 is not None:
        actual = sha256_file(path)
        if actual != entry.sha256:
            raise UserError(
                f"{path} does not match the registered '{entry.name}' file (sha256 {actual[:12]}…, "
                f"expected {entry.sha256[:12]}…); remove it or pass the file as a path"
            )
    return path


def hub_cached(entry: DatasetEntry) -> Path | None:
    """``entry``'s file in the standard Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``), or None."""
    if entry.repo_id is None or entry.path_in_repo is None:
        return None
    from dapo_cli.models.hub import cached_file

    return cached_file(entry.repo_id, entry.path_in_repo, repo_type="dataset")


def download(entry: DatasetEntry) -> Path:
    """Fetch ``entry`` from the Hugging Face hub into its cache (``hf_hub_download``; sha256 checked)."""
    if entry.repo_id is None or entry.path_in_repo is None:
        raise UserError(
            f"dataset '{entry.name}' is not cached and has no hub copy: download {entry.source_url} "
            f"and place it at {places(entry)} (or pass its path)"
        )
    from huggingface_hub import hf_hub_download

    from dapo_cli.models.hub import first_line, hub_cache_dir, why_not_online

    why = why_not_online()  # fail in seconds, not after the hub client's retries
    if why is not None:
        raise UserError(
            f"dataset '{entry.name}' is not cached and {why}; "
            f"place {entry.filename} from {entry.source_url} at {places(entry)} (or pass its path)"
        )
    try:
        fetched = Path(
            hf_hub_download(entry.repo_id, entry.path_in_repo, repo_type="dataset", cache_dir=hub_cache_dir())
        )
    except Exception as exc:  # noqa: BLE001 -- any failure of the network call: offline, DNS, HTTP, hub errors
        raise UserError(
            f"cannot download dataset '{entry.name}' from the hub ({type(exc).__name__}: {first_line(exc)}); "
            f"place {entry.filename} from {entry.source_url} at {places(entry)} (or pass its path)"
        ) from None
    return verify_sha256(fetched, entry)


def resolve_dataset(name: str) -> Path:
    """The local file of registered dataset ``name``: ``$DAPO_DATA_DIR``, the Hugging Face cache,
    dapo's cache, else downloaded into the Hugging Face cache when online (sha256 checked every time)."""
    entry = get_dataset_entry(name)
    data_dir, dapo_cache = (candidate_paths(entry)[:-1], candidate_paths(entry)[-1])
    for path in (*data_dir, hub_cached(entry), dapo_cache):
        if path is not None and path.is_file():
            return verify_sha256(path, entry)
    return download(entry)


def resolve_dataset_path(spec: str) -> Path:
    """The local file of a dataset spec: an existing path as it is, else a registered name."""
    path = Path(spec).expanduser()
    refuse_special(path, "dataset")
    if path.exists():
        if not path.is_file():
            raise UserError(f"dataset {path} is a directory; give a parquet or JSONL file")
        return path
    return resolve_dataset(spec)


def check_rows(entry: DatasetEntry, path: Path, rows: int) -> str | None:
    """A line comparing ``rows`` (rows in ``path``) with the registry; None when the entry is verified and they match."""
    if entry.verified and entry.num_rows == rows:
        return None
    mismatch = entry.num_rows is not None and entry.num_rows != rows
    expected = "unknown" if entry.num_rows is None else str(entry.num_rows)
    status = "" if entry.verified else "; registry entry unverified (no checked sha256 or row count)"
    return (
        f"{'warning' if mismatch else 'note'}: dataset '{entry.name}' ({path.name}): {rows} rows found, "
        f"expected {expected}{status}; sha256 {sha256_file(path)}"
    )


@dataclass(frozen=True)
class DatasetRows:
    """DAPO-schema rows of a dataset, the file they came from, and for a raw file how many rows it had."""

    rows: list[dict[str, Any]]
    source: Path
    raw_rows: int | None = None
    """Rows of the raw file before conversion (None when the file was already in the DAPO schema)."""
    check: str | None = None
    """For a registered name: :func:`check_rows`'s line (printed on stderr), None when all matched."""

    def describe(self) -> str:
        """E.g. ``raw-minerva_math.jsonl: 272 raw rows, 65 kept by the prepare-data conversion``."""
        if self.raw_rows is None:
            return self.source.name
        return f"{self.source.name}: {self.raw_rows} raw rows, {len(self.rows)} kept by the prepare-data conversion"


def convert_raw(path: Path) -> list[dict[str, Any]]:
    """DAPO rows from a raw file through the ``dapo prepare-data`` library (integer answers only)."""
    try:
        from dapo_cli.data import prepare
    except ImportError:
        raise UserError(
            f"{path} is not in the DAPO schema; convert it with `dapo prepare-data` and pass the parquet"
        ) from None
    with tempfile.TemporaryDirectory(prefix="dapo-eval-prepare-") as tmp:
        out = Path(tmp) / "prepared.parquet"
        try:
            prepare.run_prepare(prepare.PrepareOptions(output=out, inputs=(path,)))
        except UserError as exc:  # prepare-data's words ("nothing to write") in the words of the caller
            raise UserError(
                f"raw dataset {path} cannot be converted to DAPO rows ({exc}); check it with `dapo prepare-data {path} -o x.parquet --no-track`"
            ) from None
        return read_dapo_rows(out)


@dataclass(frozen=True)
class OpenedDataset:
    """A dataset spec resolved and opened (:func:`~dapo_cli.data.readers.open_input`): no row held yet."""

    path: Path
    source: InputSource
    check: str | None = None
    """For a registered name: :func:`check_rows`'s line (already printed on stderr), None when all matched."""


def open_dataset(spec: str) -> OpenedDataset:
    """The file of a dataset spec (path or registered name), opened by the ``prepare-data`` reader
    (parquet, JSONL or JSON, sniffed); a registered name's rows are compared with the registry here."""
    from dapo_cli.data.readers import open_input

    registered = not Path(spec).expanduser().exists()
    path = resolve_dataset_path(spec)
    source = open_input(path)
    check = None
    if registered:
        check = check_rows(get_dataset_entry(spec), path, source.rows_read)
        if check is not None:
            print(check, file=sys.stderr, flush=True)
    return OpenedDataset(path, source, check)


def load_dataset_rows(spec: str) -> DatasetRows:
    """DAPO-schema rows of a dataset spec (path or registered name), every one checked and normalized by
    :func:`dapo_cli.data.rows.check_row` as it is read (the whole file, before any of it is used).

    DAPO rows come back normalized (see :func:`~dapo_cli.data.rows.check_row`); raw problems go through
    :func:`convert_raw`, whose rows pass the same check.
    """
    opened = open_dataset(spec)
    path, source = opened.path, opened.source
    if source.kind == "dapo":
        return DatasetRows(list(checked_rows(source.records(), str(path))), path, check=opened.check)
    return DatasetRows(convert_raw(path), path, raw_rows=source.rows_read, check=opened.check)
