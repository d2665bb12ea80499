"""Hugging Face ``datasets`` folders (save_to_disk) and bare .arrow files, read with pyarrow, on the shared real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hf_layout import save_dict_to_disk, save_to_disk, write_arrow

from dapo_cli.data.prepare import PrepareOptions, run_prepare
from dapo_cli.data.readers import open_input, read_input
from dapo_cli.errors import UserError

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines()]


@needs_data
@pytest.mark.slow
def test_save_to_disk_folder_gives_what_the_jsonl_gives(tmp_path: Path) -> None:
    # raw-gaokao2023en.jsonl (385 rows) as a save_to_disk folder in 3 shards of 1000-row batches
    folder = save_to_disk(records("raw-gaokao2023en.jsonl"), tmp_path / "gaokao", shards=3)
    source = open_input(folder)
    assert (source.format, source.kind, source.rows_read, source.split) == ("datasets", "raw", 385, "train")
    assert [f.name for f in source.data_files] == [f"data-0000{k}-of-00003.arrow" for k in range(3)]
    assert source.describe() == 'datasets, split train, 385 rows; problem from "question"; answer from "answer"'
    from_folder = run_prepare(PrepareOptions(output=tmp_path / "a.parquet", inputs=(folder,)))
    from_jsonl = run_prepare(PrepareOptions(output=tmp_path / "b.parquet", inputs=(DATA / "raw-gaokao2023en.jsonl",)))
    assert from_folder.kept == from_jsonl.kept and from_folder.dropped == from_jsonl.dropped
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()  # same rows, same order
    [entry] = from_folder.manifest["inputs"]
    assert entry["format"] == "datasets" and entry["fields"]["split"] == "train" and len(entry["sha256"]) == 64


@needs_data
def test_dataset_dict_folder_reads_train_and_says_so(tmp_path: Path) -> None:
    amc = records("raw-amc23.jsonl")
    folder = save_dict_to_disk({"train": amc[:30], "test": amc[30:]}, tmp_path / "amc")
    source = open_input(folder)
    assert (source.rows_read, source.split, source.splits) == (30, "train", ("train", "test"))
    assert source.describe().startswith("datasets, split train of train, test, 30 rows; ")
    test = open_input(folder / "test")  # a split named by its folder
    assert (test.rows_read, test.split) == (10, "test")
    assert [p.answer for p in read_input(folder / "test").problems] == [repr(r["answer"]) for r in amc[30:]]


def test_dataset_dict_without_train_must_be_named(tmp_path: Path) -> None:
    rows = [{"problem": "1+1?", "answer": "2"}]
    folder = save_dict_to_disk({"validation": rows, "test": rows}, tmp_path / "d")
    with pytest.raises(UserError, match=r"is a DatasetDict with splits validation, test and no train split; give one as .*/<split>"):
        open_input(folder)
    only = save_dict_to_disk({"test": rows * 3}, tmp_path / "only")
    assert (open_input(only).split, open_input(only).rows_read) == ("test", 3)  # the only split


@needs_data
@pytest.mark.parametrize("file_format", [False, True], ids=["stream", "file"])
def test_bare_arrow_file_in_either_ipc_format(tmp_path: Path, file_format: bool) -> None:
    minerva = records("raw-minerva_math.jsonl")
    path = write_arrow(minerva, tmp_path / "minerva.arrow", file_format=file_format)
    source = read_input(path)
    assert (source.format, source.rows_read, source.answer_sources) == ("arrow", 272, {"solution:boxed": 272})
    assert source.problems[0].answer == "1.6"  # line 1: "...=\\boxed{1.6} \\mathrm{~cm}"
    os.rename(path, tmp_path / "minerva")  # no extension: sniffed from the first bytes
    assert open_input(tmp_path / "minerva").format == "arrow"


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"_data_files": [{"filename": "../outside.arrow"}]}, "does not list its data files"),
        ({"_data_files": [{"filename": "data-00000-of-00009.arrow"}]}, "data file data-00000-of-00009.arrow listed in state.json is missing"),
        ({"_data_files": "x"}, "does not list its data files"),
        ("[" * 100_000, "is not valid JSON"),
    ],
)
def test_broken_folders_are_one_line(tmp_path: Path, state: object, message: str) -> None:
    folder = save_to_disk([{"problem": "1+1?", "answer": "2"}], tmp_path / "ds")
    (folder / "state.json").write_text(state if isinstance(state, str) else json.dumps(state))
    with pytest.raises(UserError, match=message) as info:
        open_input(folder)
    assert "\n" not in str(info.value)


def test_a_plain_directory_and_a_broken_arrow_file_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(UserError, match=r"input .*plain is a directory but not a Hugging Face datasets folder"):
        open_input(tmp_path / "plain")
    (tmp_path / "bad.arrow").write_bytes(b"\xff\xff\xff\xff" + bytes(range(200)))
    with pytest.raises(UserError, match=r"cannot read .*bad.arrow as Arrow IPC") as info:
        open_input(tmp_path / "bad.arrow")
    assert "\n" not in str(info.value)
