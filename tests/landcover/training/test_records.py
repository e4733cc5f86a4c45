"""The run directory's typed records: the epoch-time rule, run.json read as found, and the
checkpoint's one migration point."""

from __future__ import annotations

import math
from typing import Any

import pytest

from landcover.training.records import (
    CHECKPOINT_VERSION,
    Checkpoint,
    EpochRecord,
    RunInfo,
    migrate_checkpoint,
    steady_epoch_time_s,
    steady_samples_per_s,
)


def record(epoch: int, epoch_time_s: float, **extra: Any) -> EpochRecord:
    values: dict[str, Any] = {
        "epoch": epoch,
        "world_size": 2,
        "epoch_time_s": epoch_time_s,
        "load_time_s": 1.0,
        "steps": 10,
        "batch_size": 4,
        "comm_bytes_per_step": 0.0,
        "compression": "none",
        "block_momentum": False,
        "device": "cpu: test",
        **extra,
    }
    return EpochRecord.model_validate(values)


def test_steady_epoch_time_leaves_out_the_warm_up_epoch() -> None:
    records = [record(3, 12.0), record(1, 50.0), record(2, 10.0), record(4, 11.0)]
    assert steady_epoch_time_s(records) == 11.0  # epochs 2-4, whatever the order given
    assert steady_epoch_time_s([record(1, 7.0)]) == 7.0  # a single epoch is all there is
    # without samples_per_s: full batches of every worker, 10 x 2 x 4 = 80 per epoch
    assert steady_samples_per_s([record(1, 1.0), record(2, 4.0)]) == 20.0


def test_epoch_record_writes_every_key_and_reads_old_lines() -> None:
    old = record(1, 2.0, extra_key="kept")
    dumped = old.model_dump()
    assert dumped["val_miou"] is None and dumped["extra_key"] == "kept"
    assert list(dumped)[:4] == ["epoch", "world_size", "nodes", "epoch_time_s"]
    with pytest.raises(ValueError, match="world_size"):
        record(1, 2.0, world_size=True)  # a bool is not a count
    with pytest.raises(ValueError, match="epoch_time_s"):
        record(1, math.inf)


def test_run_info_reads_what_it_can() -> None:
    info = RunInfo.model_validate(
        {
            "cores": "8",
            "config": {"epochs": 6, "patience": 0, "store_url": "a.zarr"},
            "cluster": {"vmSize": "Standard_NC24"},
        }
    )
    assert info.cores is None  # a string is not a core count: unknown, not an error
    assert (info.epochs_planned, info.patience, info.store_url) == (6, None, "a.zarr")
    assert info.vm_size == "Standard_NC24"


def bmuf_state(**drop: bool) -> dict[str, Any]:
    state = {"local_steps": 11, "block_size": 4, "global_buffers": [0.0], "delta": [0.0]}
    return {k: v for k, v in state.items() if not drop.get(k)}


def version_2(bmuf_in_common: bool, **drop: bool) -> dict[str, Any]:
    own = {"model": {"w": 1}, "optimizer": {}}
    return {
        "format": "landcover-checkpoint",
        "version": 2,
        "epoch": 2,
        "world_size": 2,
        "config": {"block_momentum": True},
        "model": {"w": 0},
        "optimizer": {},
        "scheduler": {},
        "per_rank": [
            {**own, **({} if bmuf_in_common else {"comm": bmuf_state(**drop)})} for _ in range(2)
        ],
        "store": {"url": "a.zarr"},
        "bmuf": bmuf_state(**drop) if bmuf_in_common else None,
        "best_val_miou": 0.5,
        "best_epoch": 2,
        "epochs_without_improvement": 0,
        "metrics": [],
        "seed": 0,
    }


def test_old_checkpoints_migrate_to_the_current_version() -> None:
    for bmuf_in_common in (True, False):
        current = migrate_checkpoint(version_2(bmuf_in_common))
        assert current["version"] == CHECKPOINT_VERSION and current["stopped_early"] is False
        assert current["bmuf"]["block_steps"] == 3 and current["bmuf"]["meter"] == {}
        assert all("comm" not in own and "model" in own for own in current["per_rank"])
    # without the block end's BatchNorm statistics the learners restart from the global model
    current = migrate_checkpoint(version_2(True, global_buffers=True))
    assert current["bmuf"] is None and current["per_rank"] == [{}, {}]
    version_1 = {**version_2(True), "version": 1}
    del version_1["store"]
    checkpoint = Checkpoint.from_payload(version_1)
    assert checkpoint.store is None and checkpoint.epoch == 2
    assert Checkpoint.from_payload(checkpoint.to_payload()) == checkpoint
