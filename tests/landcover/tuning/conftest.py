"""Fixtures of the tuning tests."""

from __future__ import annotations

import pytest

from landcover.training import TrainConfig
from tests.landcover.tuning.stand_in_worker import replace_trainer


@pytest.fixture()
def stand_in_trainer(monkeypatch: pytest.MonkeyPatch) -> list[TrainConfig]:
    """`landcover.training.train` replaced by the stand-in that writes a run's metrics without
    training (`replace_trainer`); the list collects every config it was given."""
    return replace_trainer(monkeypatch)
