"""Experiment tracking besides metrics.jsonl (which stays the source of truth): TensorBoard event
files and MLflow runs, written by rank 0 behind one small interface, `Tracker`, that the
`Trainer` calls at every epoch end, every `--log-every` steps and once when it stops.

- TensorBoard (on by default): event files in RUN_DIR/tensorboard/ (`tensorboard --logdir
  RUN_DIR`), one scalar per epoch (step = epoch) of the names of `epoch_scalars`, and the
  step loss at every `--log-every` step (step = global step).
- MLflow (`--tracking mlflow`, or automatically when MLFLOW_TRACKING_URI is set: Azure ML sets
  it in every job, so its jobs log there without configuration): the run config as params
  (`TrainConfig.to_json`, storage secrets redacted), the same metrics with step = epoch, and
  model.pt (the best-by-val-mIoU model) and metrics.jsonl as artifacts when training ends.
  The run is named after the run dir; its id is kept in RUN_DIR/mlflow.json so that `--resume`
  continues the same MLflow run (MLFLOW_RUN_ID, set by Azure ML, wins).

A tracking failure (a server that does not answer, a full disk) logs one warning and turns
that backend off: tracking never stops training.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from landcover.errors import TrainingError
from landcover.training.config import TrainConfig, parse_tracking
from landcover.training.records import EpochRecord
from landcover.training.rundir import (
    METRICS_FILE,
    MLFLOW_FILE,
    MODEL_FILE,
    TENSORBOARD_DIR,
    write_json_atomic,
)

__all__ = [
    "StepProgress",
    "Tracker",
    "Tracking",
    "epoch_scalars",
    "open_tracking",
    "tracking_backends",
]

logger = logging.getLogger(__name__)

MLFLOW_INSTALL = "pip install 'landcover[mlflow]'"
# An unreachable server must cost seconds and one warning, not mlflow's default minutes of
# retries (each logged) per call; the variables set by the user win.
_MLFLOW_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}
# MLflow takes letters, digits, _ - . / and spaces in a metric name
_NOT_IN_NAME = re.compile(r"[^\w\-. ]")


@dataclass(frozen=True, slots=True)
class StepProgress:
    """Rank 0's view of training so far in an epoch, at a `--log-every` step."""

    epoch: int
    step: int  # 1-based, within the epoch
    steps: int  # per epoch
    global_step: int  # over the whole run
    loss: float  # rank 0's mean loss over the steps since the last report
    samples_per_s: float  # all workers, since the epoch began (rank 0's clock)
    lr: float


class Tracker(Protocol):
    """What the Trainer tells the trackers."""

    def log_step(self, progress: StepProgress) -> None: ...

    def log_epoch(self, record: EpochRecord) -> None: ...

    def finish(self, *, failed: bool) -> None: ...


def epoch_scalars(record: EpochRecord, class_names: Sequence[str]) -> dict[str, float]:
    """The scalars of an epoch under their tracking names; missing and NaN values left out."""
    values: dict[str, float | None] = {
        "loss/train": record.train_loss,
        "loss/val": record.val_loss,
        "val/miou": record.val_miou,
        "val/accuracy": record.val_accuracy,
        "train/lr": record.lr,
        "perf/samples_per_s": record.samples_per_s,
        "perf/comm_bytes_per_step": record.comm_bytes_per_step,
        "perf/epoch_time_s": record.epoch_time_s,
    }
    for code, iou in enumerate(record.per_class_iou or []):
        name = class_names[code] if code < len(class_names) else str(code)
        values["val/iou/" + _NOT_IN_NAME.sub("_", name)] = iou
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}


class Tracking:
    """Every backend of a run (none on ranks other than 0), each turned off at its first
    failure with one warning."""

    def __init__(self, backends: Sequence[Tracker] = ()) -> None:
        self.backends = list(backends)

    def log_step(self, progress: StepProgress) -> None:
        self._each(lambda b: b.log_step(progress))

    def log_epoch(self, record: EpochRecord) -> None:
        self._each(lambda b: b.log_epoch(record))

    def finish(self, *, failed: bool) -> None:
        self._each(lambda b: b.finish(failed=failed))
        self.backends = []

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for backend in list(self.backends):
            try:
                call(backend)
            except Exception as exc:
                _warn_off(type(backend).__name__, exc)
                self.backends.remove(backend)


def _warn_off(name: str, exc: BaseException) -> None:
    logger.warning(
        "tracking: %s failed (%s: %s); training goes on without it", name, type(exc).__name__, exc
    )


def tracking_backends(value: str, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The backends of a --tracking value; auto: tensorboard, and mlflow when the environment
    names an MLflow server (MLFLOW_TRACKING_URI: what Azure ML sets in its jobs)."""
    names = parse_tracking(value)
    if names is not None:
        return names
    return ("tensorboard", "mlflow") if environ.get("MLFLOW_TRACKING_URI") else ("tensorboard",)


def open_tracking(
    config: TrainConfig,
    *,
    is_main: bool,
    class_names: Sequence[str],
    environ: Mapping[str, str] | None = None,
) -> Tracking:
    """The run's trackers (rank 0 only; the run dir must be prepared). Asking for mlflow
    without it installed is an error; an mlflow that fails to start is a warning."""
    if not is_main:
        return Tracking()
    env = os.environ if environ is None else environ
    names = tracking_backends(config.tracking, env)
    run_dir = Path(config.out_dir)
    backends: list[Tracker] = []
    if "tensorboard" in names:
        backends.append(TensorBoardTracker(run_dir, class_names))
    if "mlflow" in names:
        try:
            import mlflow  # noqa: F401
        except ImportError:
            message = f"--tracking mlflow needs mlflow: {MLFLOW_INSTALL}"
            if parse_tracking(config.tracking) is not None:  # asked for by name
                raise TrainingError(message) from None
            logger.warning("MLFLOW_TRACKING_URI is set but %s; no MLflow tracking", message)
        else:
            try:
                backends.append(MlflowTracker(config, class_names, env))
            except Exception as exc:
                _warn_off("MlflowTracker", exc)
    return Tracking(backends)


class TensorBoardTracker:
    """Event files in RUN_DIR/tensorboard/."""

    def __init__(self, run_dir: Path, class_names: Sequence[str]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.class_names = class_names
        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR))

    def log_step(self, progress: StepProgress) -> None:
        self.writer.add_scalar("loss/train_step", progress.loss, progress.global_step)

    def log_epoch(self, record: EpochRecord) -> None:
        for name, value in epoch_scalars(record, self.class_names).items():
            self.writer.add_scalar(name, value, record.epoch)
        self.writer.flush()

    def finish(self, *, failed: bool) -> None:
        self.writer.close()


class MlflowTracker:
    """One MLflow run per run dir: started (or continued) here, ended by `finish`."""

    def __init__(
        self, config: TrainConfig, class_names: Sequence[str], environ: Mapping[str, str]
    ) -> None:
        import mlflow

        for key, value in _MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        self.mlflow = mlflow
        self.class_names = class_names
        self.run_dir = Path(config.out_dir)
        run_id = environ.get("MLFLOW_RUN_ID") or _stored_run_id(self.run_dir)
        name = None if run_id else self.run_dir.resolve().name
        run = mlflow.start_run(run_id=run_id, run_name=name)
        self.run_id = run.info.run_id
        write_json_atomic(
            self.run_dir / MLFLOW_FILE,
            {"run_id": self.run_id, "experiment_id": run.info.experiment_id},
        )
        logged = run.data.params  # a continued run: MLflow refuses to change a param
        params = {k: v for k, v in _params(config).items() if k not in logged}
        if params:
            mlflow.log_params(params)
        logger.info("tracking: MLflow run %s at %s", self.run_id, mlflow.get_tracking_uri())

    def log_step(self, progress: StepProgress) -> None:
        self.mlflow.log_metric("loss/train_step", progress.loss, step=progress.global_step)

    def log_epoch(self, record: EpochRecord) -> None:
        self.mlflow.log_metrics(epoch_scalars(record, self.class_names), step=record.epoch)

    def finish(self, *, failed: bool) -> None:
        try:
            if not failed:
                for name in (MODEL_FILE, METRICS_FILE):
                    if (self.run_dir / name).exists():
                        self.mlflow.log_artifact(str(self.run_dir / name))
        finally:
            self.mlflow.end_run(status="FAILED" if failed else "FINISHED")


def _stored_run_id(run_dir: Path) -> str | None:
    """The MLflow run of an earlier start of this run dir (a resume), if any."""
    path = run_dir / MLFLOW_FILE
    if not path.exists():
        return None
    run_id = json.loads(path.read_text()).get("run_id")
    return str(run_id) if run_id else None


def _params(config: TrainConfig) -> dict[str, str]:
    """MLflow params (strings) of the run config; nested values as JSON."""
    return {
        key: json.dumps(value) if isinstance(value, dict | list) else str(value)
        for key, value in config.to_json().items()
    }
