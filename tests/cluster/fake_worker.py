"""A tiny stand-in for `python -m landcover.training`, so the engines are tested without a model.

`python -m tests.cluster.fake_worker STORE --out RUN_DIR [--epochs E] [--resume] [--threads K]
[--die-at-epoch K [--die-rank R]] [--fail]`

Each epoch every rank all-reduces `rank + 1`; rank 0 adds the sum to a running total, appends a
metrics.jsonl line and checkpoints (epoch, total) atomically. An uninterrupted run of E epochs on
W workers ends with total = E * W * (W + 1) / 2, so a lost or repeated epoch changes the total.
Started by srun (no RANK/WORLD_SIZE), it takes its rank from SLURM's variables as the real
worker does (`landcover.distenv`). `--die-at-epoch K` makes rank R SIGKILL itself once
(a marker file remembers) right after epoch K's checkpoint; `--resume` continues from the
checkpoint (fresh when there is none), as the real trainer does. Every start appends a line to
RUN_DIR/starts.jsonl with its argv, restart count, the epoch it resumed from and where each rank
ran (`placement`: rank, node name, pid).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cluster.engine import Job, input_ref, output_ref

ENTRY_MODULE = "tests.cluster.fake_worker"


def fake_job(store: str, out: str, *args: str, secret_env: Mapping[str, str] | None = None) -> Job:
    """A job of this stand-in, `STORE --out RUN_DIR ARGS...`, its store the input `store` and
    its run dir the output `run`, as landcover's training jobs are."""
    return Job(
        ENTRY_MODULE,
        (input_ref("store"), "--out", output_ref("run"), *args),
        inputs={"store": store},
        outputs={"run": out},
        secret_env=secret_env or {},
    )


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fake_worker")
    parser.add_argument("store")
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--die-at-epoch", type=int, default=0)
    parser.add_argument("--die-rank", type=int, default=1)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--sleep-s", type=float, default=0.05)
    return parser.parse_args(argv)


def _write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.fail:  # before importing torch: a failing launch stays quick
        print("ValueError: fake worker failing on purpose", file=sys.stderr, flush=True)
        return 3
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:  # srun started this task
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ["LOCAL_WORLD_SIZE"] = os.environ["SLURM_NTASKS_PER_NODE"]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    ckpt_path = out / "checkpoints" / "last.json"
    metrics_path = out / "metrics.jsonl"
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    nodes = world // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    placement: list[Any] = [None] * world
    dist.all_gather_object(placement, {"rank": rank, "node": node, "pid": os.getpid()})

    state = {"epoch": 0, "total": 0.0}
    if args.resume and ckpt_path.exists():
        state = json.loads(ckpt_path.read_text())
    if rank == 0:
        (out / "checkpoints").mkdir(parents=True, exist_ok=True)
        if metrics_path.exists():  # drop lines past the checkpoint: they will be redone
            lines = metrics_path.read_text().splitlines()
            kept = [ln for ln in lines if json.loads(ln)["epoch"] <= state["epoch"]]
            metrics_path.write_text("".join(ln + "\n" for ln in kept))
        start = {
            "argv": argv,
            "restart_count": restart_count,
            "resumed_from_epoch": state["epoch"],
            "world_size": world,
            "nodes": nodes,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "placement": placement,
        }
        with (out / "starts.jsonl").open("a") as f:
            f.write(json.dumps(start) + "\n")
    dist.barrier()

    for epoch in range(int(state["epoch"]) + 1, args.epochs + 1):
        t0 = time.perf_counter()
        value = torch.tensor([rank + 1.0])
        dist.all_reduce(value)
        time.sleep(args.sleep_s)
        epoch_time_s = time.perf_counter() - t0
        state = {"epoch": epoch, "total": float(state["total"]) + float(value.item())}
        if rank == 0:
            line = {
                "epoch": epoch,
                "world_size": world,
                "nodes": nodes,
                "epoch_time_s": epoch_time_s,
                "samples_per_s": world / epoch_time_s,
                "threads_per_worker": args.threads or 1,  # as the trainer records it: at least 1
                # the other fields every metrics.jsonl record has (docs/CONTRACTS.md)
                "load_time_s": 0.0,
                "steps": 1,
                "comm_bytes_per_step": 4.0,  # the one float32 all-reduced above
                "compression": "none",
                "block_momentum": False,
                "batch_size": 1,
                "device": "cpu",
                "restart_count": restart_count,
                "total": state["total"],
            }
            with metrics_path.open("a") as f:
                f.write(json.dumps(line) + "\n")
            _write_json_atomic(ckpt_path, state)
        dist.barrier()
        marker = out / f"died-at-{epoch}"
        if epoch == args.die_at_epoch and rank == args.die_rank and not marker.exists():
            marker.write_text("1")
            print(f"fake worker rank {rank} killing itself after epoch {epoch}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()
    print(f"rank {rank} done: total {state['total']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
