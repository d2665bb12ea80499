"""What this machine's CPU offers the trainer: native bf16 matmuls, or emulated ones.

``engine.autocast=bfloat16`` (and a ``model.dtype=bfloat16`` policy) runs the trainer's matmuls in
bfloat16. On an x86 CPU torch does that natively only with the ``avx512_bf16`` (AVX512-BF16: Cooper
Lake, Zen 4 and later) or ``amx_bf16`` (AMX: Sapphire Rapids and later) instructions, at about
twice float32's rate there; on a CPU with neither (AVX2 only) the bf16 matmuls are emulated: on an AVX2
EPYC a 1024^3 bf16 matmul ran at 0.75 GFLOP/s against 32 in float32, and a bf16-autocast forward (its norms,
softmax and log-softmax stay float32) 1.8-4.2x slower than the float32 one (``benchmarks/bf16_logprob_gap.py``;
docs/performance.md).

Linux names the instructions in ``/proc/cpuinfo``'s ``flags`` lines. Anything else (no such file, another
architecture's ``Features`` lines) is reported as unknown, never guessed. A leaf utility: imports no
dapo_cli module, so ``config/lint.py`` may use it.
"""

from __future__ import annotations

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
