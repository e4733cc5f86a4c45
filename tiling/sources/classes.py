"""Land-cover class tables and the remaps from source label codes onto them.

Every class table used for training has code 0 = nodata (ignored by the loss and the
metrics) and classes 1..K-1. A `ClassMap` turns raw label codes (Chesapeake 1 m, NLCD, ...)
into those codes through a 256-entry lookup table; raw values the map does not know are an
error, never silently folded into a class.

This lives in `tiling` (not `landcover`) because the tile command applies the remap while
writing the store, and `tiling` must not import `landcover`; `landcover` re-uses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tiling.errors import LabelError

NODATA_CODE = 0
UNMAPPED = -1


@dataclass(frozen=True, slots=True)
class ClassInfo:
    """One output class: its code (index into the model's logits), name and display colour."""

    code: int
    name: str
    color: tuple[int, int, int]

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "name": self.name, "color": list(self.color)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ClassInfo:
        r, g, b = (int(c) for c in obj["color"])
        return cls(code=int(obj["code"]), name=str(obj["name"]), color=(r, g, b))


@dataclass(frozen=True, slots=True)
class ClassMap:
    """A named remap from raw label values to a class table whose code 0 is nodata."""

    name: str
    classes: tuple[ClassInfo, ...]
    raw_to_code: Mapping[int, int]
    lut: npt.NDArray[np.int16] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        codes = [c.code for c in self.classes]
        if codes != list(range(len(codes))) or self.classes[0].code != NODATA_CODE:
            raise ValueError(f"class table {self.name!r} must have codes 0..K-1 with 0 = nodata")
        lut = np.full(256, UNMAPPED, dtype=np.int16)
        for raw, code in self.raw_to_code.items():
            if not 0 <= code < len(codes):
                raise ValueError(f"class map {self.name!r} sends {raw} to unknown code {code}")
            lut[raw] = code
        object.__setattr__(self, "lut", lut)

    @property
    def num_classes(self) -> int:
        """Number of output codes including nodata (the model's output channels)."""
        return len(self.classes)

    @property
    def class_names(self) -> list[str]:
        return [c.name for c in self.classes]

    def apply(
        self, raw: npt.NDArray[np.integer[Any]], *, nodata: int | None = None, where: str = ""
    ) -> npt.NDArray[np.uint8]:
        """Remap raw label values; the raster's own nodata value becomes code 0.

        Raises `LabelError` naming the unknown values and the `--class-map` fix.
        """
        values = raw.astype(np.int64, copy=False)
        if values.size and (values.min() < 0 or values.max() > 255):
            raise LabelError(
                f"{where or 'labels'}: label values must be 0..255, "
                f"found {int(values.min())}..{int(values.max())}"
            )
        codes = self.lut[values]
        if nodata is not None and 0 <= nodata <= 255:
            codes[values == nodata] = NODATA_CODE
        bad = codes == UNMAPPED
        if bad.any():
            unknown = sorted({int(v) for v in np.unique(values[bad])})[:8]
            raise LabelError(
                f"{where or 'labels'}: label values {unknown} are not in class map "
                f"{self.name!r}; choose another --class-map ({', '.join(available_class_maps())})"
            )
        return codes.astype(np.uint8)

    def to_json(self) -> dict[str, Any]:
        """The class table as stored in chip-store attrs and model files."""
        return {
            "name": self.name,
            "classes": [c.to_json() for c in self.classes],
            "raw_to_code": {str(k): v for k, v in sorted(self.raw_to_code.items())},
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ClassMap:
        return cls(
            name=str(obj["name"]),
            classes=tuple(ClassInfo.from_json(c) for c in obj["classes"]),
            raw_to_code={int(k): int(v) for k, v in obj["raw_to_code"].items()},
        )


def _table(rows: Sequence[tuple[str, tuple[int, int, int]]]) -> tuple[ClassInfo, ...]:
    return tuple(ClassInfo(code, name, color) for code, (name, color) in enumerate(rows))


NODATA_COLOR = (0, 0, 0)

# The 5-class scheme of the Azure land-cover tutorial.
FIVE_CLASSES = _table(
    [
        ("nodata", NODATA_COLOR),
        ("water", (0, 92, 230)),
        ("tree canopy", (38, 115, 0)),
        ("low vegetation", (163, 255, 115)),
        ("barren / impervious", (156, 156, 156)),
    ]
)

# Chesapeake Conservancy 1 m land cover, 6 classes + nodata (raw 15).
CHESAPEAKE_CLASSES = _table(
    [
        ("nodata", NODATA_COLOR),
        ("water", (0, 92, 230)),
        ("tree canopy", (38, 115, 0)),
        ("low vegetation", (163, 255, 115)),
        ("barren", (255, 170, 0)),
        ("impervious (other)", (156, 156, 156)),
        ("impervious (roads)", (78, 78, 78)),
    ]
)

CHESAPEAKE_NODATA_RAW = 15

_CHESAPEAKE7TO5 = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 4, 6: 4, CHESAPEAKE_NODATA_RAW: 0}
_CHESAPEAKE7 = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, CHESAPEAKE_NODATA_RAW: 0}
# NLCD Anderson level II codes onto the 5-class scheme. Developed, open space (21) is under
# 20 % impervious by NLCD's own definition: at 1 m it is lawn, parks and scattered trees, so
# it is low vegetation, not impervious (calling it impervious teaches grass = pavement).
_NLCD = {
    0: 0,
    11: 1,  # open water
    12: 4,  # perennial ice/snow
    21: 3,  # developed, open space
    22: 4,
    23: 4,
    24: 4,  # developed
    31: 4,  # barren
    41: 2,
    42: 2,
    43: 2,  # forest
    51: 3,
    52: 3,  # shrub
    71: 3,
    72: 3,
    73: 3,
    74: 3,  # herbaceous
    81: 3,
    82: 3,  # pasture, crops
    90: 2,  # woody wetlands
    95: 3,  # emergent herbaceous wetlands
    250: 0,  # NLCD fill
}

_CLASS_MAPS: dict[str, ClassMap] = {
    "chesapeake7to5": ClassMap("chesapeake7to5", FIVE_CLASSES, _CHESAPEAKE7TO5),
    "chesapeake7": ClassMap("chesapeake7", CHESAPEAKE_CLASSES, _CHESAPEAKE7),
    "nlcd": ClassMap("nlcd", FIVE_CLASSES, _NLCD),
}

IDENTITY = "identity"
DEFAULT_CLASS_MAP = "chesapeake7to5"


def identity_class_map(num_classes: int) -> ClassMap:
    """Labels that already are codes 0..num_classes-1 with 0 = nodata."""
    if not 2 <= num_classes <= 256:
        raise LabelError(f"identity class map needs 2..256 classes, got {num_classes}")
    rows = [("nodata", NODATA_COLOR)] + [
        (f"class {k}", _palette_color(k)) for k in range(1, num_classes)
    ]
    return ClassMap(IDENTITY, _table(rows), {k: k for k in range(num_classes)})


def _palette_color(k: int) -> tuple[int, int, int]:
    # A fixed, well-spread palette (golden-ratio hue steps) for unnamed classes.
    import colorsys

    r, g, b = colorsys.hsv_to_rgb((k * 0.618033988749895) % 1.0, 0.65, 0.9)
    return (round(r * 255), round(g * 255), round(b * 255))


def available_class_maps() -> list[str]:
    """Names accepted by `--class-map`."""
    return [*sorted(_CLASS_MAPS), IDENTITY]


def get_class_map(name: str, *, num_classes: int = 256) -> ClassMap:
    """The class map called `name`; `identity` takes `num_classes` (including nodata)."""
    if name == IDENTITY:
        return identity_class_map(num_classes)
    try:
        return _CLASS_MAPS[name]
    except KeyError:
        raise LabelError(
            f"unknown class map {name!r}; choose one of {', '.join(available_class_maps())}"
        ) from None
