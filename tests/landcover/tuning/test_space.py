"""`--space` parsing: ranges, choices, the canonical text, and one-line errors for bad items."""

from __future__ import annotations

import pytest

from landcover.errors import TuneError
from landcover.training.config import TrainConfig
from landcover.tuning.space import Choice, NumberRange, parse_space

BASE = TrainConfig(store_url="chips.zarr", out_dir="tune/trial-000")


def test_ranges_and_choices_take_the_fields_kinds() -> None:
    space = parse_space(
        "lr=1e-4:1e-2:log, batch_size=8:32, warmup_epochs=0.5:2, loss=ce|ce+dice,"
        "augment=true|false,pretrained=none|imagenet,block_size=4|8"
    )
    assert space.parameters == (
        NumberRange("lr", 1e-4, 1e-2, log=True, integer=False),
        NumberRange("batch_size", 8, 32, log=False, integer=True),
        NumberRange("warmup_epochs", 0.5, 2.0, log=False, integer=False),
        Choice("loss", ("ce", "ce+dice")),
        Choice("augment", (True, False)),
        Choice("pretrained", (None, "imagenet")),
        Choice("block_size", (4, 8)),
    )
    assert str(space) == (
        "lr=0.0001:0.01:log,batch_size=8:32,warmup_epochs=0.5:2.0,loss=ce|ce+dice,"
        "augment=true|false,pretrained=none|imagenet,block_size=4|8"
    )
    assert parse_space(str(space)) == space
    space.check(BASE)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "--space is empty"),
        ("lr", "write name=low:high[:log] or name=a|b"),
        ("lr=", "write name=low:high[:log] or name=a|b"),
        ("learning_rate=1:2", "'learning_rate' is not a tunable training option; use one of "
         "model, pretrained, batch_size, lr,"),
        ("epochs=1:3", "'epochs' is not a tunable training option"),
        ("store_url=a|b", "'store_url' is not a tunable training option"),
        ("lr=1e-3:1e-2,lr=1e-4:1e-3", "names 'lr' twice"),
        ("lr=1e-2:1e-4", "the low bound must be below the high bound"),
        ("lr=0:1e-2:log", "a log range needs a low bound > 0"),
        ("lr=1e-4:1e-2:ln", "a range is low:high or low:high:log"),
        ("lr=a:b", "the bounds must be numbers"),
        ("batch_size=8.5:32", "batch_size takes whole numbers"),
        ("loss=1:2", "loss is not a number; list its choices (loss=ce|ce+dice)"),
        ("augment=yes|no", "augment is true or false, not 'yes'"),
        ("batch_size=8|x", "'x' is not a whole number"),
        ("loss=ce|ce", "a choice is given twice"),
    ],
)  # fmt: skip
def test_bad_space_is_one_line(text: str, message: str) -> None:
    with pytest.raises(TuneError) as info:
        parse_space(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("loss=ce|focal", "--space loss=ce|focal: --loss 'focal': use one of ('ce', 'ce+dice')"),
        ("lr=-1:1", "--space lr=-1:1: --lr -1 must be > 0"),
        (
            "block_momentum_value=0.5:1.5",
            "--space block_momentum_value=0.5:1.5: --block-momentum-value 1.5 must be in [0, 1)",
        ),
        ("lr=1e-4:inf:log", "--space lr=0.0001:inf:log: --lr inf must be a finite number"),
        ("warmup_epochs=0|nan", "--space warmup_epochs=0.0|nan: --warmup-epochs nan must be a "
         "finite number"),
        ("block_momentum=true|false,compression=fp16|none", "--space block_momentum=true|false,"
         "compression=fp16|none: block_momentum=true with compression=fp16: --compression fp16 "
         "compresses DDP gradients but --block-momentum averages models instead; use one of "
         "them"),
        ("sync_bn=true|false,block_momentum=false|true", "--space sync_bn=true|false,"
         "block_momentum=false|true: sync_bn=true with block_momentum=true: --sync-bn "
         "all-reduces BatchNorm statistics in every step, which --block-momentum's local steps "
         "avoid (BMUF averages them at block ends); use one of them"),
    ],
)  # fmt: skip
def test_values_are_checked_by_train_config(text: str, message: str) -> None:
    with pytest.raises(TuneError) as info:
        parse_space(text).check(BASE)
    assert str(info.value) == message
