"""Where one training worker runs: its place in the job and its collectives, its device and
threads, and how a batch gets there (channels-last on CUDA, bf16 autocast under AMP)."""

from __future__ import annotations

import socket
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from landcover.data.shards import Batch
from landcover.training.distributed import Collectives, DistEnv, device_description

__all__ = ["Placement"]


@dataclass(frozen=True, slots=True)
class Placement:
    """This worker's environment, built once by `landcover.training.train`."""

    env: DistEnv
    collectives: Collectives
    device: torch.device
    threads: int  # torch threads of this worker
    amp: bool  # bf16 autocast (CUDA only)
    device_name: str  # e.g. "cpu: AMD EPYC 7763", metrics.jsonl's `device`
    host: str

    @classmethod
    def create(
        cls,
        env: DistEnv,
        collectives: Collectives,
        device: torch.device,
        *,
        threads: int,
        amp: bool | None,
    ) -> Placement:
        """`amp` None: on for CUDA, off on CPU."""
        return cls(
            env=env,
            collectives=collectives,
            device=device,
            threads=threads,
            amp=device.type == "cuda" if amp is None else amp,
            device_name=device_description(device),
            host=socket.gethostname(),
        )

    def where(self) -> dict[str, Any]:
        """This rank's place for run.json's `ranks`: rank, node and host (names differ where a
        scheduler runs several nodes on one host, as the SLURM testbed does)."""
        env = self.env
        place: dict[str, Any] = {
            "rank": env.rank,
            "local_rank": env.local_rank,
            "node_rank": env.node_rank,
            "node": env.node_name or self.host,
            "host": self.host,
        }
        if env.worker_address is not None:  # the Dask worker it ran in
            place["worker"] = env.worker_address
        return place

    @property
    def channels_last(self) -> bool:
        return self.device.type == "cuda"

    def autocast(self) -> AbstractContextManager[Any]:
        if self.amp and self.device.type == "cuda":
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return nullcontext()

    def to_device(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        images = batch.images.to(self.device, non_blocking=True)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, batch.labels.to(self.device, non_blocking=True)
