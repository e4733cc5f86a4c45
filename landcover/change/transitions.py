"""From-to change between two maps of one class table, as numbers: the change codes (one per
ordered pair of classes), the class table of the change map, and the transition matrix in km²
with each class's gains, losses and net change (`Transitions`, the typed record of
change.json that `landcover change` writes and `landcover view` reads).

With C classes (codes 1..C, 0 = nodata), the change code of from-class `f` and to-class `t`
is `(f - 1) * C + t`: codes 1..C², 0 where either map has nodata. A uint8 change map holds
C <= 15 classes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from landcover.errors import ChangeError
from landcover.markup import markdown_text
from tiling.sources.classes import NODATA_CODE, ClassInfo, ClassMap

__all__ = [
    "CHANGE_FORMAT",
    "CHANGE_MAP",
    "CHANGE_RECORD",
    "CHANGE_VERSION",
    "MAX_CHANGE_CLASSES",
    "ChangeError",
    "Transitions",
    "change_class_map",
    "change_codes",
    "check_same_classes",
    "read_change_record",
    "transition_name",
    "transitions_png",
]

CHANGE_MAP = "change.tif"  # in the output directory of `landcover change`
CHANGE_RECORD = "change.json"
CHANGE_FORMAT = "landcover-change"
CHANGE_VERSION = 1
MAX_CHANGE_CLASSES = 15  # 15 x 15 = 225 from-to codes fit a uint8 map with 0 = nodata
ARROW = "→"


def transition_name(before: str, after: str) -> str:
    """The name of the change from class `before` to class `after` ("tree canopy→impervious");
    a class kept is "tree canopy (unchanged)"."""
    return f"{before} (unchanged)" if before == after else f"{before}{ARROW}{after}"


def change_codes(
    before: npt.NDArray[np.uint8], after: npt.NDArray[np.uint8], num_classes: int
) -> npt.NDArray[np.uint8]:
    """The change code of each pixel (module docstring); `num_classes` counts nodata."""
    c = num_classes - 1
    b = before.astype(np.int32)
    a = after.astype(np.int32)
    codes = (b - 1) * c + a
    codes[(b == NODATA_CODE) | (a == NODATA_CODE)] = NODATA_CODE
    return codes.astype(np.uint8)


def _faded(color: tuple[int, int, int]) -> tuple[int, int, int]:
    # unchanged pixels: the class's colour washed out, so change stands out over it
    r, g, b = (round(v + (255 - v) * 0.75) for v in color)
    return (r, g, b)


def change_class_map(class_map: ClassMap) -> ClassMap:
    """The class table of the change map of two maps with `class_map`: a class per ordered
    pair, coloured by the class it became (faded where nothing changed)."""
    classes = class_map.classes[1:]
    if len(classes) > MAX_CHANGE_CLASSES:
        raise ChangeError(
            f"the class table {class_map.name!r} has {len(classes)} classes; a change map holds "
            f"at most {MAX_CHANGE_CLASSES} (its from-to codes are one byte); merge classes first"
        )
    rows = [ClassInfo(NODATA_CODE, "nodata", (0, 0, 0))]
    for f in classes:
        for t in classes:
            color = _faded(t.color) if f.code == t.code else t.color
            code = (f.code - 1) * len(classes) + t.code
            rows.append(ClassInfo(code, transition_name(f.name, t.name), color))
    return ClassMap(f"change:{class_map.name}", tuple(rows), {c.code: c.code for c in rows})


@dataclass(frozen=True, slots=True)
class Transitions:
    """The from-to matrix of two maps in pixels and km² (before in rows, after in columns,
    classes 1..C in order), with the maps it compares."""

    before: str
    after: str
    class_map: ClassMap
    pixels: npt.NDArray[np.int64]  # (C, C)
    km2: npt.NDArray[np.float64]  # (C, C): area on the ellipsoid
    resampled: bool = False
    map_name: str = CHANGE_MAP  # the change map in the output directory (a tiled one's VRT)
    # every raster file of the change in the output directory (the map, a tiled one's tiles)
    files: tuple[str, ...] = ()

    @classmethod
    def from_change_counts(
        cls,
        counts: npt.NDArray[np.int64],
        *,
        before: str,
        after: str,
        class_map: ClassMap,
        area_km2: npt.NDArray[np.float64],
        resampled: bool = False,
        map_name: str = CHANGE_MAP,
        files: tuple[str, ...] = (),
    ) -> Transitions:
        """From the pixel count and the area in km² of each change code (0..C²)."""
        c = class_map.num_classes - 1
        pixels = np.asarray(counts[1 : c * c + 1], dtype=np.int64).reshape(c, c)
        km2 = np.asarray(area_km2[1 : c * c + 1], dtype=np.float64).reshape(c, c)
        return cls(before, after, class_map, pixels, km2, resampled, map_name, files)

    @property
    def pixel_km2(self) -> float:
        """The mean area of a compared pixel in km²."""
        return float(self.km2.sum() / max(int(self.pixels.sum()), 1))

    @property
    def names(self) -> list[str]:
        return self.class_map.class_names[1:]

    def per_class(self) -> list[dict[str, Any]]:
        """Each class's area before and after, gain (from other classes), loss (to other
        classes) and net change, in km²."""
        km2 = self.km2
        kept = np.diag(km2)
        rows = []
        for i, info in enumerate(self.class_map.classes[1:]):
            gain = float(km2[:, i].sum() - kept[i])
            loss = float(km2[i, :].sum() - kept[i])
            rows.append(
                {
                    "code": info.code,
                    "name": info.name,
                    "before_km2": float(km2[i, :].sum()),
                    "after_km2": float(km2[:, i].sum()),
                    "gain_km2": gain,
                    "loss_km2": loss,
                    "net_km2": gain - loss,
                }
            )
        return rows

    def largest_changes(self, count: int = 10) -> list[tuple[str, str, float]]:
        """The `count` largest from-to changes (from, to, km²), largest first."""
        km2 = self.km2.copy()
        np.fill_diagonal(km2, 0.0)
        order = np.argsort(-km2, axis=None, kind="stable")[:count]
        names = self.names
        c = len(names)
        return [(names[i // c], names[i % c], float(km2.flat[i])) for i in order if km2.flat[i] > 0]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": CHANGE_FORMAT,
            "version": CHANGE_VERSION,
            "before": self.before,
            "after": self.after,
            "resampled": self.resampled,
            "map": self.map_name,
            "files": list(self.files),
            "class_map": self.class_map.to_json(),
            "pixel_km2": self.pixel_km2,
            "transitions": {
                "rows": "before",
                "columns": "after",
                "codes": [c.code for c in self.class_map.classes[1:]],
                "names": self.names,
                "pixels": self.pixels.tolist(),
                "km2": self.km2.tolist(),
            },
            "classes": self.per_class(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Transitions:
        """The record `to_json` wrote; refuses another format or a newer version."""
        if doc.get("format") != CHANGE_FORMAT or not isinstance(doc.get("version"), int):
            raise ChangeError(f"not a {CHANGE_FORMAT} record")
        if doc["version"] > CHANGE_VERSION:
            raise ChangeError(
                f"a {CHANGE_FORMAT} record of version {doc['version']}; this landcover reads "
                f"up to {CHANGE_VERSION}: upgrade landcover"
            )
        return cls(
            before=str(doc["before"]),
            after=str(doc["after"]),
            class_map=ClassMap.from_json(doc["class_map"]),
            pixels=np.asarray(doc["transitions"]["pixels"], dtype=np.int64),
            km2=np.asarray(doc["transitions"]["km2"], dtype=np.float64),
            resampled=bool(doc.get("resampled", False)),
            map_name=_file_name(doc.get("map", CHANGE_MAP)),
            files=tuple(_file_name(f) for f in doc.get("files", [])),
        )

    def to_markdown(self, *, title: str | None = None) -> str:
        """The transition matrix and the per-class gains and losses as Markdown tables."""
        names = [markdown_text(n) for n in self.names]
        lines = [
            f"# {markdown_text(title or 'Change')}",
            "",
            f"Before: {markdown_text(self.before)}  ",
            f"After: {markdown_text(self.after)}"
            + (" (resampled onto the grid of before)" if self.resampled else ""),
            "",
            "## Transitions (km², before in rows, after in columns)",
            "",
            "| before \\ after | " + " | ".join(names) + " | total |",
            "|---|" + "---:|" * (len(names) + 1),
        ]
        km2 = self.km2
        for i, name in enumerate(names):
            cells = " | ".join(f"{v:,.4f}" for v in km2[i])
            lines.append(f"| {name} | {cells} | {km2[i].sum():,.4f} |")
        totals = " | ".join(f"{v:,.4f}" for v in km2.sum(axis=0))
        lines += [f"| total | {totals} | {km2.sum():,.4f} |", ""]
        lines += [
            "## Gains and losses (km²)",
            "",
            "| class | before | after | gain | loss | net |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row in self.per_class():
            lines.append(
                f"| {markdown_text(row['name'])} | {row['before_km2']:,.4f} | "
                f"{row['after_km2']:,.4f} | {row['gain_km2']:,.4f} | {row['loss_km2']:,.4f} | "
                f"{row['net_km2']:+,.4f} |"
            )
        return "\n".join(lines) + "\n"


def transitions_png(transitions: Transitions) -> bytes:
    """The transition matrix as a heat map (km² in each cell), as PNG; class names are plain
    text (never mathtext)."""
    from landcover.heatmap import matrix_png

    km2 = transitions.km2
    share = km2 / km2.sum(axis=1, keepdims=True).clip(min=1e-300)
    return matrix_png(
        share,
        [[f"{v:,.3g}" for v in row] for row in km2],
        transitions.names,
        axes=("after", "before"),
        colour=("Oranges", "share of the class before"),
        title="transitions in km²",
        margin_in=(2.4, 1.8),
    )


def check_same_classes(before: ClassMap, after: ClassMap, names: Sequence[str]) -> None:
    """Refuse maps whose class tables differ (one line naming both tables)."""
    if before.class_names != after.class_names:
        raise ChangeError(
            f"{names[0]} has the class table {before.name!r} "
            f"({', '.join(before.class_names[1:])}) and {names[1]} {after.name!r} "
            f"({', '.join(after.class_names[1:])}); change needs maps of one class table"
        )


def read_change_record(directory: str | os.PathLike[str]) -> Transitions | None:
    """The `Transitions` of a `landcover change` output directory, or None when `directory`
    holds no change record."""
    path = Path(directory) / CHANGE_RECORD
    if not path.is_file():
        return None
    try:
        return Transitions.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as exc:
        raise ChangeError(
            f"{path}: damaged change record ({exc}); run `landcover change` again"
        ) from None


def _file_name(value: object) -> str:
    """A file name of the output directory as the record gives it; never a path elsewhere."""
    name = str(value)
    if Path(name).name != name or name in ("", ".", ".."):
        raise ChangeError(f"the change record names {name!r} as its map, not a file name")
    return name
