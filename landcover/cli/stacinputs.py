"""The STAC input options of `landcover tile` and `landcover predict`, gathered into one value.

`stac_input_options` adds `--stac-api`, `--collection`, `--datetime`, `--max-items`,
`--stac-asset`, `--stac-pick` (and, for `tile`, `--bbox`: `predict` searches its own
--region / --bbox) and hands the command a single `stac_inputs: StacInputArgs`;
`StacInputArgs.resolve` expands IMAGES and the search into raster paths with
`tiling.sources.inputs.resolve_inputs`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tiling.errors import TilingError
from tiling.sources.stacquery import (
    DEFAULT_ASSET,
    DEFAULT_MAX_ITEMS,
    PICKS,
    StacOptions,
    StacSearch,
    is_stac_document,
    parse_bbox,
)

if TYPE_CHECKING:
    from tiling.sources.inputs import Inputs

F = TypeVar("F", bound=Callable[..., Any])

SIGNING_NOTE = (
    "Hrefs are opened as they are: sign them first where the host needs it (e.g. save a "
    "search signed with the planetary-computer package)."
)


@dataclass(frozen=True, slots=True)
class StacInputArgs:
    """The STAC options as given on the command line."""

    api: str | None = None
    collections: tuple[str, ...] = ()
    bbox: str | None = None
    datetime: str | None = None
    asset: str = DEFAULT_ASSET
    pick: str = "newest"
    max_items: int | None = None  # None: DEFAULT_MAX_ITEMS

    def check(self, images: Sequence[str], *, area: bool = False) -> None:
        """Refuse what IMAGES and the STAC options get wrong by themselves, before anything is
        read (the `--nproc` parent checks this much before it starts the ranks). `area`: the
        command has its own search area (predict's --region / --bbox)."""
        if not images and self.api is None:
            raise click.UsageError(
                "Missing argument 'IMAGES...': give GeoTIFFs, a STAC file, or --stac-api URL"
            )
        if self.api is None:
            given = [
                flag
                for flag, value in (
                    ("--collection", self.collections),
                    ("--bbox", self.bbox),
                    ("--datetime", self.datetime),
                    ("--max-items", self.max_items),
                )
                if value
            ]
            if given:
                raise TilingError(
                    f"{given[0]} applies only to a STAC API search; add --stac-api URL"
                )
            StacOptions(asset=self.asset, pick=self.pick)
            self._check_stac_documents(images)
            return
        if self.bbox is not None:
            parse_bbox(self.bbox)
        elif not area:
            raise TilingError(
                f"--stac-api {self.api}: give --bbox W,S,E,N (lon/lat) to search; without it "
                "the search would return the whole collection"
            )
        StacSearch(url=self.api, collections=self.collections, max_items=self._max_items)

    def _check_stac_documents(self, images: Sequence[str]) -> None:
        """Refuse --stac-asset / --stac-pick away from their defaults when no input is STAC (no
        --stac-api, no STAC document among IMAGES): rasters given as such have no assets."""
        if any(is_stac_document(p) for p in images):
            return
        defaults = StacInputArgs()
        for flag, value, default in (
            ("--stac-asset", self.asset, defaults.asset),
            ("--stac-pick", self.pick, defaults.pick),
        ):
            if value != default:
                raise TilingError(
                    f"{flag} {value} applies only to STAC inputs (a STAC JSON file among "
                    "IMAGES, or --stac-api URL), and IMAGES hold none; drop it"
                )

    @property
    def _max_items(self) -> int:
        return DEFAULT_MAX_ITEMS if self.max_items is None else self.max_items

    def _options(self, *, intersects: Mapping[str, Any] | None = None) -> StacOptions:
        """`StacOptions` for `resolve_inputs` (after `check`); `intersects` (lon/lat GeoJSON)
        is the search area of a command without --bbox (predict's region)."""
        if self.api is None:
            return StacOptions(asset=self.asset, pick=self.pick)
        search = StacSearch(
            url=self.api,
            collections=self.collections,
            bbox=parse_bbox(self.bbox) if self.bbox is not None else None,
            intersects=intersects,
            datetime=self.datetime,
            max_items=self._max_items,
        )
        return StacOptions(asset=self.asset, pick=self.pick, search=search)

    def resolve(
        self,
        images: Sequence[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        intersects: Mapping[str, Any] | None = None,
    ) -> Inputs:
        """IMAGES (rasters and STAC documents) and the search → raster paths and STAC items."""
        from tiling.sources.inputs import (
            resolve_inputs,  # pystac, shapely, zarr: not for the parent
        )

        self.check(images, area=intersects is not None)
        options = self._options(intersects=intersects)
        return resolve_inputs(images, storage_options=storage_options, stac=options)


def pack_stac_inputs(params: Mapping[str, Any], *, search_bbox: bool) -> dict[str, Any]:
    """A command's parsed `params` with its STAC options as one `stac_inputs: StacInputArgs`
    (what `stac_input_options` hands the command; `search_bbox` as given to it)."""
    kwargs = dict(params)
    kwargs["stac_inputs"] = StacInputArgs(
        api=kwargs.pop("stac_api"),
        collections=tuple(kwargs.pop("collections")),
        bbox=kwargs.pop("bbox") if search_bbox else None,
        datetime=kwargs.pop("datetime"),
        max_items=kwargs.pop("max_items"),
        asset=kwargs.pop("stac_asset"),
        pick=kwargs.pop("stac_pick"),
    )
    return kwargs


def stac_input_options(*, search_bbox: bool) -> Callable[[F], F]:
    """Add the STAC options to a command; it receives them as `stac_inputs: StacInputArgs`.

    `search_bbox`: add `--bbox W,S,E,N` as the search area (tile); predict has its own --bbox.
    """
    options = [
        click.option(
            "--stac-api",
            default=None,
            metavar="URL",
            help="Search this STAC API (pystac-client) for the images, e.g. "
            "https://planetarycomputer.microsoft.com/api/stac/v1. " + SIGNING_NOTE,
        ),
        click.option(
            "--collection",
            "collections",
            multiple=True,
            metavar="NAME",
            help="Collection to search with --stac-api (repeatable), e.g. naip.",
        ),
    ]
    if search_bbox:
        options.append(
            click.option(
                "--bbox",
                default=None,
                metavar="W,S,E,N",
                help="Area of the --stac-api search in lon/lat degrees.",
            )
        )
    options += [
        click.option(
            "--datetime",
            default=None,
            metavar="RANGE",
            help="Date or range of the --stac-api search, e.g. 2018/2021 or 2019-06-01/..",
        ),
        click.option(
            "--max-items",
            type=click.IntRange(min=1),
            default=None,
            metavar="N",
            help=f"Refuse a --stac-api search that matches more than N items (default "
            f"{DEFAULT_MAX_ITEMS}): narrow it, or raise N. Each page read is logged.",
        ),
        click.option(
            "--stac-asset",
            default=DEFAULT_ASSET,
            show_default=True,
            metavar="KEY",
            help="Asset of each STAC item that holds the GeoTIFF.",
        ),
        click.option(
            "--stac-pick",
            type=click.Choice(PICKS),
            default="newest",
            show_default=True,
            help="Of STAC items covering the same place (same grid:code, or footprints "
            "overlapping by more than half the smaller), keep the newest, the oldest, or all.",
        ),
    ]

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_stac_inputs(*args: Any, **kwargs: Any) -> Any:
            return command(*args, **pack_stac_inputs(kwargs, search_bbox=search_bbox))

        decorated: Any = with_stac_inputs
        for option in reversed(options):
            decorated = option(decorated)
        return decorated  # type: ignore[no-any-return]

    return decorate
