"""The typed records of a run directory, shared by the trainer that writes them and every
reader (resume, `landcover.scaling`): `EpochRecord` (one metrics.jsonl line), `RunInfo`
(run.json), `Checkpoint` (checkpoints/last.pt, versioned, with one migration point), and the
one rule for a run's steady epoch time.

Torch-free: the scaling report reads run directories without importing torch. The checkpoint
holds state dicts (tensors) as opaque values; `landcover.training.rundir` loads and saves it.

Epoch time: `steady_epoch_time_s` is the median of the per-epoch training times over every
epoch but the first when there are two or more. The first epoch pays one-time costs that no
later epoch pays and that do not grow with the run: the allocator reaching its working set,
cuDNN autotuning, the page cache and lazy module imports on the first batches. A run of 3
epochs whose first took 3x the others would otherwise report a time that depends on how many
epochs it ran; a single epoch is all there is and is used as it is. The sweep table and the
scaling report both use it (`landcover.scaling`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WrapValidator
from pydantic_core.core_schema import ValidatorFunctionWrapHandler

from landcover.comm.counts import CommCounts
from landcover.comm.spec import CompressionMode, label_mode

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "RUN_KEYS",
    "Checkpoint",
    "EpochRecord",
    "RunInfo",
    "Wanted",
    "migrate_checkpoint",
    "steady_epoch_time_s",
    "steady_epochs",
    "steady_samples_per_s",
]


@dataclass(frozen=True, slots=True)
class Wanted:
    """What a field must hold, in words, for a reader's one-line error."""

    text: str


_PosInt = Annotated[int, Field(ge=1), Wanted("an integer >= 1")]
_Positive = Annotated[float, Field(gt=0, allow_inf_nan=False), Wanted("a positive number")]
_NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False), Wanted("a number >= 0")]
_Text = Annotated[str, Field(min_length=1), Wanted("a non-empty string")]
_Bool = Annotated[bool, Wanted("true or false")]
_Score = Annotated[float | None, Wanted("a number or null")]  # NaN: no val chips


class EpochRecord(BaseModel):
    """One metrics.jsonl line (docs/CONTRACTS.md), written by rank 0 after every epoch.

    The trainer writes every field (NaN as null). Readers of older or foreign files need only
    the fields without a default; the others may be missing or null. Unknown keys are kept."""

    model_config = ConfigDict(frozen=True, strict=True, extra="allow")

    epoch: _PosInt
    world_size: _PosInt
    nodes: _PosInt | None = None
    epoch_time_s: _Positive  # training steps only: no load, no validation
    epoch_cpu_s: _Score = None  # CPU seconds of the training steps, summed over ranks
    load_time_s: _NonNegative  # the one-time shard load
    val_time_s: _Score = None
    train_loss: _Score = None
    val_loss: _Score = None
    val_miou: _Score = None
    val_accuracy: _Score = None
    per_class_iou: list[float | None] | None = None  # index = class code, nodata null
    samples_per_s: _Positive | None = None  # global, all ranks
    pixels_per_s: _Score = None
    step_time_s: _Score = None
    data_time_s: _Score = None  # mean per step
    steps: _PosInt
    comm_bytes_per_step: _NonNegative  # per rank
    comm_time_s: _Score = None
    compression: _Text
    block_momentum: _Bool
    model: _Text | None = None
    batch_size: _PosInt  # per worker
    device: _Text
    threads_per_worker: _PosInt | None = None
    host: _Text | None = None
    lr: _Score = None  # of the epoch's last step
    time: str | None = None  # ISO 8601 UTC
    # collectives per step by kind (landcover.comm.counts.CommCounts); null: not recorded
    comm_allreduce_per_step: _NonNegative | None = None
    comm_allreduce_bytes_per_step: _NonNegative | None = None
    comm_allgather_per_step: _NonNegative | None = None
    comm_allgather_bytes_per_step: _NonNegative | None = None
    comm_broadcast_per_step: _NonNegative | None = None
    comm_broadcast_bytes_per_step: _NonNegative | None = None
    comm_buckets_per_step: _NonNegative | None = None

    @classmethod
    def required_fields(cls) -> tuple[str, ...]:
        """The fields every line must have."""
        return tuple(name for name, info in cls.model_fields.items() if info.is_required())

    @classmethod
    def wanted(cls, name: str) -> str:
        """What field `name` must hold, in words."""
        info = cls.model_fields.get(name)
        found = [m.text for m in (info.metadata if info else []) if isinstance(m, Wanted)]
        return found[0] if found else "a valid value"

    @property
    def samples_trained_per_s(self) -> float:
        """Samples per second: the recorded value, else full batches of every worker."""
        if self.samples_per_s is not None:
            return self.samples_per_s
        return self.steps * self.world_size * self.batch_size / self.epoch_time_s

    def comm_counts(self) -> CommCounts:
        """The epoch's collectives per step by kind. A record without them (older files)
        gets them inferred from `comm_bytes_per_step` alone: an all-gather under onebit (its
        only collective), else an all-reduce, one collective per step (`measured` False)."""
        if self.comm_allreduce_per_step is not None:
            return CommCounts(
                allreduce_per_step=self.comm_allreduce_per_step,
                allreduce_bytes_per_step=self.comm_allreduce_bytes_per_step or 0.0,
                allgather_per_step=self.comm_allgather_per_step or 0.0,
                allgather_bytes_per_step=self.comm_allgather_bytes_per_step or 0.0,
                broadcast_per_step=self.comm_broadcast_per_step or 0.0,
                broadcast_bytes_per_step=self.comm_broadcast_bytes_per_step or 0.0,
                buckets_per_step=self.comm_buckets_per_step or 0.0,
            )
        sent = self.comm_bytes_per_step
        calls = 1.0 if sent > 0 else 0.0
        if label_mode(self.compression) is CompressionMode.ONEBIT:
            return CommCounts(
                allgather_per_step=calls, allgather_bytes_per_step=sent, measured=False
            )
        return CommCounts(allreduce_per_step=calls, allreduce_bytes_per_step=sent, measured=False)


def steady_epochs(records: Sequence[EpochRecord]) -> list[EpochRecord]:
    """The epochs a run's steady-state numbers come from: all but the first (lowest epoch)
    when there are two or more (module docstring: the first pays warm-up)."""
    ordered = sorted(records, key=lambda r: r.epoch)
    return ordered[1:] if len(ordered) >= 2 else ordered


def steady_epoch_time_s(records: Sequence[EpochRecord]) -> float:
    """THE epoch time of a run: the median epoch_time_s of `steady_epochs`."""
    if not records:
        raise ValueError("no epoch records")  # callers check; a bug otherwise
    return statistics.median(r.epoch_time_s for r in steady_epochs(records))


def steady_samples_per_s(records: Sequence[EpochRecord]) -> float:
    """The throughput of a run: the median samples per second of `steady_epochs`."""
    if not records:
        raise ValueError("no epoch records")
    return statistics.median(r.samples_trained_per_s for r in steady_epochs(records))


def _or_none(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


# run.json is read as found: a value of the wrong kind is unknown (None), not an error.
_Lenient = WrapValidator(_or_none)
_PosIntOrNone = Annotated[Annotated[int, Field(ge=1)] | None, _Lenient]
_JsonObject = Annotated[dict[str, Any] | None, _Lenient]

# Top-level keys of run.json that readers (landcover.scaling.runs, the report) rely on.
RUN_KEYS = (
    "world_size", "nodes", "threads_per_worker", "cores", "device", "host", "versions", "store",
    "config",
)  # fmt: skip


class RunInfo(BaseModel):
    """run.json: the run's world, machine, versions, store and config, written once by rank 0.

    Every field may be missing when read (older runs, other writers); the trainer writes all
    of them, at least RUN_KEYS (`landcover.training.rundir.write_run_json`)."""

    model_config = ConfigDict(frozen=True, strict=True, extra="allow")

    world_size: _PosIntOrNone = None
    nodes: _PosIntOrNone = None
    local_world_size: _PosIntOrNone = None
    threads_per_worker: _PosIntOrNone = None
    interop_threads: _PosIntOrNone = None
    cores: _PosIntOrNone = None  # usable by this process (affinity), cluster.spec
    device: Annotated[str | None, _Lenient] = None
    amp: Annotated[bool | None, _Lenient] = None
    host: Annotated[str | None, _Lenient] = None
    versions: _JsonObject = None
    store: _JsonObject = None  # store_identity plus the store's summary
    config: _JsonObject = None  # TrainConfig.to_json()
    train_chips: _PosIntOrNone = None
    val_chips: Annotated[Annotated[int, Field(ge=0)] | None, _Lenient] = None
    steps_per_epoch: _PosIntOrNone = None
    peak_lr: Annotated[float | None, _Lenient] = None
    warmup_steps: Annotated[int | None, _Lenient] = None
    total_steps: Annotated[int | None, _Lenient] = None
    load_time_s: Annotated[float | None, _Lenient] = None
    load_bytes: Annotated[int | None, _Lenient] = None
    resumed_from_epoch: Annotated[int | None, _Lenient] = None
    started: Annotated[str | None, _Lenient] = None
    # every rank's place (`Placement.where`): rank, local_rank, node_rank, node, host
    ranks: Annotated[list[dict[str, Any]] | None, _Lenient] = None
    # cluster launchers may add `cluster` (cluster.json as used): kept as an extra key

    def _config_int(self, name: str) -> int | None:
        value = (self.config or {}).get(name)
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return value if ok else None

    @property
    def epochs_planned(self) -> int | None:
        """--epochs of the run."""
        return self._config_int("epochs")

    @property
    def patience(self) -> int | None:
        return self._config_int("patience")

    @property
    def store_url(self) -> str | None:
        """The chip store a run trained on: store.url, else the config's store_url."""
        for value in ((self.store or {}).get("url"), (self.config or {}).get("store_url")):
            if isinstance(value, str) and value:
                return value
        return None

    @property
    def vm_size(self) -> str | None:
        """`cluster.vmSize`, which only cluster launchers write."""
        cluster = (self.model_extra or {}).get("cluster")
        value = cluster.get("vmSize") if isinstance(cluster, dict) else None
        return value if isinstance(value, str) and value else None


CHECKPOINT_FORMAT = "landcover-checkpoint"
# 2: records the chip store; BMUF blocks end with epochs.
# 3: every key always present; BMUF's block-level state once in `bmuf` (never per rank), with
#    `global_buffers`, `block_steps` and `meter`.
CHECKPOINT_VERSION = 3


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """checkpoints/last.pt: everything a resume needs (state dicts are opaque here).

    `per_rank[r]` is rank r's own state: BMUF learners' `model` and `optimizer`, or DDP's
    comm-hook state under `comm`. No RNG state: every draw is a function of (seed, epoch,
    rank), see `landcover.data.shards`."""

    epoch: int
    world_size: int
    config: dict[str, Any]  # TrainConfig.to_json()
    model: Mapping[str, Any]  # the job's one model (BMUF: the global model)
    optimizer: Mapping[str, Any]
    scheduler: Mapping[str, Any]
    per_rank: list[dict[str, Any]]
    store: dict[str, Any] | None  # resume.store_identity; None: a version-1 checkpoint
    bmuf: dict[str, Any] | None  # BlockMomentum.state_dict(), the same on every rank
    best_val_miou: float
    best_epoch: int
    epochs_without_improvement: int
    stopped_early: bool
    metrics: list[dict[str, Any]] = field(default_factory=list)  # EpochRecord JSON
    seed: int = 0

    def to_payload(self) -> dict[str, Any]:
        """What torch.save writes: the format, the version, then every field."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}  # no copy of the tensors
        return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **values}

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Checkpoint:
        """A checkpoint of any version (`migrate_checkpoint` first)."""
        current = migrate_checkpoint(payload)
        names = cls.__dataclass_fields__
        return cls(**{key: value for key, value in current.items() if key in names})

    @property
    def records(self) -> list[EpochRecord]:
        return [EpochRecord.model_validate(m) for m in self.metrics]


def migrate_checkpoint(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint payload of version 1 or 2 as version 3: the ONE place old formats live.

    - 1 did not record the store (None: resume warns that it cannot check it);
    - before 3, `stopped_early` could be missing (False);
    - before 3, BMUF's block-level state could sit in every rank's `comm` entry (the same
      on every rank): it moves to `bmuf`. Its `block_steps` counted from the first step
      (local_steps mod block_size), `meter` could be missing (fresh counts). State without
      `global_buffers` (the BatchNorm statistics of the last block end) cannot be rebuilt:
      the learners restart from the checkpoint's global model, as after a change of world
      size."""
    out = dict(payload)
    version = int(out.get("version", 1))
    if version >= CHECKPOINT_VERSION:
        return out
    out.setdefault("store", None)
    out.setdefault("stopped_early", False)
    per_rank = [dict(own) for own in out.get("per_rank", [])]
    bmuf = out.get("bmuf")
    if bool(out["config"].get("block_momentum")):
        if bmuf is None and per_rank and "comm" in per_rank[0]:
            bmuf = per_rank[0]["comm"]
        for own in per_rank:
            own.pop("comm", None)
        if bmuf is not None:
            bmuf = dict(bmuf)
            steps, size = int(bmuf["local_steps"]), int(bmuf["block_size"])
            bmuf.setdefault("block_steps", steps % size)
            bmuf.setdefault("meter", {})
            if "global_buffers" not in bmuf:
                bmuf, per_rank = None, [{} for _ in per_rank]
    out.update(per_rank=per_rank, bmuf=bmuf, version=CHECKPOINT_VERSION)
    return out
