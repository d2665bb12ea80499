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


# ---------------------------------------------------------------- NUMA node memory

from dapo_cli import hardware  # noqa: E402
from dapo_cli.hardware import NodeMemory, available_bytes, node_memory, parse_meminfo  # noqa: E402

# a node's meminfo as Linux writes it (trimmed), from the 2-core VM whose node 0 held 3.5 GiB of its 24
NODE0 = """Node 0 MemTotal:        3630920 kB
Node 0 MemFree:         3525960 kB
Node 0 MemUsed:          104960 kB
Node 0 Active(file):       20000 kB
Node 0 Inactive(file):     30000 kB
Node 0 SReclaimable:        4000 kB
"""


def test_meminfo_of_a_node_and_of_the_machine_parse_to_bytes():
    info = parse_meminfo(NODE0)
    assert info["MemTotal"] == 3630920 * 1024 and info["SReclaimable"] == 4000 * 1024
    assert parse_meminfo("MemTotal:       24000 kB\nMemAvailable:   20000 kB\nHugePages_Total:       0\n") == {
        "MemTotal": 24000 * 1024, "MemAvailable": 20000 * 1024, "HugePages_Total": 0,
    }
    # vLLM's "available": free + active and inactive page cache + reclaimable slab = 3,579,960 kB
    assert available_bytes(info) == (3525960 + 20000 + 30000 + 4000) * 1024


def _fake_machine(monkeypatch, tmp_path, *, node_text=None, meminfo="", limit=None, usage=None):
    if node_text is not None:
        (tmp_path / "node0").write_text(node_text)
    (tmp_path / "meminfo").write_text(meminfo)
    monkeypatch.setattr(hardware, "NODE_MEMINFO", str(tmp_path / "node{node}"))
    monkeypatch.setattr(hardware, "MEMINFO", tmp_path / "meminfo")
    for name, value in (("CGROUP_LIMIT", limit), ("CGROUP_USAGE", usage)):
        path = tmp_path / name
        if value is not None:
            path.write_text(f"{value}\n")
        monkeypatch.setattr(hardware, name, path)


def test_node_memory_reads_the_node_file(monkeypatch, tmp_path):
    _fake_machine(monkeypatch, tmp_path, node_text=NODE0, limit="max")
    found = node_memory(0)
    assert found == NodeMemory(total=3630920 * 1024, available=3579960 * 1024, node=0)
    assert found.where() == "NUMA node 0"


def test_without_a_node_file_the_machines_own_estimate_counts(monkeypatch, tmp_path):
    _fake_machine(monkeypatch, tmp_path, meminfo="MemTotal: 24000 kB\nMemFree: 1000 kB\nMemAvailable: 20000 kB\n")
    found = node_memory(0)
    assert found == NodeMemory(total=24000 * 1024, available=20000 * 1024, node=None)
    assert found.where() == "this machine"


def test_a_cgroup_limit_below_the_node_clamps_both(monkeypatch, tmp_path):
    # limit 2 GiB, 0.5 GiB used in the cgroup: 1.5 GiB available although the node has 3.4 GiB free
    _fake_machine(monkeypatch, tmp_path, node_text=NODE0, limit=2 * 2**30, usage=2**29)
    assert node_memory(0) == NodeMemory(total=2 * 2**30, available=3 * 2**29, node=0)
