"""``dapo_cli.hardware``: native bf16 matmuls from a ``/proc/cpuinfo`` text (fake ones here, never this machine's)."""

from __future__ import annotations

from pathlib import Path

from dapo_cli.hardware import CpuBf16, cpu_bf16, parse_cpu_bf16

# two logical CPUs, as Linux writes them (trimmed); an AVX2-only EPYC like the 2-core machine the gap was measured on
AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC Processor
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2 sha_ni
bogomips\t: 4890.85

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC Processor
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2 sha_ni
"""


def with_flags(*extra: str) -> str:
    return AVX2_ONLY.replace("sha_ni", "sha_ni " + " ".join(extra))


def test_avx2_only_is_emulated():
    found = parse_cpu_bf16(AVX2_ONLY)
    assert found == CpuBf16(False, "no avx512_bf16 or amx_bf16 in the CPU flags")
    assert found.line() == "bf16 matmuls on this CPU: emulated (no avx512_bf16 or amx_bf16 in the CPU flags)"


def test_avx512_bf16_or_amx_is_native():
    assert parse_cpu_bf16(with_flags("avx512f", "avx512_bf16")) == CpuBf16(True, "avx512_bf16")
    assert parse_cpu_bf16(with_flags("amx_tile", "amx_bf16")) == CpuBf16(True, "amx_bf16")
    both = parse_cpu_bf16(with_flags("avx512_bf16", "amx_tile", "amx_bf16"))
    assert both.native and both.line() == "bf16 matmuls on this CPU: native (avx512_bf16 amx_bf16)"


def test_a_flag_counts_only_when_every_cpu_has_it():
    first_only = AVX2_ONLY.replace("sha_ni\nbogomips", "sha_ni avx512_bf16\nbogomips", 1)
    assert "avx512_bf16" in first_only
    assert parse_cpu_bf16(first_only).native is False
    # a longer flag name that contains the one looked for does not count
    assert parse_cpu_bf16(with_flags("avx512_bf16x")).native is False


def test_no_x86_flags_is_unknown_never_a_guess():
    aarch64 = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16 i8mm\n"
    for text in (aarch64, ""):
        found = parse_cpu_bf16(text)
        assert found.native is None
        assert found.line().startswith("bf16 matmuls on this CPU: unknown (")


def test_cpu_bf16_reads_the_file_and_an_unreadable_one_is_unknown(tmp_path: Path):
    path = tmp_path / "cpuinfo"
    path.write_text(with_flags("amx_bf16"), encoding="utf-8")
    assert cpu_bf16(path) == CpuBf16(True, "amx_bf16")
    missing = cpu_bf16(tmp_path / "missing")
    assert missing.native is None and "not readable" in missing.detail
