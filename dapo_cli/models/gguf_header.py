"""A GGUF file's header, checked against the file's size before anything reads the file for real.

GGUF (llama.cpp's format, ggml's ``docs/gguf.md``) is: the magic ``GGUF``; a version (uint32, 2 or 3); the
tensor count and the metadata count (uint64 each); the metadata, each entry a key (a string: uint64 length,
UTF-8 bytes), a value type (uint32) and a value (scalars; strings; arrays: element type, uint64 length,
elements); one info per tensor (name, dimension count (uint32, at most 4), dimensions (uint64 each), ggml
type (uint32), offset (uint64) into the data); padding to the alignment (metadata ``general.alignment``,
default 32); the tensor data. Little-endian, or big-endian throughout (recognised by the version).

transformers' reader (the ``gguf`` package) trusts every count and length it reads: a truncated file ends
in a ``struct.error`` traceback, a count of 2**60 in an allocation it attempts. :func:`check_gguf` walks
the header first, memory-mapped: every count and length is bounded by the bytes left before the reader
advances (``2**60`` metadata entries cannot fit in a 24-byte file, whatever each one holds), arrays of
fixed-size values are skipped without being read, and each tensor's bytes (its shape's element count in
its type's blocks) must lie inside the data section. Anything else is one :class:`GGUFError` naming the
file and what is wrong with it.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from dapo_cli.errors import UserError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
"""The versions transformers' reader supports (version 1 had 32-bit counts)."""
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NESTING = 8
"""Arrays of arrays deeper than this are refused (real files nest none)."""

SCALARS: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
"""GGUF value type → struct format of a scalar value (uint8 … float64; 7 is bool)."""
STRING, ARRAY = 8, 9
SMALLEST = {**{t: struct.calcsize(f) for t, f in SCALARS.items()}, STRING: 8, ARRAY: 12}
"""The fewest bytes a value of each type takes: what bounds a count before anything is read."""

GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
"""ggml tensor type → (name, values per block, bytes per block): a tensor of n values takes n / block × bytes."""

KEY_BYTES = 8 + 4 + 1
"""The smallest metadata entry: an empty key's length, the value type, a one-byte value."""
TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
"""The smallest tensor info: an empty name's length, no dimensions, the type, the offset."""


class GGUFError(UserError):
    """A GGUF file that is truncated or malformed (one line: the file and what is wrong)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: str
    offset: int
    """From the start of the data section."""
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: int
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_start: int
    size: int


class _Cursor:
    """Reads a memory-mapped file forward, every read checked against the bytes left."""

    def __init__(self, data: mmap.mmap | bytes, path: Path) -> None:
        self.data, self.path, self.pos, self.order = data, path, 0, "<"
        self.size = len(data)

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path} is not a valid GGUF file: {what}")

    def short(self, what: str) -> GGUFError:
        """A header that promises more than the file holds: cut short, or not written by a GGUF writer."""
        return GGUFError(f"{self.path} is truncated or corrupt: {what}")

    def take(self, n: int, what: str) -> int:
        """Advance past ``n`` bytes of ``what``; their start."""
        if n > self.size - self.pos:
            raise GGUFError(f"{self.path} is truncated: {what} needs {n:,} bytes at byte {self.pos:,}, "
                            f"and the file ends at {self.size:,}")
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, fmt: str, what: str) -> int | float | bool:
        return struct.unpack_from(self.order + fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, each: int) -> int:
        """A uint64 count of things taking at least ``each`` bytes each, bounded by the bytes left."""
        n = int(self.scalar("Q", what))
        left = self.size - self.pos
        if each and n > left // each:
            raise self.short(f"{what} is {n:,}, more than the {left:,} bytes left in the file can hold")
        return n

    def string(self, what: str) -> str:
        n = self.count(f"the length of {what}", 1)
        start = self.take(n, what)
        return bytes(self.data[start : start + n]).decode("utf-8", errors="replace")


def check_gguf(path: Path) -> GGUFHeader:
    """The header of GGUF file ``path``, every count, length, shape and offset checked against its size.

    Reads only the header (memory-mapped; the tensor data is never touched). A file that is not GGUF,
    truncated anywhere, or whose header promises what the file cannot hold raises :class:`GGUFError`.
    """
    try:
        with path.open("rb") as f:
            if path.stat().st_size < len(MAGIC) or f.read(len(MAGIC)) != MAGIC:
                raise GGUFError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _walk(_Cursor(data, path))
    except OSError as exc:
        raise GGUFError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from None


def _walk(cur: _Cursor) -> GGUFHeader:
    cur.take(len(MAGIC), "the magic")
    version = int(cur.scalar("I", "the version"))
    if version & 0xFFFF == 0:  # a big-endian file: its version reads byte-swapped
        cur.order = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in VERSIONS:
        raise cur.fail(f"version {version} is not one transformers reads ({', '.join(map(str, VERSIONS))})")
    n_tensors = int(cur.scalar("Q", "the tensor count"))
    n_metadata = cur.count("the metadata count", KEY_BYTES)
    left = cur.size - cur.pos
    if n_tensors > (left - n_metadata * KEY_BYTES) // TENSOR_INFO_BYTES:
        raise cur.short(f"the tensor count is {n_tensors:,}, more than the {left:,} bytes left in the file can hold")
    alignment, keys = DEFAULT_ALIGNMENT, set()
    for i in range(n_metadata):
        key = cur.string(f"metadata key {i}")
        if key in keys:
            raise cur.fail(f"metadata key {key!r} appears twice")
        keys.add(key)
        vtype = int(cur.scalar("I", f"the value type of {key!r}"))
        value = _value(cur, vtype, repr(key), 0)
        if key == "general.alignment":
            if vtype != 4 or not (isinstance(value, int) and value > 0 and value & (value - 1) == 0):
                raise cur.fail(f"general.alignment must be a uint32 power of two, got {value!r} (type {vtype})")
            alignment = value
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_start = -(-cur.pos // alignment) * alignment
    data_bytes = max(0, cur.size - data_start)
    names: set[str] = set()
    tensors = []
    for name, shape, (type_name, block, type_size), offset in infos:
        if name in names:
            raise cur.fail(f"tensor {name!r} appears twice")
        names.add(name)
        elements = 1
        for dim in shape:
            elements *= dim
        if elements >= 2**63:
            raise cur.fail(f"tensor {name!r} has shape {list(shape)}: {elements:,} values overflow a 64-bit count")
        if shape and shape[0] % block:
            raise cur.fail(f"tensor {name!r} of type {type_name} has a first dimension of {shape[0]:,}, not a multiple of its {block}-value blocks")
        nbytes = elements // block * type_size
        if offset % alignment:
            raise cur.fail(f"tensor {name!r} starts at data offset {offset:,}, not a multiple of the alignment {alignment}")
        if offset + nbytes > data_bytes:
            raise cur.short(f"tensor {name!r} ({type_name}, shape {list(shape)}) needs bytes {offset:,} to "
                            f"{offset + nbytes:,} of the data section, which holds {data_bytes:,}")
        tensors.append(TensorInfo(name, shape, type_name, offset, nbytes))
    return GGUFHeader(version, n_metadata, tuple(tensors), alignment, data_start, cur.size)


def _value(cur: _Cursor, vtype: int, what: str, depth: int) -> int | float | bool | None:
    """Advance past one value of type ``vtype`` (``what`` names it in errors); a scalar's value, else None."""
    if vtype in SCALARS:
        return cur.scalar(SCALARS[vtype], f"the value of {what}")
    if vtype == STRING:
        cur.string(f"the value of {what}")
        return None
    if vtype != ARRAY:
        raise cur.fail(f"{what} has value type {vtype}, which GGUF does not define")
    if depth >= MAX_NESTING:
        raise cur.fail(f"{what} nests arrays more than {MAX_NESTING} deep")
    etype = int(cur.scalar("I", f"the element type of {what}"))
    if etype not in SMALLEST:
        raise cur.fail(f"{what} is an array of value type {etype}, which GGUF does not define")
    n = cur.count(f"the length of {what}", SMALLEST[etype])
    if etype in SCALARS:
        cur.take(n * SMALLEST[etype], f"the values of {what}")
    else:
        for j in range(n):
            _value(cur, etype, f"{what}[{j}]", depth + 1)
    return None


def _tensor_info(cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], tuple[str, int, int], int]:
    name = cur.string(f"the name of tensor {i}")
    n_dims = int(cur.scalar("I", f"the dimension count of tensor {name!r}"))
    if n_dims > MAX_DIMS:
        raise cur.fail(f"tensor {name!r} has {n_dims:,} dimensions (GGUF allows at most {MAX_DIMS})")
    shape = tuple(int(cur.scalar("Q", f"dimension {d} of tensor {name!r}")) for d in range(n_dims))
    ggml_type = int(cur.scalar("I", f"the type of tensor {name!r}"))
    if ggml_type not in GGML_TYPES:
        raise cur.fail(f"tensor {name!r} has ggml type {ggml_type}, which is not one GGUF readers know")
    offset = int(cur.scalar("Q", f"the data offset of tensor {name!r}"))
    return name, shape, GGML_TYPES[ggml_type], offset
