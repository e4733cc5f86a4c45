"""Training configs and saved runs for the training and CLI tests: a one-thread CPU config of
the tiny store, and checkpoints as the trainer writes them (without tensors, for the checks
that refuse a resume before reading any)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from landcover.training import Checkpoint, TrainConfig
from landcover.training.checkpoint import save_checkpoint
from landcover.training.resume import store_identity
from tiling.chipstore.store import open_store

# The store a `saved_checkpoint` records.
STORE = {"url": "chips.zarr", "chips": 90, "train_chips": 70, "val_chips": 20, "digest": "d"}


def make_config(store: str, out: Path, **overrides: Any) -> TrainConfig:
    """Two epochs of batches of 8 on the CPU, seed 0, one thread; `overrides` replace any."""
    # One thread: fast on 2 cores, and immune to other processes competing for them.
    options: dict[str, Any] = {
        "epochs": 2,
        "batch_size": 8,
        "device": "cpu",
        "seed": 0,
        "threads": 1,
    }
    options.update(overrides)
    return TrainConfig(store_url=store, out_dir=str(out), **options)


def saved_checkpoint(config: TrainConfig, *, epoch: int = 1, **state: Any) -> Checkpoint:
    """A checkpoint of `config` after `epoch` (no tensors: the checks never read them)."""
    values: dict[str, Any] = {
        "epoch": epoch,
        "world_size": 1,
        "config": config.to_json(),
        "model": {},
        "optimizer": {},
        "scheduler": {},
        "per_rank": [{}],
        "store": STORE,
        "bmuf": None,
        "best_val_miou": 0.5,
        "best_epoch": epoch,
        "epochs_without_improvement": 0,
        "stopped_early": False,
    }
    return Checkpoint(**{**values, **state})


def write_saved_run(store: str, run: Path, config: TrainConfig) -> Path:
    """RUN_DIR/checkpoints/last.pt of `config` on `store` after epoch 1, as the trainer writes
    it but without tensors (a refusal comes before they are read)."""
    identity = store_identity(store, open_store(store).summary)
    save_checkpoint(run, saved_checkpoint(config, store=identity).to_payload())
    return run / "checkpoints" / "last.pt"
