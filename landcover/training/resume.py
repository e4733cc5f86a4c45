"""What a checkpoint must share with the run that resumes from it.

A resumed run continues the saved one only if it trains the same model on the same data the
same way. Checked before the shards load, each a one-line refusal naming the fix:

- options that shape the saved state (`--model`, `--batch-size`, `--optimizer`);
- the synchronisation mode, DDP or BMUF (`--block-momentum`): a BMUF checkpoint holds one
  learner model and optimizer per rank, which DDP would load into replicas that then drift
  apart, and a DDP checkpoint has no block-level state;
- the chip store, by `store_identity`: its URL and a digest of what its attributes say about
  its content (chips, splits, sizes, bands, classes and every source's path, georeferencing,
  statistics and chip counts). A store that was moved (another URL, the same digest) is the
  same data and resumes with a warning; another store is refused.

What may change is the world size (elastic restarts): steps per epoch, the peak lr and the
schedule are derived again for the new world (`landcover.training.schedule`), and per-rank
state (comm
residuals, BMUF learners) starts fresh when the rank count differs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from landcover.errors import TrainingError
from landcover.training.checkpoint import read_checkpoint
from landcover.training.config import TrainConfig
from landcover.training.distributed import Collectives
from landcover.training.records import Checkpoint, EpochRecord
from landcover.training.rundir import rewrite_metrics

if TYPE_CHECKING:
    from tiling.store import StoreSummary

__all__ = [
    "RESUME_MUST_MATCH",
    "ResumeState",
    "check_resumable",
    "load_optimizer_state",
    "read_resumable_checkpoint",
    "resume_state",
    "store_identity",
]

logger = logging.getLogger(__name__)

# Options a resumed run must share with its checkpoint (they shape the saved state).
RESUME_MUST_MATCH = ("model", "batch_size", "optimizer")
FIX = "train into a new --out, or pass --overwrite instead of --resume to start this run over"


def store_identity(url: str, summary: StoreSummary) -> dict[str, Any]:
    """The store a run trains on: URL, chip counts and a SHA-256 of its content description.

    Read from the store's attributes only (no chip is read): what a resumed run needs to know
    is that its shards, splits and band statistics are the saved run's. Whether the tiling
    finished is left out (finishing adds no chip to the done sources a reader sees)."""
    content = {
        "chip_size": summary.chip_size,
        "stride": summary.stride,
        "bands": list(summary.bands),
        "class_map": summary.class_map.to_json() if summary.class_map is not None else None,
        "chips": [summary.num_chips, summary.num_train, summary.num_val],
        "val_fraction": summary.val_fraction,
        "min_valid": summary.min_valid,
        "sources": [
            {key: value for key, value in source.to_json().items() if key != "state"}
            for source in summary.sources
        ],
    }
    text = json.dumps(content, sort_keys=True, default=str)
    return {
        "url": url,
        "chips": summary.num_chips,
        "train_chips": summary.num_train,
        "val_chips": summary.num_val,
        "digest": hashlib.sha256(text.encode()).hexdigest(),
    }


def read_resumable_checkpoint(
    path: Path,
    *,
    config: Mapping[str, Any],
    store: Mapping[str, Any],
    world_size: int,
) -> tuple[Checkpoint, list[dict[str, Any]]]:
    """Checkpoint `path` without its per-rank part, and each rank's own part, once every check has
    passed (`check_resumable`). Per-rank parts written by another number of workers are
    dropped: that state (comm residuals, BMUF learners) starts fresh."""
    must_match = {key: config[key] for key in RESUME_MUST_MATCH}
    checkpoint = Checkpoint.from_payload(read_checkpoint(path, must_match=must_match))
    check_resumable(path, checkpoint, config=config, store=store)
    per_rank = checkpoint.per_rank
    if len(per_rank) != world_size:
        logger.warning(
            "%s was written by %d workers, now %d: per-worker state (comm residuals, BMUF "
            "local models) starts fresh; lr and schedule follow the new world size",
            path,
            len(per_rank),
            world_size,
        )
        per_rank = [{} for _ in range(world_size)]
    return replace(checkpoint, per_rank=[]), per_rank


@dataclass(frozen=True, slots=True)
class ResumeState:
    """Where this rank starts: after epoch `start_epoch` of a checkpoint, or a fresh run."""

    start_epoch: int = 0  # epochs done before this process started
    best_val_miou: float = -math.inf
    best_epoch: int = 0
    epochs_without_improvement: int = 0
    stopped_early: bool = False
    metrics: tuple[EpochRecord, ...] = ()
    optimizer: Mapping[str, Any] | None = None  # this rank's (BMUF) or the common state
    own: Mapping[str, Any] = field(default_factory=dict)  # this rank's part of the checkpoint
    bmuf: Mapping[str, Any] | None = None  # the block-level state, the same on every rank


def resume_state(
    path: Path | None,
    config: TrainConfig,
    collectives: Collectives,
    module: nn.Module,
    *,
    store: Mapping[str, Any],
) -> ResumeState:
    """Rank 0 reads checkpoint `path` (None: a fresh run) and checks it; every rank loads the
    job's model (BMUF: its own learner's) into `module` and gets its own part. Rank 0 rewrites
    metrics.jsonl from the checkpoint: a worker killed after an epoch's metrics line but
    before its checkpoint left a line the checkpoint does not know; that epoch runs again."""
    if path is None:
        return ResumeState()
    env = collectives.env
    common: Checkpoint | None = None
    per_rank: list[dict[str, Any]] | None = None
    error: str | None = None
    if env.is_main:
        try:
            common, per_rank = read_resumable_checkpoint(
                path, config=config.to_json(), store=store, world_size=env.world_size
            )
        except TrainingError as exc:
            error = str(exc)
    collectives.raise_if_any(error)
    saved = collectives.broadcast_object(common)
    own: dict[str, Any] = collectives.scatter_from_main(per_rank)
    assert saved is not None  # rank 0 raised otherwise
    if not config.block_momentum:
        # Per-rank models and optimizers are BMUF's learners; DDP replicas share one.
        own = {key: value for key, value in own.items() if key == "comm"}
    try:
        module.load_state_dict(own.get("model", saved.model))
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise TrainingError(
            f"{path}: checkpoint does not fit {config.model} ({first}); "
            "pass --overwrite to start over"
        ) from None
    records = saved.records
    if env.is_main:
        rewrite_metrics(config.out_dir, [r.model_dump() for r in records])
    logger.info("resuming %s after epoch %d", config.out_dir, saved.epoch)
    return ResumeState(
        start_epoch=saved.epoch,
        best_val_miou=saved.best_val_miou,
        best_epoch=saved.best_epoch,
        epochs_without_improvement=saved.epochs_without_improvement,
        stopped_early=saved.stopped_early,
        metrics=tuple(records),
        optimizer=own.get("optimizer", saved.optimizer),
        own=own,
        bmuf=saved.bmuf,
    )


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """The saved moments and step counts, but this run's hyperparameters (lr, weight decay):
    the saved lr belongs to the saved world size, and the options belong to this run."""
    settings = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    optimizer.load_state_dict(dict(state))
    for group, values in zip(optimizer.param_groups, settings, strict=True):
        params = group["params"]
        group.clear()
        group.update(values, params=params)


def check_resumable(
    path: Path,
    saved: Checkpoint,
    *,
    config: Mapping[str, Any],
    store: Mapping[str, Any],
) -> None:
    """Refuse (TrainingError, one line) a checkpoint that the run with `config` (TrainConfig's
    JSON) on `store` (`store_identity`) cannot continue; `rundir.read_checkpoint` has already
    checked the options of RESUME_MUST_MATCH."""
    saved_config = saved.config
    was_bmuf, is_bmuf = bool(saved_config.get("block_momentum")), bool(config["block_momentum"])
    if was_bmuf != is_bmuf:
        saved_mode = "BMUF (--block-momentum)" if was_bmuf else "DDP (no --block-momentum)"
        flag = "pass --block-momentum" if was_bmuf else "drop --block-momentum"
        raise TrainingError(
            f"{path}: checkpoint was trained with {saved_mode}; a resumed run cannot change "
            f"the sync mode: {flag}, or {FIX}"
        )
    _check_store(path, saved.store, store)


def _check_store(path: Path, saved: Mapping[str, Any] | None, store: Mapping[str, Any]) -> None:
    if saved is None:  # version 1 did not record it (`migrate_checkpoint`)
        logger.warning(
            "%s: the checkpoint does not record its chip store; cannot check that %s is it",
            path,
            store["url"],
        )
        return
    if saved["digest"] != store["digest"]:
        raise TrainingError(
            f"{path}: checkpoint was trained on the store {saved['url']} ({saved['chips']} "
            f"chips, {saved['val_chips']} val) but {store['url']} holds other chips "
            f"({store['chips']}, {store['val_chips']} val); {FIX}"
        )
    if saved["url"] != store["url"]:
        logger.warning(
            "%s: checkpoint was trained on %s; resuming on %s, which holds the same chips",
            path,
            saved["url"],
            store["url"],
        )
