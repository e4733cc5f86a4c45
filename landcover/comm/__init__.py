"""Communication for synchronous training: the compression modes (spec), gradient-compression
hooks for DDP (hooks: fp16, bf16; powersgd; onebit, with their per-parameter bucket state in
buckets), the byte meter behind `comm_bytes_per_step` (meter), and block momentum (bmuf)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.comm.bmuf import BlockMomentum, ResettableAdamW, reset_local_momentum
    from landcover.comm.hooks import install_comm_hook
    from landcover.comm.meter import CommMeter
    from landcover.comm.spec import CompressionMode, CompressionSpec, parse_compression

__all__ = [
    "BlockMomentum",
    "CommMeter",
    "CompressionMode",
    "CompressionSpec",
    "ResettableAdamW",
    "install_comm_hook",
    "parse_compression",
    "reset_local_momentum",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CommMeter": "meter",
        "CompressionMode": "spec",
        "CompressionSpec": "spec",
        "install_comm_hook": "hooks",
        "parse_compression": "spec",
        "BlockMomentum": "bmuf",
        "ResettableAdamW": "bmuf",
        "reset_local_momentum": "bmuf",
    },
)
