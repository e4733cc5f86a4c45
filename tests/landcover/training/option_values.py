"""Another valid value of any TrainConfig option, derived from its kind, for the tests that run
over every option (a new option needs nothing here unless it is free text)."""

from __future__ import annotations

from typing import Any

from landcover.cliconfig import OptionSpec
from landcover.models.registry import available
from landcover.training.config import TrainConfig

# Values of free-text options that another valid value cannot be derived for.
OTHER_TEXT: dict[str, str] = {
    "store_url": "moved/chips.zarr",
    "out_dir": "mounted/run",
    "model": next(name for name in available() if name != TrainConfig("s", "o").model),
    "compression": "fp16",
    "pretrained": "imagenet",
    "tracking": "none",
}


def other_value(option: OptionSpec, value: Any) -> Any:
    """A valid value of `option` other than `value`."""
    if option.name in OTHER_TEXT:
        return OTHER_TEXT[option.name]
    if option.kind is dict:
        return {"account_name": "acct"}
    if option.choices is not None:
        return next(choice for choice in option.choices if choice != value)
    if option.kind is bool:
        return not value
    if option.kind is int:
        return 3 if value is None else value + 1
    if option.kind is float:
        return 0.5 if value is None else value / 4
    raise AssertionError(f"no other value of {option.name}: add one to OTHER_TEXT")
