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
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from landcover.errors import TrainingError
from landcover.training.rundir import read_checkpoint

if TYPE_CHECKING:
    from tiling.store import StoreSummary

__all__ = [
    "RESUME_MUST_MATCH",
    "check_resumable",
    "load_optimizer_state",
    "read_resumable_checkpoint",
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
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The common part of checkpoint `path` and each rank's own part, once every check has
    passed (`check_resumable`). Per-rank parts written by another number of workers are
    dropped: that state (comm residuals, BMUF learners) starts fresh."""
    must_match = {key: config[key] for key in RESUME_MUST_MATCH}
    payload = read_checkpoint(path, must_match=must_match)
    check_resumable(path, payload, config=config, store=store)
    per_rank: list[dict[str, Any]] = payload.pop("per_rank")
    if len(per_rank) != world_size:
        logger.warning(
            "%s was written by %d workers, now %d: per-worker state (comm residuals, BMUF "
            "local models) starts fresh; lr and schedule follow the new world size",
            path,
            len(per_rank),
            world_size,
        )
        per_rank = [{} for _ in range(world_size)]
    return payload, per_rank


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
    saved: Mapping[str, Any],
    *,
    config: Mapping[str, Any],
    store: Mapping[str, Any],
) -> None:
    """Refuse (TrainingError, one line) a checkpoint that the run with `config` (TrainConfig's
    JSON) on `store` (`store_identity`) cannot continue; `rundir.read_checkpoint` has already
    checked the options of RESUME_MUST_MATCH."""
    saved_config = saved["config"]
    was_bmuf, is_bmuf = bool(saved_config.get("block_momentum")), bool(config["block_momentum"])
    if was_bmuf != is_bmuf:
        saved_mode = "BMUF (--block-momentum)" if was_bmuf else "DDP (no --block-momentum)"
        flag = "pass --block-momentum" if was_bmuf else "drop --block-momentum"
        raise TrainingError(
            f"{path}: checkpoint was trained with {saved_mode}; a resumed run cannot change "
            f"the sync mode: {flag}, or {FIX}"
        )
    _check_store(path, saved.get("store"), store)


def _check_store(path: Path, saved: Mapping[str, Any] | None, store: Mapping[str, Any]) -> None:
    if saved is None:  # checkpoint format 1 did not record the store
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
