"""A job for `test_ranks`: two ranks form a gloo group; rank 1's worker process is killed
(SIGKILL) after the first barrier, so rank 0 fails in its all-reduce and leaves that error as
landcover's entry points do (`cluster.failures`)."""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

from cluster.failures import record_worker_error


def main() -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group(
        "gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=60)
    )
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(torch.ones(1))
    except Exception as exc:
        record_worker_error(f"internal error: {type(exc).__name__}: {exc}", rank=rank)
        raise SystemExit(3) from None
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
