"""The three-thread pipeline (landcover.prediction.pipeline): order, bounded memory, errors
from any stage raised once in the caller, and no thread left behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from landcover.errors import PredictionError
from landcover.prediction.pipeline import run_pipeline
from tests.landcover.prediction.inputs import pipeline_threads

ITEMS = 30


class Recorder:
    """Stages that note what they saw and how many items were alive at once."""

    def __init__(self, *, slow: str = "", fail: dict[str, int] | None = None) -> None:
        self.slow, self.fail = slow, fail or {}
        self.lock = threading.Lock()
        self.processed: list[int] = []
        self.finished: list[int] = []
        self.threads: dict[str, set[str]] = {"prepare": set(), "process": set(), "finish": set()}
        self.alive = 0  # prepared, not yet finished
        self.most_alive = 0

    def _stage(self, stage: str, item: int) -> None:
        self.threads[stage].add(threading.current_thread().name)
        if self.slow == stage:
            time.sleep(0.005)
        if self.fail.get(stage) == item:
            raise PredictionError(f"{stage} failed on item {item}")

    def prepare(self, item: int) -> int:
        self._stage("prepare", item)
        with self.lock:
            self.alive += 1
            self.most_alive = max(self.most_alive, self.alive)
        return item

    def process(self, item: int) -> int:
        self._stage("process", item)
        self.processed.append(item)
        return item * 10

    def finish(self, result: int) -> None:
        self._stage("finish", result // 10)
        self.finished.append(result // 10)
        with self.lock:
            self.alive -= 1

    def run(self, items: Any = None, **options: Any) -> None:
        items = range(ITEMS) if items is None else items
        run_pipeline(items, self.prepare, self.process, self.finish, **options)


@pytest.mark.parametrize("slow", ["prepare", "process", "finish"])
def test_every_item_goes_through_in_order_in_three_threads(slow: str) -> None:
    stages = Recorder(slow=slow)
    stages.run()
    assert stages.processed == stages.finished == list(range(ITEMS))
    assert stages.threads == {
        "prepare": {"predict-read"},
        "process": {threading.current_thread().name},
        "finish": {"predict-write"},
    }
    assert pipeline_threads() == []


@pytest.mark.parametrize("slow", ["process", "finish"])
def test_memory_is_bounded_by_the_depth_not_the_items(slow: str) -> None:
    # Whatever stage is slow, the reader never runs more than a few items ahead of the writer:
    # one in the reader's hands and `depth` queued ahead, one in process (or waiting to be
    # handed on), `depth` queued behind, one being written.
    for depth in (1, 3):
        stages = Recorder(slow=slow)
        stages.run(depth=depth)
        assert stages.most_alive <= 2 * depth + 3
    assert stages.most_alive >= 2  # the stages did overlap


def test_one_thread_mode_runs_the_same_stages_here() -> None:
    stages = Recorder()
    stages.run(threaded=False)
    assert stages.processed == stages.finished == list(range(ITEMS))
    here = threading.current_thread().name
    assert stages.threads == {"prepare": {here}, "process": {here}, "finish": {here}}


@pytest.mark.parametrize("stage", ["prepare", "process", "finish"])
@pytest.mark.parametrize("threaded", [True, False])
def test_an_error_in_any_stage_is_raised_here_and_stops_everything(
    stage: str, threaded: bool
) -> None:
    stages = Recorder(fail={stage: 7})
    with pytest.raises(PredictionError, match=f"^{stage} failed on item 7$"):
        stages.run(threaded=threaded)
    # As in one thread: the items before the failing one were finished, none after it.
    assert stages.finished == list(range(7))
    assert stages.processed[:7] == list(range(7))
    assert len(stages.processed) <= 7 + 3
    assert pipeline_threads() == []


def test_the_writers_error_comes_before_a_later_readers_error() -> None:
    # The writer fails on item 3 while the reader fails on item 5: a one-thread run would
    # have stopped at item 3.
    class SlowWriter(Recorder):
        def finish(self, result: int) -> None:
            time.sleep(0.05)
            super().finish(result)

    stages = SlowWriter(fail={"finish": 3, "prepare": 5})
    with pytest.raises(PredictionError, match=r"^finish failed on item 3$"):
        stages.run()
    assert pipeline_threads() == []


def test_an_error_while_listing_the_items_is_raised_here() -> None:
    def items() -> Iterator[int]:
        yield 0
        yield 1
        raise PredictionError("the schedule broke")

    stages = Recorder()
    with pytest.raises(PredictionError, match=r"^the schedule broke$"):
        stages.run(items())
    assert stages.finished == [0, 1]
    assert pipeline_threads() == []


def test_an_interrupt_stops_the_threads_and_goes_on_up() -> None:
    # Ctrl-C (or the CLI's SIGTERM handler) raises in the calling thread, here in `process`.
    class Interrupted(Recorder):
        def process(self, item: int) -> int:
            if item == 4:
                raise KeyboardInterrupt
            return super().process(item)

    stages = Interrupted(slow="prepare")
    with pytest.raises(KeyboardInterrupt):
        stages.run()
    assert stages.finished == [0, 1, 2, 3]
    assert pipeline_threads() == []
