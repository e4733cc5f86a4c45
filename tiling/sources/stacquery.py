"""What a STAC input asks for and what it gives: the options, an API search, a chosen source.

Plain values with no I/O (`tiling.sources.stac` reads documents and runs searches), so the command
line's options build them without importing pystac, shapely or zarr: `landcover tile
--nproc N` launches its ranks without paying for the stack they import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tiling.errors import TilingError

STAC_SUFFIXES = (".json", ".geojson")
DEFAULT_ASSET = "image"
PICKS = ("newest", "oldest", "all")
# Items an API search may return (`--max-items`): a county's NAIP over a decade is a few
# hundred; a search that would page through a whole collection (millions) is refused.
DEFAULT_MAX_ITEMS = 10_000


@dataclass(frozen=True, slots=True)
class StacSearch:
    """A STAC API item search (`--stac-api URL --collection C --bbox W,S,E,N --datetime R`)."""

    url: str
    collections: tuple[str, ...]
    bbox: tuple[float, float, float, float] | None = None  # lon/lat W, S, E, N
    intersects: Mapping[str, Any] | None = None  # a GeoJSON geometry in lon/lat
    datetime: str | None = None  # RFC 3339 instant or range, e.g. "2018/2021"
    max_items: int = DEFAULT_MAX_ITEMS  # more is an error (`tiling.sources.stacsearch`)

    def __post_init__(self) -> None:
        if not self.collections:
            raise TilingError(
                f"--stac-api {self.url} needs --collection NAME (e.g. --collection naip)"
            )
        if self.max_items < 1:
            raise TilingError(f"--max-items {self.max_items} must be >= 1")

    def describe(self) -> str:
        parts = [f"collections {','.join(self.collections)}"]
        if self.bbox is not None:
            parts.append("bbox " + ",".join(f"{v:g}" for v in self.bbox))
        if self.intersects is not None:
            parts.append("the region")
        if self.datetime:
            parts.append(f"datetime {self.datetime}")
        return f"{self.url} ({', '.join(parts)})"


@dataclass(frozen=True, slots=True)
class StacOptions:
    """How STAC inputs become rasters: the asset key, which item of a place, an API search."""

    asset: str = DEFAULT_ASSET
    pick: str = "newest"
    search: StacSearch | None = None

    def __post_init__(self) -> None:
        if self.pick not in PICKS:
            raise TilingError(f"--stac-pick {self.pick!r}: use one of {', '.join(PICKS)}")


@dataclass(frozen=True, slots=True)
class StacSource:
    """One chosen STAC item: the href of its asset and what an output item cites of it."""

    href: str
    item_id: str
    collection: str | None
    start: datetime | None
    end: datetime | None
    self_href: str | None  # the item's own JSON, when it has one (for `derived_from` links)


def is_stac_document(pattern: str) -> bool:
    """True for an input that names a STAC JSON document rather than rasters."""
    return pattern.lower().split("?", 1)[0].endswith(STAC_SUFFIXES)


def parse_bbox(text: str) -> tuple[float, float, float, float]:
    """`W,S,E,N` in lon/lat degrees → a tuple; one-line error otherwise."""
    try:
        w, s, e, n = (float(v) for v in text.split(","))
    except ValueError:
        raise TilingError(
            f"--bbox {text!r}: expected four numbers W,S,E,N in degrees, e.g. -76.6,39,-76.5,39.1"
        ) from None
    if not (-180 <= w < e <= 180 and -90 <= s < n <= 90):
        raise TilingError(
            f"--bbox {text!r}: need W < E within -180..180 and S < N within -90..90 (lon/lat)"
        )
    return w, s, e, n
