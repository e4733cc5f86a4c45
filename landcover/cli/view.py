"""`landcover view`: a self-contained page of land-cover maps over their imagery."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from landcover.options import output_url_callback, overwrite_option
from landcover.outputs import (
    check_output_file,
    local_output,
    require_distinct,
    write_text_atomic,
)
from landcover.view.page import DEFAULT_DETAIL_PX, MIN_DETAIL_PX

logger = logging.getLogger(__name__)


@click.command("view")
@click.argument("maps", nargs=-1, required=True, metavar="MAP [MAP...]")
@click.option(
    "--out",
    required=True,
    callback=output_url_callback(formats=(".html", ".htm"), example="map.html"),
    help="The page to write, e.g. map.html (one file that works offline).",
)
@click.option(
    "--imagery",
    multiple=True,
    help="Images to show beneath the maps (repeat the option, or globs) [default: the "
    "images the maps were predicted from, as `predict` records them].",
)
@click.option(
    "--detail",
    "detail_px",
    type=click.IntRange(min=MIN_DETAIL_PX),
    default=DEFAULT_DETAIL_PX,
    show_default=True,
    help="Longer side in px of the finest picture; the page's size grows with it, not "
    "with the maps'.",
)
@click.option("--title", default=None, help="Page title [default: the maps' names].")
@click.option(
    "--serve",
    is_flag=True,
    help="Then serve the page from 127.0.0.1 on a free port and print its URL (Ctrl-C stops).",
)
@overwrite_option
def view_command(
    maps: tuple[str, ...],
    out: str,
    imagery: tuple[str, ...],
    detail_px: int,
    title: str | None,
    serve: bool,
    overwrite: bool,
) -> None:
    """Write a page showing MAP(s) (land-cover COGs, VRT mosaics or tiled product
    directories) over their imagery: class colours, a legend with each class's area,
    opacity, zoom and pan. The output directory of `landcover change` shows its change map
    over the two maps it compares."""
    from landcover.view import ViewConfig, build_page, open_map, serve_page
    from tiling.sources.rasters import expand_inputs

    page_path = Path(out)
    maps, change_title = _with_change_maps(tuple(local_output(m) for m in maps))
    require_distinct([("--out", out)], inputs=[("map", m) for m in maps])
    check_output_file(page_path, option="--out", overwrite=overwrite, example="map.html")
    opened = tuple(open_map(m) for m in maps)
    images = expand_inputs(imagery, what="imagery") if imagery else None
    page = build_page(
        ViewConfig(
            maps=opened,
            imagery=None if images is None else tuple(images),
            detail_px=detail_px,
            title=title or change_title,
        )
    )
    write_text_atomic(page_path, page.html, overwrite=overwrite)
    width, height = page.levels[-1]
    click.echo(
        f"wrote {page_path}: {len(opened)} map(s), {len(page.images)} image(s) beneath, "
        f"{width} x {height} px at the finest zoom, {len(page.html.encode()) / 1e6:.1f} MB"
    )
    if serve:
        serve_page(page_path, ready=lambda url: click.echo(f"serving {url} (Ctrl-C stops)"))


def _with_change_maps(maps: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """The maps with each `landcover change` output directory replaced by its change map and
    the two maps it compares (a layer each), and a title for a page of one change."""
    from landcover.change.transitions import read_change_record
    from landcover.view.mapfile import local_map

    expanded: list[str] = []
    title = None
    for given in maps:
        record = read_change_record(given) if Path(given).is_dir() else None
        if record is None:
            expanded.append(given)
            continue
        compared = [record.before, record.after]
        shown = [m for m in compared if local_map(m)]
        if len(shown) < len(compared):
            logger.warning(
                "%s: its change record names maps that are not local files or directories "
                "(%s); they are not read (a file's content never makes this command fetch "
                "anything): pass them as MAPs to show them",
                given,
                ", ".join(repr(m) for m in compared if m not in shown),
            )
        expanded += [str(Path(given) / record.map_name), *shown]
        title = f"Change from {Path(record.before).name} to {Path(record.after).name}"
    return tuple(expanded), title if len(maps) == 1 else None
