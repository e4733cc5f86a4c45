"""Stand-ins for the trainer in the `landcover tune` tests: no model, milliseconds a trial.

As a worker module (`--cluster` trials):

`python -m tests.landcover.tuning.stand_in_worker STORE --out RUN_DIR [--epochs E] [--lr LR]
[training options, ignored]` writes E metrics.jsonl lines whose val mIoU grows with the epoch
and is highest at lr = 1e-3, so the trials' scores depend on what the sampler chose. In process,
`replace_trainer` puts the same metrics in place of `landcover.training.train`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

    from landcover.training import TrainCallbacks, TrainConfig

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


def replace_trainer(monkeypatch: pytest.MonkeyPatch) -> list[TrainConfig]:
    """`landcover.training.train` replaced by `write_metrics` (the epoch-end callback
    included); returns the list that every trained configuration is appended to."""
    configs: list[TrainConfig] = []

    def train(config: TrainConfig, *, callbacks: TrainCallbacks | None = None) -> None:
        configs.append(config)
        on_epoch_end = callbacks.on_epoch_end if callbacks else None
        lr = config.lr or 2e-3
        write_metrics(Path(config.out_dir), lr=lr, epochs=config.epochs, on_epoch_end=on_epoch_end)

    monkeypatch.setattr("landcover.training.worker.train", train)
    return configs


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
