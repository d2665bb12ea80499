"""Write Hugging Face ``datasets`` folders with pyarrow, file for file as ``save_to_disk`` writes them.

``datasets`` itself is not a dependency (nor a test dependency); these are the files its
``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (datasets 2.x-4.x) leave:

    <folder>/dataset_info.json       {"citation": "", "description": "", "features": {...}, ...}
    <folder>/state.json              {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": ..., ...}
    <folder>/data-0000K-of-0000N.arrow   Arrow IPC *stream* format, schema metadata "huggingface"
    <dict folder>/dataset_dict.json  {"splits": ["train", "test"]}, one such folder per split
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa


def _features(schema: pa.Schema) -> dict[str, Any]:
    def feature(kind: pa.DataType) -> Any:
        if pa.types.is_list(kind):
            return {"feature": feature(kind.value_type), "_type": "Sequence"} if not pa.types.is_struct(kind.value_type) else [feature(kind.value_type)]
        if pa.types.is_struct(kind):
            return {f.name: feature(f.type) for f in kind}
        return {"dtype": {"double": "float64"}.get(str(kind), str(kind)), "_type": "Value"}

    return {f.name: feature(f.type) for f in schema}


def save_to_disk(rows: list[dict[str, Any]], folder: Path, *, split: str | None = "train", shards: int = 1, batch: int = 1000) -> Path:
    """``Dataset.from_list(rows, split=split).save_to_disk(folder, num_shards=shards)``, written with pyarrow."""
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    features = _features(table.schema)
    schema = table.schema.with_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    names = [f"data-{k:05d}-of-{shards:05d}.arrow" for k in range(shards)]
    per_shard = -(-len(rows) // shards)
    for k, name in enumerate(names):
        part = table.slice(k * per_shard, per_shard).replace_schema_metadata(schema.metadata)
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for record_batch in part.to_batches(max_chunksize=batch):
                writer.write_batch(record_batch)
    state = {
        "_data_files": [{"filename": n} for n in names],
        "_fingerprint": "0123456789abcdef",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": split,
    }
    (folder / "state.json").write_text(json.dumps(state, indent=2))
    info = {"citation": "", "description": "", "features": features, "homepage": "", "license": ""}
    (folder / "dataset_info.json").write_text(json.dumps(info, indent=2))
    return folder


def save_dict_to_disk(splits: dict[str, list[dict[str, Any]]], folder: Path) -> Path:
    """``DatasetDict({...}).save_to_disk(folder)``: dataset_dict.json and one Dataset folder per split."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    for name, rows in splits.items():
        save_to_disk(rows, folder / name, split=name)
    return folder


def write_arrow(rows: list[dict[str, Any]], path: Path, *, file_format: bool = False) -> Path:
    """A bare ``.arrow`` file: the IPC stream format (as ``datasets`` writes it), or the IPC file format."""
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink:
        opener = pa.ipc.new_file if file_format else pa.ipc.new_stream
        with opener(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=2)
    return path
