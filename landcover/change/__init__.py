"""Change between two land-cover maps of one region and class table: from-to codes and the
change map's class table, the transition matrix in km² with each class's gains, losses and
net change, and the change record (`landcover.change.transitions`); the streamed comparison
that writes the change COG and its reports (`landcover.change.changemap`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.change.changemap import (
        CHANGE_FILES,
        CHANGE_REPORTS,
        MOSAIC,
        ChangeConfig,
        check_change_target,
        check_grids,
        run_change,
    )
    from landcover.change.transitions import (
        CHANGE_MAP,
        CHANGE_RECORD,
        Transitions,
        change_class_map,
        change_codes,
        read_change_record,
        transition_name,
        transitions_png,
    )

__all__ = [
    "CHANGE_FILES",
    "CHANGE_MAP",
    "CHANGE_RECORD",
    "CHANGE_REPORTS",
    "MOSAIC",
    "ChangeConfig",
    "Transitions",
    "change_class_map",
    "change_codes",
    "check_change_target",
    "check_grids",
    "read_change_record",
    "run_change",
    "transition_name",
    "transitions_png",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CHANGE_FILES": "changemap",
        "CHANGE_REPORTS": "changemap",
        "MOSAIC": "changemap",
        "ChangeConfig": "changemap",
        "check_change_target": "changemap",
        "check_grids": "changemap",
        "run_change": "changemap",
        "CHANGE_MAP": "transitions",
        "CHANGE_RECORD": "transitions",
        "Transitions": "transitions",
        "change_class_map": "transitions",
        "change_codes": "transitions",
        "read_change_record": "transitions",
        "transition_name": "transitions",
        "transitions_png": "transitions",
    },
)
