"""The one shape of a runner of units of work, shared by the stages that hand units out
(`tiling.tiler.units`, the tiled product) and the engines that run them (`cluster.tasks`)."""

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

R = TypeVar("R")


class UnitRunner(Protocol):
    """Runs `fn(*shared, unit)` for every unit, anywhere, and returns the results in unit
    order; `shared` values are sent once, not with every unit; `what` names the units."""

    def __call__(
        self,
        fn: Callable[..., R],
        units: Sequence[Any],
        *,
        shared: Sequence[Any] = (),
        what: str = "units",
    ) -> list[R]: ...
