"""Experiment tracking: which backends a run gets, TensorBoard events and an MLflow run (a local
file store) read back with their own readers, resume into the same MLflow run, and tracking
failures that never stop training."""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from landcover.errors import TrainingError
from landcover.training import TrainConfig, read_metrics, train
from landcover.training.records import EpochRecord
from landcover.training.tracking import (
    MLFLOW_INSTALL,
    StepProgress,
    Tracking,
    epoch_scalars,
    open_tracking,
    tracking_backends,
)
from tests.multiprocess import free_ports
from tests.support.trainruns import make_config

CLASSES = ["nodata", "water", "tree canopy", "low vegetation", "built (impervious)"]


@pytest.fixture(autouse=True)
def no_mlflow_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No MLflow unless a test asks; what the tracker sets in os.environ is undone after."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME",
                 "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """MLFLOW_TRACKING_URI of a local file store, as Azure ML would set a server's."""
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 prefers a database
    return uri


def record(epoch: int, **values: Any) -> EpochRecord:
    fields: dict[str, Any] = {
        "epoch": epoch, "world_size": 1, "epoch_time_s": 2.0, "load_time_s": 0.1,
        "train_loss": 0.5, "val_loss": 0.6, "val_miou": 0.4, "val_accuracy": 0.8,
        "per_class_iou": [None, 0.5, 0.25, math.nan, 0.1], "samples_per_s": 40.0, "steps": 10,
        "comm_bytes_per_step": 0.0, "compression": "none", "block_momentum": False,
        "batch_size": 8, "device": "cpu: test", "lr": 1e-3,
    }  # fmt: skip
    fields.update(values)
    return EpochRecord(**fields)


# -- which backends ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "uri", "expected"),
    [
        ("auto", None, ("tensorboard",)),
        # Azure ML sets MLFLOW_TRACKING_URI in every job: its jobs log to MLflow unasked
        ("auto", "azureml://eastus.api.azureml.ms/mlflow/v1.0/x", ("tensorboard", "mlflow")),
        ("none", "file:/tmp/mlruns", ()),
        ("mlflow", None, ("mlflow",)),
        ("tensorboard", "file:/tmp/mlruns", ("tensorboard",)),
        (" MLflow, tensorboard,mlflow", None, ("mlflow", "tensorboard")),
    ],
)  # fmt: skip
def test_the_backends_of_a_tracking_value(
    value: str, uri: str | None, expected: tuple[str, ...]
) -> None:
    environ = {} if uri is None else {"MLFLOW_TRACKING_URI": uri}
    assert tracking_backends(value, environ) == expected


def test_a_bad_tracking_value_is_one_line() -> None:
    with pytest.raises(TrainingError) as caught:
        TrainConfig(store_url="s", out_dir="r", tracking="tensorboard,wandb")
    assert str(caught.value) == (
        "--tracking 'tensorboard,wandb': 'wandb' is no tracking backend; use auto, none or a "
        "comma list of tensorboard, mlflow"
    )
    argv = TrainConfig(store_url="s", out_dir="r", tracking="none", log_every=5).to_argv()
    assert argv == ["s", "--out", "r", "--tracking", "none", "--log-every", "5"]
    assert TrainConfig.from_argv(argv).tracking == "none"


def test_mlflow_asked_for_and_missing_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError
    config = TrainConfig(store_url="s", out_dir=str(tmp_path), tracking="mlflow")
    with pytest.raises(TrainingError) as caught:
        open_tracking(config, is_main=True, class_names=CLASSES)
    assert str(caught.value) == f"--tracking mlflow needs mlflow: {MLFLOW_INSTALL}"
    # only the environment asked: a warning, and TensorBoard goes on
    auto = TrainConfig(store_url="s", out_dir=str(tmp_path))
    tracking = open_tracking(
        auto, is_main=True, class_names=CLASSES, environ={"MLFLOW_TRACKING_URI": "http://x"}
    )
    assert [type(b).__name__ for b in tracking.backends] == ["TensorBoardTracker"]
    assert MLFLOW_INSTALL in caplog.text
    tracking.finish(failed=False)
    # other ranks never track
    assert open_tracking(config, is_main=False, class_names=CLASSES).backends == []


# -- what is tracked -------------------------------------------------------------------------


def test_epoch_scalars_name_the_classes_and_leave_out_what_is_missing() -> None:
    scalars = epoch_scalars(record(3, val_loss=math.nan), CLASSES)
    assert scalars == {
        "loss/train": 0.5,
        "val/miou": 0.4,
        "val/accuracy": 0.8,
        "train/lr": 1e-3,
        "perf/samples_per_s": 40.0,
        "perf/comm_bytes_per_step": 0.0,
        "perf/epoch_time_s": 2.0,
        "val/iou/water": 0.5,
        "val/iou/tree canopy": 0.25,
        "val/iou/built _impervious_": 0.1,
    }


class Broken:
    def __init__(self) -> None:
        self.calls = 0

    def log_step(self, progress: StepProgress) -> None:
        self.calls += 1
        raise ConnectionError("server unreachable")

    def log_epoch(self, record: EpochRecord) -> None:
        self.calls += 1

    def finish(self, *, failed: bool) -> None:
        self.calls += 1


class Kept(Broken):
    def log_step(self, progress: StepProgress) -> None:
        self.calls += 1


def test_a_failing_backend_warns_once_and_is_turned_off(caplog: pytest.LogCaptureFixture) -> None:
    broken, kept = Broken(), Kept()
    tracking = Tracking([broken, kept])
    step = StepProgress(1, 5, 10, 5, 0.5, 40.0, 1e-3)
    for _ in range(3):
        tracking.log_step(step)
    tracking.log_epoch(record(1))
    tracking.finish(failed=False)
    assert (broken.calls, kept.calls) == (1, 5)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "tracking: Broken failed (ConnectionError: server unreachable); training goes on without it"
    ]


# -- with the trainer --------------------------------------------------------------------------


def tensorboard_scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_events_hold_every_epoch_by_default(tiny_store: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(make_config(tiny_store, run, log_every=3))
    metrics = read_metrics(run)
    miou = tensorboard_scalars(run, "val/miou")
    assert miou == [(m["epoch"], pytest.approx(m["val_miou"])) for m in metrics]
    for tag in ("loss/train", "loss/val", "val/accuracy", "train/lr", "perf/samples_per_s",
                "perf/comm_bytes_per_step", "perf/epoch_time_s", "val/iou/water"):  # fmt: skip
        assert [step for step, _ in tensorboard_scalars(run, tag)] == [1, 2], tag
    steps = metrics[0]["steps"]  # every 3rd step of each epoch, at its step of the run
    logged = [(epoch - 1) * steps + k for epoch in (1, 2) for k in range(3, steps + 1, 3)]
    assert [s for s, _ in tensorboard_scalars(run, "loss/train_step")] == logged
    assert not (run / "mlflow.json").exists()  # no MLFLOW_TRACKING_URI: no MLflow


def test_tracking_none_writes_only_the_run_files(tiny_store: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(make_config(tiny_store, run, epochs=1, tracking="none"))
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoints", "metrics.jsonl", "model.pt", "run.json",
    ]  # fmt: skip


def test_the_environment_alone_logs_to_mlflow_and_a_resume_continues_the_run(
    tiny_store: str, tmp_path: Path, mlflow_store: str
) -> None:
    from mlflow import MlflowClient

    run = tmp_path / "run"
    train(make_config(tiny_store, run, storage_options={"account_key": "s3cret"}))
    run_id = json.loads((run / "mlflow.json").read_text())["run_id"]
    client = MlflowClient(mlflow_store)
    logged = client.get_run(run_id)
    assert logged.info.run_name == "run" and logged.info.status == "FINISHED"
    assert logged.data.params["model"] == "small_unet" and logged.data.params["epochs"] == "2"
    assert "s3cret" not in json.dumps(logged.data.params)
    history = client.get_metric_history(run_id, "val/miou")
    metrics = read_metrics(run)
    assert [(h.step, h.value) for h in history] == [
        (m["epoch"], pytest.approx(m["val_miou"])) for m in metrics
    ]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"model.pt", "metrics.jsonl"} <= artifacts
    assert tensorboard_scalars(run, "val/miou")  # TensorBoard too

    train(make_config(tiny_store, run, epochs=3, resume=True))
    assert json.loads((run / "mlflow.json").read_text())["run_id"] == run_id
    history = client.get_metric_history(run_id, "val/miou")
    assert sorted(h.step for h in history) == [1, 2, 3]
    assert len(client.search_runs([logged.info.experiment_id])) == 1


def test_an_unreachable_mlflow_server_never_stops_training(
    tiny_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    (port,) = free_ports(1)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    run = tmp_path / "run"
    result = train(make_config(tiny_store, run, epochs=1))
    assert result.epochs_completed == 1 and (run / "model.pt").exists()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("tracking: MlflowTracker failed")
    assert tensorboard_scalars(run, "val/miou")  # the other backend goes on


def test_the_platforms_run_id_wins(
    tmp_path: Path, mlflow_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Azure ML creates the job's MLflow run and names it in MLFLOW_RUN_ID: log into that one,
    even over the run a resumed run dir remembers."""
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_store)
    platform_run = client.create_run("0").info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", platform_run)
    (tmp_path / "mlflow.json").write_text(json.dumps({"run_id": "an-earlier-run"}))
    config = TrainConfig(store_url="s", out_dir=str(tmp_path))
    tracking = open_tracking(config, is_main=True, class_names=CLASSES)
    assert [type(b).__name__ for b in tracking.backends] == ["TensorBoardTracker", "MlflowTracker"]
    tracking.log_epoch(record(1))
    tracking.finish(failed=False)
    assert json.loads((tmp_path / "mlflow.json").read_text())["run_id"] == platform_run
    assert client.get_run(platform_run).data.metrics["val/miou"] == pytest.approx(0.4)
    assert client.get_run(platform_run).data.params["model"] == "small_unet"
