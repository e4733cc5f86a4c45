"""Communication for synchronous training: gradient-compression hooks for DDP (fp16, bf16,
PowerSGD, one-bit), the byte meter behind `comm_bytes_per_step`, and block momentum (BMUF)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.comm.bmuf import BlockMomentum, ResettableAdamW, reset_local_momentum
    from landcover.comm.hooks import (
        CommMeter,
        CompressionSpec,
        install_comm_hook,
        parse_compression,
    )

__all__ = [
    "BlockMomentum",
    "CommMeter",
    "CompressionSpec",
    "ResettableAdamW",
    "install_comm_hook",
    "parse_compression",
    "reset_local_momentum",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CommMeter": "hooks",
        "CompressionSpec": "hooks",
        "install_comm_hook": "hooks",
        "parse_compression": "hooks",
        "BlockMomentum": "bmuf",
        "ResettableAdamW": "bmuf",
        "reset_local_momentum": "bmuf",
    },
)
