"""The search space of `landcover tune`: `--space` parsed, checked and written back.

`lr=1e-4:1e-2:log,loss=ce|ce+dice,model=small_unet|unet_resnet18` is a comma-separated list
of `name=...` items, each a `TrainConfig` field:

- `name=low:high` a number range, uniform; `:log` samples it on a log scale. Integers when both
  bounds are written as integers (`batch_size=8:32`), floats otherwise; an integer field takes
  integer bounds only.
- `name=a|b|c` a choice, each value converted to the field's kind (`augment=true|false`).
  A text option's value is always a choice, colons and all (`model=smp:Unet:resnet34`).

The options that `landcover tune` sets itself (the store, run dir, epochs, seed, resume and
overwrite) and the storage options are not tunable. The values are checked by `TrainConfig`
itself: every bound and every choice must make a valid configuration, so a trial never fails on
a value the space allowed. Optuna-free: the space is parsed and checked before optuna loads.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from landcover.cliconfig import OptionSpec
from landcover.errors import TrainingError, TuneError
from landcover.training.config import OPTIONS, TrainConfig

__all__ = [
    "NOT_TUNABLE",
    "Choice",
    "NumberRange",
    "Parameter",
    "SearchSpace",
    "parameter_values",
    "parse_space",
]

# set by `landcover tune` itself, or never on a worker's command line (storage options)
NOT_TUNABLE = ("store_url", "out_dir", "epochs", "seed", "resume", "overwrite", "storage_options")

_EXAMPLE = "e.g. lr=1e-4:1e-2:log,loss=ce|ce+dice"


@dataclass(frozen=True, slots=True)
class NumberRange:
    """`name=low:high[:log]`: integers when `integer`, floats otherwise."""

    name: str
    low: float
    high: float
    log: bool
    integer: bool

    @property
    def bounds(self) -> tuple[Any, ...]:
        return (int(self.low), int(self.high)) if self.integer else (self.low, self.high)

    def __str__(self) -> str:
        low, high = (_number_text(v) for v in self.bounds)
        return f"{self.name}={low}:{high}" + (":log" if self.log else "")


@dataclass(frozen=True, slots=True)
class Choice:
    """`name=a|b|c`: the values, converted to the field's kind."""

    name: str
    values: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.name}=" + "|".join(_value_text(v) for v in self.values)


Parameter = NumberRange | Choice


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """The parameters of a search, in the order given."""

    parameters: tuple[Parameter, ...]

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self.parameters)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    def __str__(self) -> str:
        """The canonical `--space` text (the study's identity: a rerun must give the same)."""
        return ",".join(str(p) for p in self.parameters)

    def check(self, base: TrainConfig) -> None:
        """Every bound and every choice, set on `base`, must be a valid TrainConfig, and so
        must every pair of them from two parameters (TrainConfig's rules tie two options at
        most, e.g. --block-momentum and --compression); TuneError naming the items."""
        for parameter in self.parameters:
            for value in parameter_values(parameter):
                try:
                    replace(base, **{parameter.name: value})
                except TrainingError as exc:
                    raise TuneError(f"--space {parameter}: {exc}") from None
        for first, second in itertools.combinations(self.parameters, 2):
            for a, b in itertools.product(parameter_values(first), parameter_values(second)):
                try:
                    replace(base, **{first.name: a, second.name: b})
                except TrainingError as exc:
                    raise TuneError(
                        f"--space {first},{second}: {first.name}={_value_text(a)} with "
                        f"{second.name}={_value_text(b)}: {exc}"
                    ) from None


def parameter_values(parameter: Parameter) -> tuple[Any, ...]:
    """The values that stand for a parameter in checks: a range's bounds, a choice's values."""
    return parameter.bounds if isinstance(parameter, NumberRange) else parameter.values


def parse_space(text: str) -> SearchSpace:
    """`--space` text as a SearchSpace; TuneError (one line) naming the bad item and the fix."""
    options = {o.name: o for o in OPTIONS if o.name not in NOT_TUNABLE}
    parameters: list[Parameter] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not name or not value:
            raise TuneError(
                f"--space item {item!r}: write name=low:high[:log] or name=a|b ({_EXAMPLE})"
            )
        option = options.get(name)
        if option is None:
            raise TuneError(
                f"--space {item!r}: {name!r} is not a tunable training option; use one of "
                + ", ".join(options)
            )
        if name in (p.name for p in parameters):
            raise TuneError(f"--space names {name!r} twice; keep one item per option")
        parameters.append(_parse_item(item, option, value))
    if not parameters:
        raise TuneError(f"--space is empty; give the options to search, {_EXAMPLE}")
    return SearchSpace(tuple(parameters))


def _parse_item(item: str, option: OptionSpec, value: str) -> Parameter:
    # free text (a model name such as smp:Unet:resnet34, a compression powersgd:4) is never a
    # range; a typed value's text is parsed by TrainConfig
    free_text = (option.kind is str or option.text_value) and option.choices is None
    if "|" in value or ":" not in value or free_text:
        values = tuple(_convert(item, option, v.strip()) for v in value.split("|"))
        if len(set(values)) != len(values):
            raise TuneError(f"--space {item!r}: a choice is given twice; list each value once")
        return Choice(option.name, values)
    if option.kind not in (int, float):
        choices = "|".join(option.choices or ("a", "b"))
        raise TuneError(
            f"--space {item!r}: {option.name} is not a number; list its choices "
            f"({option.name}={choices})"
        )
    parts = value.split(":")
    log = len(parts) == 3 and parts[2] == "log"
    if len(parts) not in (2, 3) or (len(parts) == 3 and not log):
        raise TuneError(f"--space {item!r}: a range is low:high or low:high:log")
    integer = all(_is_int_text(p) for p in parts[:2])
    if option.kind is int and not integer:
        raise TuneError(f"--space {item!r}: {option.name} takes whole numbers; write e.g. 8:32")
    try:
        low, high = float(parts[0]), float(parts[1])
    except ValueError:
        raise TuneError(f"--space {item!r}: the bounds must be numbers ({_EXAMPLE})") from None
    if not low < high:
        raise TuneError(f"--space {item!r}: the low bound must be below the high bound")
    if log and low <= 0:
        raise TuneError(f"--space {item!r}: a log range needs a low bound > 0")
    return NumberRange(option.name, low, high, log=log, integer=integer)


def _convert(item: str, option: OptionSpec, text: str) -> Any:
    """One choice as the field's kind: str (a Literal's choices checked by TrainConfig), int,
    float or bool (true/false)."""
    if option.optional and text.lower() == "none":
        return None
    if option.kind is bool:
        words = {"true": True, "false": False}
        if text.lower() not in words:
            raise TuneError(f"--space {item!r}: {option.name} is true or false, not {text!r}")
        return words[text.lower()]
    if option.kind in (int, float):
        try:
            return option.kind(text)
        except ValueError:
            kind = "whole number" if option.kind is int else "number"
            raise TuneError(f"--space {item!r}: {text!r} is not a {kind}") from None
    if not text:
        raise TuneError(f"--space {item!r}: an empty choice; list values like a|b")
    return text


def _is_int_text(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _number_text(value: float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _value_text(value: Any) -> str:
    return str(value).lower() if value is None or isinstance(value, bool) else str(value)
