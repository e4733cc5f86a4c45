"""Live progress of a training run, shown by rank 0 alone.

On a terminal (stderr is a tty) a progress bar per epoch (steps, with the epoch's mean loss and
samples/s so far in its postfix); without one (a cluster job, `landcover scale`, the demo) a
log line every `--log-every` steps. Either way one log line per epoch (`epoch_line`: epoch,
train and val loss, val mIoU, accuracy, epoch time, throughput), which launchers pick out of a
worker's output with `progress_message`. Every `--log-every` step and every epoch also go to
the run's trackers (`landcover.training.tracking`).

Reading the loss waits for the device, so it is read only at a reported step or, for the bar,
at most every `BAR_REFRESH_S`.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, SupportsFloat, TypeVar

from landcover.training.records import EpochRecord
from landcover.training.tracking import StepProgress, Tracker

__all__ = ["EpochProgress", "Progress", "epoch_line", "progress_message"]

logger = logging.getLogger(__name__)

BAR_REFRESH_S = 1.0
# the worker's log format ends "<logger name>: <message>" (landcover.cli.train.worker_command)
_LINE = re.compile(re.escape(__name__) + r": (?P<message>epoch \d+/\d+(?P<step> step)?.*)$")

B = TypeVar("B")


def epoch_line(record: EpochRecord, epochs: int) -> str:
    """The one line an epoch ends with."""
    step_time_s = record.epoch_time_s / record.steps
    data_share = 100 * (record.data_time_s or 0.0) / max(step_time_s, 1e-12)
    return (
        f"epoch {record.epoch}/{epochs}: train loss {_num(record.train_loss)}, val loss "
        f"{_num(record.val_loss)}, val mIoU {_num(record.val_miou)}, accuracy "
        f"{_num(record.val_accuracy)}; {record.epoch_time_s:.2f} s ({record.steps} steps, "
        f"{step_time_s:.3f} s/step, data {data_share:.2f}%), "
        f"{record.samples_trained_per_s:.0f} samples/s"
    )


def _num(value: float | None) -> str:
    return "nan" if value is None else f"{value:.4f}"


def progress_message(line: str, *, epochs_only: bool = True) -> str | None:
    """The progress message in a line of a worker's log (its epoch lines; with
    `epochs_only=False` its step lines too), else None."""
    match = _LINE.search(line)
    if match is None or (epochs_only and match.group("step")):
        return None
    return match.group("message")


class Progress:
    """A run's progress: bars or step lines, epoch lines, and the trackers."""

    def __init__(
        self,
        tracker: Tracker,
        *,
        is_main: bool,
        epochs: int,
        batch_size: int,
        world_size: int,
        log_every: int,
        terminal: bool | None = None,
    ) -> None:
        self.tracker = tracker
        self.is_main = is_main
        self.epochs = epochs
        self.samples_per_step = batch_size * world_size
        self.log_every = log_every
        self.terminal = sys.stderr.isatty() if terminal is None else terminal

    def epoch(self, epoch: int, steps: int) -> EpochProgress:
        return EpochProgress(self, epoch, steps)

    def epoch_end(self, record: EpochRecord) -> None:
        if self.is_main:
            logger.info("%s", epoch_line(record, self.epochs))
            self.tracker.log_epoch(record)

    def finish(self, *, failed: bool) -> None:
        self.tracker.finish(failed=failed)


class EpochProgress:
    """One epoch's steps: `wrap` the batches, call `step` after each optimizer step."""

    def __init__(self, run: Progress, epoch: int, steps: int) -> None:
        self.run = run
        self.epoch = epoch
        self.steps = steps
        self.bar: Any = None  # a tqdm bar on rank 0 at a terminal
        self.started = time.perf_counter()
        self.last_refresh = self.started
        self.reported_steps, self.reported_loss = 0, 0.0

    def wrap(self, batches: Iterable[B]) -> Iterator[B]:
        self.started = self.last_refresh = time.perf_counter()
        if not (self.run.is_main and self.run.terminal):
            return iter(batches)
        from tqdm.auto import tqdm

        bar = tqdm(
            batches,
            desc=f"epoch {self.epoch}/{self.run.epochs}",
            total=self.steps,
            unit="step",
            leave=False,
        )
        self.bar = bar
        return iter(bar)

    def step(self, step: int, loss_sum: SupportsFloat, lr: float) -> None:
        """After step `step` (0-based) of the epoch; `loss_sum`: rank 0's losses so far."""
        run, done = self.run, step + 1
        if not run.is_main:
            return
        now = time.perf_counter()
        if self.bar is not None and now - self.last_refresh >= BAR_REFRESH_S:
            self.last_refresh = now
            mean = float(loss_sum) / done
            rate = done * run.samples_per_step / max(now - self.started, 1e-9)
            self.bar.set_postfix(loss=f"{mean:.4f}", samples_s=f"{rate:.0f}")
        if run.log_every <= 0 or done % run.log_every:
            return
        total = float(loss_sum)
        progress = StepProgress(
            epoch=self.epoch,
            step=done,
            steps=self.steps,
            global_step=(self.epoch - 1) * self.steps + done,
            loss=(total - self.reported_loss) / (done - self.reported_steps),
            samples_per_s=done * run.samples_per_step / max(now - self.started, 1e-9),
            lr=lr,
        )
        self.reported_steps, self.reported_loss = done, total
        if self.bar is None:  # the bar shows the same on a terminal
            logger.info(
                "epoch %d/%d step %d/%d: loss %.4f, %.0f samples/s, lr %.3g",
                self.epoch,
                run.epochs,
                done,
                self.steps,
                progress.loss,
                progress.samples_per_s,
                lr,
            )
        run.tracker.log_step(progress)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
