"""`CommCounts`: the collectives a rank issues per step, by kind, as the meter counts them
(`landcover.comm.meter`), metrics.jsonl records them (docs/CONTRACTS.md, `comm_*_per_step`)
and the scaling projection charges them (`landcover.scaling.projection`).

Torch-free, so that the scaling report reads it without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CommCounts"]


@dataclass(frozen=True, slots=True)
class CommCounts:
    """A rank's collectives per step, by kind: how many it issued and the payload bytes it
    handed to them (an all-gather's own input, not what it received). `buckets_per_step` is the
    gradient buckets its hooks handled (0 where no DDP hook runs, as under block momentum).
    `measured` is False when the counts were not recorded and were inferred from the bytes
    alone (`landcover.training.records.EpochRecord.comm_counts`)."""

    allreduce_per_step: float = 0.0
    allreduce_bytes_per_step: float = 0.0
    allgather_per_step: float = 0.0
    allgather_bytes_per_step: float = 0.0
    broadcast_per_step: float = 0.0
    broadcast_bytes_per_step: float = 0.0
    buckets_per_step: float = 0.0
    measured: bool = True

    @property
    def bytes_per_step(self) -> float:
        """Every payload byte, all kinds together (metrics.jsonl's `comm_bytes_per_step`)."""
        return (
            self.allreduce_bytes_per_step
            + self.allgather_bytes_per_step
            + self.broadcast_bytes_per_step
        )

    @property
    def collectives_per_step(self) -> float:
        return self.allreduce_per_step + self.allgather_per_step + self.broadcast_per_step
