"""`onebit` compression: 1-bit SGD with error feedback (Seide et al. 2014; EF-SGD,
Karimireddy et al. 2019).

Per bucket: add the residual, take the sign of every element and one scale per gradient tensor
(its mean absolute value, the "scaled sign" of EF-SGD), all-gather the signs packed 8 per byte
plus the scales, decompress every rank's part and average; the new residual is what the
compression lost on this rank. Residuals are keyed by parameter names (`landcover.comm.buckets`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # the same class as dist.GradBucket

from landcover.comm.buckets import BucketKey, BucketNames, Future, join_state, split_state

__all__ = ["OneBit", "pack_bits", "unpack_bits"]

_BIT_SHIFTS = torch.arange(7, -1, -1, dtype=torch.uint8)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Bool (n,) → uint8 (ceil(n/8),), most significant bit first."""
    padded = torch.zeros(-(-bits.numel() // 8) * 8, dtype=torch.uint8, device=bits.device)
    padded[: bits.numel()] = bits
    weights = torch.bitwise_left_shift(1, _BIT_SHIFTS.to(bits.device)).to(torch.uint8)
    return (padded.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, count: int) -> torch.Tensor:
    """The first `count` bits of `pack_bits`' output, as bool."""
    shifts = _BIT_SHIFTS.to(packed.device)
    bits = torch.bitwise_and(torch.bitwise_right_shift(packed.unsqueeze(1), shifts), 1)
    return bits.reshape(-1)[:count].bool()


class OneBit:
    """1-bit SGD with error feedback, per bucket, with one scale per gradient tensor."""

    def __init__(
        self, collectives: Any, group: Any, names: BucketNames, *, error_feedback: bool
    ) -> None:
        self._collectives = collectives
        self._group = group
        self._names = names
        self._error_feedback = error_feedback
        self._residuals: dict[BucketKey, torch.Tensor] = {}
        self._lengths: dict[BucketKey, list[int]] = {}
        self._pending: dict[str, torch.Tensor] = {}  # per-parameter residuals not yet placed

    def __call__(self, bucket: GradBucket) -> Future:
        buffer = bucket.buffer()
        key = self._names.key(bucket)
        lengths = [p.numel() for p in bucket.parameters()]
        count = buffer.numel()
        world_size = dist.get_world_size(self._group)
        corrected = buffer.to(torch.float32, copy=True)
        if self._error_feedback:
            residual = self._residual_for(key, lengths, corrected)
            if residual is not None:
                corrected += residual
        repeats = torch.tensor(lengths, device=buffer.device)
        # max(.., 1): an empty parameter gets scale 0, not NaN
        scales = torch.stack(
            [piece.abs().sum() / max(piece.numel(), 1) for piece in torch.split(corrected, lengths)]
        )
        bits = corrected >= 0
        if self._error_feedback:
            own = torch.where(bits, 1.0, -1.0) * torch.repeat_interleave(scales, repeats)
            self._residuals[key] = corrected - own
            self._lengths[key] = lengths
        packed_bytes = -(-count // 8)
        payload = torch.cat([pack_bits(bits), scales.view(torch.uint8)])
        gathered = payload.new_empty(world_size * payload.numel())
        work = self._collectives.all_gather_into_tensor(
            gathered, payload, group=self._group, async_op=True
        )

        def decompress(done: torch.futures.Future[Any]) -> torch.Tensor:
            done.value()  # re-raises a failed collective
            total = torch.zeros(count, dtype=torch.float32, device=buffer.device)
            for row in gathered.view(world_size, -1):
                rank_bits = unpack_bits(row[:packed_bytes], count)
                rank_scales = row[packed_bytes:].clone().view(torch.float32)
                signs = torch.where(rank_bits, 1.0, -1.0)
                total += signs * torch.repeat_interleave(rank_scales, repeats)
            buffer.copy_(total.div_(world_size))
            return buffer

        return cast(Future, work.get_future().then(decompress))

    def _residual_for(
        self, key: BucketKey, lengths: list[int], like: torch.Tensor
    ) -> torch.Tensor | None:
        if key in self._residuals:
            return self._residuals.pop(key)
        # A new bucket layout: earlier buckets sharing a parameter are stale (their
        # iteration is over), so split them back into per-parameter pieces first.
        names = set(key)
        for old in [k for k in self._residuals if names.intersection(k)]:
            self._pending.update(split_state(self._residuals.pop(old), old, self._lengths.pop(old)))
        return join_state(self._pending, key, lengths, like, require_all=False)

    def state_dict(self) -> dict[str, Any]:
        residual = dict(self._pending)
        for key, flat in self._residuals.items():
            residual.update(split_state(flat, key, self._lengths[key]))
        return {"residual": {name: t.detach().cpu().clone() for name, t in residual.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._residuals.clear()
        self._lengths.clear()
        self._pending = {str(k): v.clone() for k, v in dict(state.get("residual", {})).items()}
