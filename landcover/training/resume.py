"""What a checkpoint must share with the run that resumes from it.

A resumed run continues the saved one only if it trains the same model on the same data the
same way. Every option of TrainConfig is either one a resume may change (`RESUME_MAY_CHANGE`:
the resumed run uses the new value and records it in run.json and its checkpoints; the
changes are logged) or one it must keep (`RESUME_MUST_MATCH`: the options that shape the saved
state or how the run trains from it). Checked before the shards load, each a one-line refusal
naming the option, the checkpoint's value, the new one and the fix:

- every option of RESUME_MUST_MATCH, the sync mode (DDP or BMUF, `--block-momentum`) first: a
  BMUF checkpoint holds one learner model and optimizer per rank, which DDP would load into
  replicas that then drift apart, and a DDP checkpoint has no block-level state;
- `--epochs` may grow or shrink, but not below the epochs the checkpoint has done;
- the chip store, by `store_identity`: its URL and a digest of what its attributes say about
  its content (chips, splits, sizes, bands, classes and every source's path, georeferencing,
  statistics and chip counts). A store that was moved (another URL, the same digest) is the
  same data and resumes with a warning; another store is refused.

What may change besides is the world size (elastic restarts): steps per epoch, the peak lr and
the schedule are derived again for the new world (`landcover.training.schedule`), and per-rank
state (comm residuals, BMUF learners) starts fresh when the rank count differs. A new
`--epochs` re-derives the schedule's length the same way, and a new `--patience` decides
again whether a run that stopped early goes on.
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

from landcover.cliconfig import OptionSpec
from landcover.errors import TrainingError
from landcover.training.checkpoint import read_checkpoint
from landcover.training.config import DEFAULT_LR, OPTIONS, TrainConfig
from landcover.training.distributed import Collectives
from landcover.training.records import Checkpoint, EpochRecord
from landcover.training.rundir import START_OVER, last_checkpoint, rewrite_metrics

if TYPE_CHECKING:
    from tiling.chipstore.store import StoreSummary

__all__ = [
    "RESUME_MAY_CHANGE",
    "RESUME_MUST_MATCH",
    "ResumeState",
    "check_local_resume",
    "check_resumable",
    "load_optimizer_state",
    "read_resumable_checkpoint",
    "resume_state",
    "store_identity",
]

logger = logging.getLogger(__name__)

# Every TrainConfig field is in exactly one of these two (tests/landcover/training/test_resume.py).
# Options a resumed run must share with its checkpoint: they shape the saved state (model,
# optimizer, sync mode and its settings) or how the run trains from it; another value would
# continue one run with another's training.
RESUME_MUST_MATCH = (
    "model",
    "pretrained",
    "batch_size",
    "optimizer",  # before --lr, whose default is the optimizer's
    "lr",
    "lr_scaling",
    "warmup_epochs",
    "weight_decay",
    "loss",
    "class_weights",
    "augment",
    "brightness_jitter",
    "seed",
    "compression",
    "block_momentum",
    "block_size",
    "block_momentum_value",
    "block_lr",
    "nesterov",
    "reset_local_momentum",
    "sync_bn",
)
# Options a resumed run may change: it uses the new value and records it (run.json, the next
# checkpoints).
RESUME_MAY_CHANGE = (
    "store_url",  # the same chips under another URL; their content must match (store_identity)
    "out_dir",  # the run dir copied or mounted elsewhere (a cluster job's output)
    "epochs",  # not below the epochs done; the schedule is derived for the new count
    "patience",  # a run that stopped early goes on when the new value allows it
    "resume",
    "overwrite",
    "device",  # where and how fast it runs, as on the machines of an elastic restart
    "amp",
    "threads",
    "storage_options",  # credentials (redacted in what is saved)
    "allow_incomplete",  # the store's content is checked by its digest either way
    "tracking",
    "log_every",
)
# Changes not worth a log line: the flags of the resume itself, where the run dir and the store
# are (the store has its own check), credentials.
_UNREPORTED_CHANGES = ("store_url", "out_dir", "resume", "overwrite", "storage_options")
_SPECS: dict[str, OptionSpec] = {option.name: option for option in OPTIONS}
# How a checkpoint from before an option existed trained, where that is not today's default.
_BEFORE_RECORDED: dict[str, Any] = {"brightness_jitter": 0.0}
FIX = START_OVER  # the fix of every refusal to resume (`landcover.training.rundir`)


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
    checkpoint = Checkpoint.from_payload(read_checkpoint(path, must_match={}))
    check_resumable(path, checkpoint, config=config, store=store)
    _log_changes(path, checkpoint.config, config)
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
            f"{path}: checkpoint does not fit {config.model} ({first}); {FIX}"
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
        stopped_early=saved.stopped_early and _patience_ran_out(config, saved),
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
    JSON) on `store` (`store_identity`) cannot continue: another sync mode, another value of
    an option of RESUME_MUST_MATCH, fewer `--epochs` than it has done, other chips."""
    saved_config = saved.config
    was_bmuf, is_bmuf = bool(saved_config.get("block_momentum")), bool(config["block_momentum"])
    if was_bmuf != is_bmuf:
        saved_mode = "BMUF (--block-momentum)" if was_bmuf else "DDP (no --block-momentum)"
        flag = "pass --block-momentum" if was_bmuf else "drop --block-momentum"
        raise TrainingError(
            f"{path}: checkpoint was trained with {saved_mode}; a resumed run cannot change "
            f"the sync mode: {flag}, or {FIX}"
        )
    for name in RESUME_MUST_MATCH:
        option = _SPECS[name]
        then, now = _resume_value(saved_config, option), _resume_value(config, option)
        if then != now:
            raise TrainingError(
                f"{path}: checkpoint was trained with {_flag_text(option, then)}, not "
                f"{_flag_text(option, now)}; a resumed run must keep it: "
                f"{_how_to_give(option, then)}, or {FIX}"
            )
    if int(config["epochs"]) < saved.epoch:
        raise TrainingError(
            f"{path}: checkpoint has {saved.epoch} epochs done, more than --epochs "
            f"{config['epochs']}; pass --epochs {saved.epoch} or more to resume it, or {FIX}"
        )
    _check_store(path, saved.store, store)


def check_local_resume(config: TrainConfig, summary: StoreSummary) -> None:
    """`check_resumable` in the parent of local workers (`preflight.check_local_training`), on
    the store's `summary`: a resume that the workers would refuse is one line before any of
    them starts. Nothing to check without --resume or without a checkpoint."""
    last = last_checkpoint(config.out_dir)
    if not (config.resume and last.exists()):
        return
    saved = Checkpoint.from_payload(read_checkpoint(last, must_match={}))
    identity = store_identity(config.store_url, summary)
    check_resumable(last, saved, config=config.to_json(), store=identity)


def _resume_value(config: Mapping[str, Any], option: OptionSpec) -> Any:
    """The value of `option` in a TrainConfig JSON as a resume compares it: where an older
    checkpoint did not record the option, how it trained (`_BEFORE_RECORDED`, else the
    default), `--lr` as the optimizer's default when left out (the lr the run trained
    with), and a typed value (`--compression`) parsed from its text, so that two spellings of
    one value ("powersgd", "powersgd:2") match."""
    default = option.default if option.has_default else None
    value = config.get(option.name, _BEFORE_RECORDED.get(option.name, default))
    if option.text_value and isinstance(value, str):
        return option.parse(value)
    if option.name == "lr" and value is None:
        return DEFAULT_LR.get(str(config.get("optimizer", _SPECS["optimizer"].default)))
    return value


def _flag_text(option: OptionSpec, value: Any) -> str:
    """A value as a command line gives it: `--batch-size 8`, `--no-augment`, `no --sync-bn`,
    and `--pretrained unset` for a None (left out: the option's default behaviour)."""
    flag = option.flag
    if value is None:
        return f"{flag.name} unset"
    if option.kind is bool:
        if value:
            return flag.name
        return flag.off if flag.off is not None else f"no {flag.name}"
    return f"{flag.name} {value}"


def _how_to_give(option: OptionSpec, value: Any) -> str:
    """How a command line gives `value` of `option`: `pass --batch-size 8`, `leave out --lr`."""
    left_out = value is None or (option.kind is bool and not value and option.flag.off is None)
    return f"leave out {option.flag.name}" if left_out else f"pass {_flag_text(option, value)}"


def _log_changes(path: Path, saved: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """One line naming the options of RESUME_MAY_CHANGE that the resumed run changes."""
    changes = []
    for name in RESUME_MAY_CHANGE:
        option = _SPECS[name]
        then, now = _resume_value(saved, option), _resume_value(config, option)
        if name not in _UNREPORTED_CHANGES and then != now:
            changes.append(f"{_flag_text(option, now)} (was {_flag_text(option, then)})")
    if changes:
        logger.info("%s: resuming with %s", path, ", ".join(changes))


def _patience_ran_out(config: TrainConfig, saved: Checkpoint) -> bool:
    """Whether a run that stopped early stays stopped under this run's `--patience`."""
    patience = config.patience
    return patience is not None and saved.epochs_without_improvement >= patience


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
