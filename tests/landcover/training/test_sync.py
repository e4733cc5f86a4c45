"""build_sync: the synchronisation a run gets, and what it says about options with nothing to
do."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from landcover.training.config import TrainConfig
from landcover.training.distributed import Collectives
from landcover.training.sync import build_sync
from tiling.runtime.rankenv import DistEnv

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        ({"compression": "NONE"}, False),  # the parser's case-insensitive none: nothing to say
        ({"compression": "none"}, False),
        ({"compression": "fp16"}, True),
        ({"block_momentum": True}, True),
    ],
)
def test_one_worker_warns_only_about_options_with_nothing_to_do(
    caplog: pytest.LogCaptureFixture, options: dict[str, object], warned: bool
) -> None:
    config = TrainConfig("s", "r", **options)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="landcover.training.sync"):
        sync, _ = build_sync(
            nn.Linear(2, 2), config, Collectives(DistEnv(), CPU), CPU, own={}, shared=None
        )
    said = any("have nothing to do" in r.getMessage() for r in caplog.records)
    assert said is warned
    assert sync.meter is None and sync.compression == str(config.compression)
