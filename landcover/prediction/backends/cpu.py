"""The CPU's instruction-set features that decide what a model may run in, torch-free.

Linux lists them in /proc/cpuinfo (`flags`); a CPU with `avx512_bf16` (Cooper Lake, Zen 4
and later) or AMX (`amx_bf16`, Sapphire Rapids and later) has native bf16 dot products, so
bf16 autocast there is a speed-up, while elsewhere oneDNN emulates it, slower than fp32. A CPU
with VNNI (`avx512_vnni`, Cascade Lake and Zen 4 on; `avx_vnni`, Alder Lake on) has int8 dot
products that accumulate in 32 bits, which onnxruntime's quantized convolutions need to be fast
and exact: without them its u8 x s8 kernels (VPMADDUBSW) saturate 16-bit sums, and the
quantized model must give up a bit of range (`reduce_range`) to be right. Where /proc/cpuinfo
is missing (macOS, Windows) no feature is claimed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CPUINFO", "CpuFeatures", "cpu_features", "parse_cpu_flags"]

CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    """The instruction-set flags of this machine's CPU (lower case, as Linux names them)."""

    flags: frozenset[str]

    @property
    def bf16(self) -> bool:
        """Native bf16 dot products: AVX-512 BF16 or AMX BF16."""
        return bool({"avx512_bf16", "amx_bf16"} & self.flags)

    @property
    def int8(self) -> bool:
        """Native int8 dot products: AVX-512 VNNI or AVX-VNNI."""
        return bool({"avx512_vnni", "avx_vnni"} & self.flags)

    @property
    def amx(self) -> bool:
        return "amx_tile" in self.flags

    def describe(self) -> str:
        """The features that matter for inference, e.g. 'avx512, avx512_bf16, avx512_vnni'."""
        wanted = (
            "avx2",
            "avx512f",
            "avx512_bf16",
            "avx512_vnni",
            "avx_vnni",
            "amx_tile",
            "amx_bf16",
        )
        return ", ".join(f for f in wanted if f in self.flags) or "none known"


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The `flags` of the first processor in the text of /proc/cpuinfo (x86 names them
    `flags`, arm64 `Features`)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_features(cpuinfo: Path = CPUINFO) -> CpuFeatures:
    """This machine's CPU features, read once from `cpuinfo`; none where it cannot be read."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return CpuFeatures(frozenset())
    return CpuFeatures(parse_cpu_flags(text))
