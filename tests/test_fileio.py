"""Tests for ``dapo_cli.fileio``: atomic writes leave the old file or the new one, never a torn one or a temp."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dapo_cli.fileio import atomic_dir, atomic_path, sha256_file, write_json_atomic, write_text_atomic


class Boom(Exception):
    pass


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_text_creates_parents_and_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.txt"
    write_text_atomic(target, "first ü\n")
    assert target.read_bytes() == "first ü\n".encode("utf-8")
    write_text_atomic(target, "second")
    assert target.read_text(encoding="utf-8") == "second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]


def test_write_json_is_sorted_indented_and_newline_terminated(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    write_json_atomic(target, {"b": 1, "a": [1, 2], "p": Path("/tmp")})
    assert target.read_text(encoding="utf-8") == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1,\n  "p": "/tmp"\n}\n'
    assert json.loads(target.read_text(encoding="utf-8"))["p"] == "/tmp"


def test_exception_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "data.txt"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(Boom):
        with atomic_path(target) as tmp:
            assert tmp.parent == tmp_path and tmp != target
            tmp.write_text("half-writ", encoding="utf-8")
            raise Boom
    assert target.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["data.txt"]


def test_exception_before_any_file_existed_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(Boom):
        with atomic_path(tmp_path / "new.bin"):
            raise Boom
    assert list(tmp_path.iterdir()) == []


def test_the_temp_is_written_by_any_library_then_renamed(tmp_path: Path) -> None:
    target = tmp_path / "t.bin"
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as handle:  # e.g. pq.write_table(table, tmp)
            handle.write(b"\x00\x01")
        assert not target.exists()  # nothing visible until the block ends
    assert target.read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["t.bin"]


def test_file_mode_follows_the_umask_not_mkstemp(tmp_path: Path, umask_022: None) -> None:
    write_text_atomic(tmp_path / "f.txt", "x")
    assert mode(tmp_path / "f.txt") == 0o644  # 0666 & ~022 (mkstemp alone would give 0600)


def test_atomic_dir_creates(tmp_path: Path, umask_022: None) -> None:
    target = tmp_path / "out" / "model"
    with atomic_dir(target) as tmp:
        assert tmp.is_dir() and tmp.parent == target.parent
        (tmp / "weights.bin").write_bytes(b"w")
        assert not target.exists()
    assert (target / "weights.bin").read_bytes() == b"w"
    assert mode(target) == 0o755  # 0777 & ~022 (mkdtemp alone would give 0700)
    assert [p.name for p in target.parent.iterdir()] == ["model"]


def test_atomic_dir_replaces_an_existing_directory(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "old.bin").write_bytes(b"old")
    (target / "sub").mkdir()
    with atomic_dir(target) as tmp:
        (tmp / "new.bin").write_bytes(b"new")
    assert sorted(p.name for p in target.iterdir()) == ["new.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no .ckpt.old, no temp


def test_atomic_dir_replaces_despite_a_stale_old_from_a_crash(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (tmp_path / ".ckpt.old").mkdir()  # left behind by a process killed mid-swap
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("a", encoding="utf-8")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    assert (target / "a").read_text(encoding="utf-8") == "a"


def test_atomic_dir_exception_keeps_the_old_directory(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "old.bin").write_bytes(b"old")
    with pytest.raises(Boom):
        with atomic_dir(target) as tmp:
            (tmp / "new.bin").write_bytes(b"new")
            raise Boom
    assert sorted(p.name for p in target.iterdir()) == ["old.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_sha256_file(tmp_path: Path) -> None:
    small = tmp_path / "abc"
    small.write_bytes(b"abc")
    # FIPS 180-2 test vector for "abc"
    assert sha256_file(small) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    big = tmp_path / "big"
    payload = bytes(range(256)) * 5000  # 1.28 MB: crosses the 1 MiB read chunk
    big.write_bytes(payload)
    assert sha256_file(big) == hashlib.sha256(payload).hexdigest()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"a": 1,', "not valid JSON: line 1 column 9: Expecting property name enclosed in double quotes"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply to read"),
        ("9" * 5000, "a number of more than 4,300 digits"),
    ],
)
def test_json_that_cannot_be_read_says_why_in_one_exception(text: str, why: str) -> None:
    from dapo_cli.fileio import UnreadableJson, load_json

    with pytest.raises(UnreadableJson) as info:
        load_json(text)
    assert str(info.value) == why and isinstance(info.value, ValueError)
    assert load_json('{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}


def test_special_file_problem_names_what_is_not_a_file_and_passes_what_is(tmp_path: Path) -> None:
    from dapo_cli.fileio import special_file_problem

    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to("file")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "zero").symlink_to("/dev/zero")
    # a file, a directory, a link to a file and a missing path are the readers' to judge
    assert [special_file_problem(tmp_path / n) for n in ("file", "dir", "link", "missing")] == [None] * 4
    assert special_file_problem(tmp_path / "fifo") == "is a named pipe (FIFO), not a file"
    assert special_file_problem(tmp_path / "loop") == "is a symbolic link loop"
    assert special_file_problem(tmp_path / "zero") == "is a character device, not a file (it leads to /dev/zero)"
    assert special_file_problem("/dev/null") == "is a character device, not a file"  # named directly: no "leads to"
