"""A stand-in for `python -m landcover.training` in the `landcover tune --cluster` tests: no
model, a few milliseconds a trial.

`python -m tests.landcover.tuning.stand_in_worker STORE --out RUN_DIR [--epochs E] [--lr LR]
[training options, ignored]` writes E metrics.jsonl lines whose val mIoU grows with the epoch
and is highest at lr = 1e-3, so the trials' scores depend on what the sampler chose.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ENTRY_MODULE = "tests.landcover.tuning.stand_in_worker"


def val_miou(lr: float, epoch: int) -> float:
    """The score of epoch `epoch` at `lr`: in (0, 1), best at lr 1e-3, growing with epochs."""
    return (1 - 1 / (1 + epoch)) / (1 + abs(math.log10(lr) + 3))


def write_metrics(
    out: Path,
    *,
    lr: float,
    epochs: int,
    on_epoch_end: Callable[[int, Mapping[str, Any]], None] | None = None,
) -> None:
    """`epochs` metrics.jsonl lines into run dir `out`, each followed by `on_epoch_end`, as the
    trainer calls it."""
    out.mkdir(parents=True, exist_ok=True)
    for epoch in range(1, epochs + 1):
        record = {
            "epoch": epoch, "world_size": 1, "epoch_time_s": 0.01, "load_time_s": 0.0,
            "steps": 1, "comm_bytes_per_step": 0.0, "compression": "none",
            "block_momentum": False, "batch_size": 1, "device": "cpu",
            "val_miou": val_miou(lr, epoch),
        }  # fmt: skip
        with (out / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        if on_epoch_end is not None:
            on_epoch_end(epoch, record)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stand_in_worker")
    parser.add_argument("store")
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=2e-3)
    args, _ = parser.parse_known_args(argv)
    out = Path(args.out)
    write_metrics(out, lr=args.lr, epochs=args.epochs)
    (out / "argv.json").write_text(json.dumps(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
