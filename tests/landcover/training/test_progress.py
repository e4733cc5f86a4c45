"""Live progress: the epoch line, step lines every --log-every steps without a terminal, the bar
on one, rank 0 alone, and the epoch lines reaching a sweep's caller from real workers."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from landcover.scaling.sweep import SweepConfig, run_sweep
from landcover.training import progress as progress_module
from landcover.training import train
from landcover.training.progress import Progress, epoch_line, progress_message
from landcover.training.records import EpochRecord
from landcover.training.tracking import StepProgress
from tests.support.trainruns import make_config

WORKER_FORMAT = "%(asctime)s rank 0 %(levelname)s %(name)s: %(message)s"  # the worker's


def record(epoch: int) -> EpochRecord:
    return EpochRecord(
        epoch=epoch, world_size=2, epoch_time_s=4.0, load_time_s=0.5, train_loss=0.61234,
        val_loss=math.nan, val_miou=0.4321, val_accuracy=0.8765, samples_per_s=32.0, steps=8,
        data_time_s=0.05, comm_bytes_per_step=0.0, compression="none", block_momentum=False,
        batch_size=8, device="cpu: test",
    )  # fmt: skip


class Recorder:
    """A tracker that keeps what it is told."""

    def __init__(self) -> None:
        self.steps: list[StepProgress] = []
        self.epochs: list[int] = []
        self.finished: list[bool] = []

    def log_step(self, progress: StepProgress) -> None:
        self.steps.append(progress)

    def log_epoch(self, record: EpochRecord) -> None:
        self.epochs.append(record.epoch)

    def finish(self, *, failed: bool) -> None:
        self.finished.append(failed)


def progress(tracker: Recorder, *, terminal: bool, is_main: bool = True) -> Progress:
    return Progress(
        tracker, is_main=is_main, epochs=3, batch_size=4, world_size=2, log_every=4,
        terminal=terminal,
    )  # fmt: skip


def run_epoch(run: Progress, losses: list[float]) -> None:
    epoch = run.epoch(2, len(losses))
    total = 0.0
    for step, loss in enumerate(epoch.wrap(losses)):
        total += loss
        epoch.step(step, total, 1e-3)
    epoch.close()


def test_the_epoch_line() -> None:
    assert epoch_line(record(2), 3) == (
        "epoch 2/3: train loss 0.6123, val loss nan, val mIoU 0.4321, accuracy 0.8765; 4.00 s "
        "(8 steps, 0.500 s/step, data 10.00%), 32 samples/s"
    )


def test_epoch_lines_are_picked_out_of_worker_output() -> None:
    formatter = logging.Formatter(WORKER_FORMAT)

    def line(message: str, name: str = progress_module.__name__) -> str:
        return formatter.format(logging.makeLogRecord({"name": name, "msg": message}))

    epoch = epoch_line(record(2), 3)
    assert progress_message(line(epoch)) == epoch
    assert progress_message("node 1: " + line(epoch)) == epoch
    step = "epoch 2/3 step 4/8: loss 0.5000, 10 samples/s, lr 0.001"
    assert progress_message(line(step)) is None
    assert progress_message(line(step), epochs_only=False) == step
    assert progress_message(line(epoch, "landcover.training.worker")) is None
    assert progress_message("Traceback (most recent call last):") is None


def test_without_a_terminal_a_line_every_log_every_steps(caplog: pytest.LogCaptureFixture) -> None:
    tracker = Recorder()
    caplog.set_level(logging.INFO, logger=progress_module.__name__)
    run_epoch(progress(tracker, terminal=False), [1.0, 2.0, 3.0, 4.0, 0.5, 0.5, 0.5, 0.5, 9.0])
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == ["epoch 2/3 step 4/9", "epoch 2/3 step 8/9"]
    # the mean loss of the steps since the previous line; global steps count on from epoch 1
    assert [(s.step, s.global_step, s.loss) for s in tracker.steps] == [(4, 13, 2.5), (8, 17, 0.5)]
    assert all(s.samples_per_s > 0 and s.lr == 1e-3 for s in tracker.steps)


def test_on_a_terminal_a_bar_and_no_step_lines(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_module, "BAR_REFRESH_S", 0.0)
    tracker = Recorder()
    run = progress(tracker, terminal=True)
    epoch = run.epoch(1, 4)
    for step, _ in enumerate(epoch.wrap(range(4))):
        epoch.step(step, 0.5 * (step + 1), 1e-3)
        assert epoch.bar.postfix.startswith("loss=0.5000, samples_s=")
    assert epoch.bar.n == 4 and epoch.bar.total == 4
    epoch.close()
    assert not [r for r in caplog.records if r.name == progress_module.__name__]
    assert [s.step for s in tracker.steps] == [4]  # the trackers still get the steps


class Unreadable:
    def __float__(self) -> float:
        raise AssertionError("a rank other than 0 read its loss (a device sync)")


def test_other_ranks_show_nothing(caplog: pytest.LogCaptureFixture) -> None:
    tracker = Recorder()
    run = progress(tracker, terminal=True, is_main=False)
    epoch = run.epoch(1, 8)
    for step, _ in enumerate(epoch.wrap(range(8))):
        epoch.step(step, Unreadable(), 1e-3)
    assert epoch.bar is None
    run.epoch_end(record(1))
    assert (tracker.steps, tracker.epochs, caplog.records) == ([], [], [])


def test_training_logs_an_epoch_line_per_epoch_and_step_lines(
    tiny_store: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=progress_module.__name__)
    train(make_config(tiny_store, tmp_path / "run", log_every=4, tracking="none"))
    lines = [r.getMessage() for r in caplog.records if r.name == progress_module.__name__]
    epochs = [line for line in lines if progress_message(f"{progress_module.__name__}: {line}")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 1/2", "epoch 2/2"]
    steps = [line.split(":")[0] for line in lines if line not in epochs]
    assert steps == ["epoch 1/2 step 4/8", "epoch 1/2 step 8/8", "epoch 2/2 step 4/8",
                     "epoch 2/2 step 8/8"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweep_caller_gets_the_workers_epoch_lines(tiny_store: str, tmp_path: Path) -> None:
    """Through the local engine (torchrun), its output filter and the sweep: one line per epoch
    of each run, nothing else."""
    got: list[tuple[int, str]] = []
    config = SweepConfig(
        store=tiny_store,
        workers=(1,),
        epochs=2,
        out_dir=str(tmp_path / "sweep"),
        extra_args=("--batch-size", "8", "--threads", "1", "--device", "cpu", "--log-every", "1"),
    )
    result = run_sweep(config, on_progress=lambda workers, line: got.append((workers, line)))
    assert not result.failed
    assert [(workers, line.split(":")[0]) for workers, line in got] == [
        (1, "epoch 1/2"),
        (1, "epoch 2/2"),
    ]
