"""What this machine offers: native bf16 matmuls or emulated ones, and the memory of the NUMA node it runs on.

``engine.autocast=bfloat16`` (and a ``model.dtype=bfloat16`` policy) runs the trainer's matmuls in
bfloat16. On an x86 CPU torch does that natively only with the ``avx512_bf16`` (AVX512-BF16: Cooper
Lake, Zen 4 and later) or ``amx_bf16`` (AMX: Sapphire Rapids and later) instructions, at about
twice float32's rate there; on a CPU with neither (AVX2 only) the bf16 matmuls are emulated: on an AVX2
EPYC a 1024^3 bf16 matmul ran at 0.75 GFLOP/s against 32 in float32, and a bf16-autocast forward (its norms,
softmax and log-softmax stay float32) 1.8-4.2x slower than the float32 one (``benchmarks/bf16_logprob_gap.py``;
docs/performance.md).

vLLM's CPU build keeps its KV cache in the memory of the NUMA node of the first CPU the process may run
on, and refuses a cache larger than what that node has available (:func:`node_memory`, read the way vLLM
reads it). A node can hold far less than the machine: one 24 GiB, 2-core VM reported 3.5 GiB on node 0.

Linux names the instructions in ``/proc/cpuinfo``'s ``flags`` lines. Anything else (no such file, another
architecture's ``Features`` lines) is reported as unknown, never guessed. A leaf utility: imports no
dapo_cli module, so ``config/lint.py`` may use it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 CPU flags (as ``/proc/cpuinfo`` spells them) under which torch's bf16 matmuls are native."""

CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuBf16:
    """Whether this CPU runs bf16 matmuls natively.

    ``native``: True (one of :data:`BF16_CPU_FLAGS` present), False (x86 flags without them), None (unknown).
    ``detail``: the flags found, or why it is unknown.
    """

    native: bool | None
    detail: str

    def line(self) -> str:
        """One line for a benchmark header or a lint message, e.g. ``bf16 matmuls on this CPU: emulated (...)``."""
        word = {True: "native", False: "emulated", None: "unknown"}[self.native]
        return f"bf16 matmuls on this CPU: {word} ({self.detail})"


def parse_cpu_bf16(cpuinfo: str) -> CpuBf16:
    """:class:`CpuBf16` from the text of a ``/proc/cpuinfo``: its x86 ``flags`` lines (one per logical CPU;
    a flag counts when every CPU has it). Text without a ``flags`` line: unknown."""
    per_cpu = [
        set(value.split())
        for key, sep, value in (line.partition(":") for line in cpuinfo.splitlines())
        if sep and key.strip() == "flags"
    ]
    if not per_cpu:
        return CpuBf16(None, "no x86 'flags' line in /proc/cpuinfo")
    common = set.intersection(*per_cpu)
    found = [f for f in BF16_CPU_FLAGS if f in common]
    if found:
        return CpuBf16(True, " ".join(found))
    return CpuBf16(False, f"no {' or '.join(BF16_CPU_FLAGS)} in the CPU flags")


def cpu_bf16(path: Path = CPUINFO) -> CpuBf16:
    """:func:`parse_cpu_bf16` of this machine's ``/proc/cpuinfo`` (``path``); unreadable: unknown."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return CpuBf16(None, f"{path} not readable")
    return parse_cpu_bf16(text)


# ---------------------------------------------------------------- NUMA node memory

NODE_MEMINFO = "/sys/devices/system/node/node{node}/meminfo"
MEMINFO = Path("/proc/meminfo")
CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")
CGROUP_USAGE = Path("/sys/fs/cgroup/memory.current")


@dataclass(frozen=True)
class NodeMemory:
    """Memory of the NUMA node a process allocates on, in bytes: ``total`` and ``available`` (free plus
    page cache plus reclaimable slab, vLLM's measure), ``node`` its number (None: no per-node file, the
    machine's ``/proc/meminfo``), both clamped to the cgroup's memory limit where one is set."""

    total: int
    available: int
    node: int | None

    def where(self) -> str:
        """``NUMA node 0`` or ``this machine`` (no per-node memory file)."""
        return "this machine" if self.node is None else f"NUMA node {self.node}"


def parse_meminfo(text: str) -> dict[str, int]:
    """Bytes by key from a ``/proc/meminfo`` text (``MemTotal:  24 kB``) or a node's
    (``Node 0 MemTotal:  24 kB``); lines that are neither are ignored."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "Node":
            parts = parts[2:]
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            scale = 1024 if len(parts) > 2 and parts[2] == "kB" else 1
            out[parts[0][:-1]] = int(parts[1]) * scale
    return out


def available_bytes(info: dict[str, int]) -> int:
    """What vLLM counts as available on a node: ``MemFree + Active(file) + Inactive(file) + SReclaimable``."""
    return sum(info.get(key, 0) for key in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable"))


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def process_node() -> int:
    """The NUMA node of the lowest-numbered CPU this process may run on (where vLLM's CPU worker
    allocates); 0 where Linux says nothing."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    cpu = Path(f"/sys/devices/system/cpu/cpu{cpus[0] if cpus else 0}")
    nodes = sorted(int(p.name[4:]) for p in cpu.glob("node[0-9]*")) if cpu.is_dir() else []
    return nodes[0] if nodes else 0


def node_memory(node: int | None = None) -> NodeMemory:
    """:class:`NodeMemory` of ``node`` (default: :func:`process_node`), from its ``meminfo`` file, or from
    ``/proc/meminfo`` where the machine has no per-node file; clamped to the cgroup v2 limit as vLLM does."""
    node = process_node() if node is None else node
    path = Path(NODE_MEMINFO.format(node=node))
    if path.is_file():
        info = parse_meminfo(path.read_text(encoding="ascii", errors="replace"))
        total, available, where = info.get("MemTotal", 0), available_bytes(info), node
    else:  # the kernel's own estimate, as psutil.virtual_memory (vLLM's fallback) reads it
        info = parse_meminfo(MEMINFO.read_text(encoding="ascii", errors="replace")) if MEMINFO.is_file() else {}
        total, available, where = info.get("MemTotal", 0), info.get("MemAvailable", 0), None
    limit = _read_int(CGROUP_LIMIT)
    if limit is not None and limit < total:
        total = limit
        available = max(0, min(available, limit - (_read_int(CGROUP_USAGE) or 0)))
    return NodeMemory(total=total, available=available, node=where)
