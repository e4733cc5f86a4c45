"""The quicklook of a land-cover map: a small PNG of the map in its class colours with a legend
beside it, drawn from the map's overviews (or its tiles' overviews, for a mosaic) after the map
is written. `landcover predict` puts it beside its output as `<out>.quicklook.png`. The map's
and classes' names are plain text in it, never mathtext (`landcover.markup`)."""

from __future__ import annotations

import io
import os

import numpy as np

from landcover.markup import plain_figures, plot_text
from landcover.outputs import refuse_existing, write_bytes_atomic
from landcover.view.display import DisplayGrid, class_rgba, locate, read_classes
from landcover.view.mapfile import MapFile, open_map

__all__ = [
    "QUICKLOOK_PX",
    "QUICKLOOK_SUFFIX",
    "check_quicklook_target",
    "quicklook_path",
    "quicklook_png",
    "write_quicklook",
]

QUICKLOOK_SUFFIX = ".quicklook.png"
QUICKLOOK_PX = 512  # the map's longer side in the picture


def quicklook_path(out: str | os.PathLike[str]) -> str:
    """Where the quicklook of the map `out` goes: `<out>.quicklook.png`, or for a tiled
    product's directory `<dir>/quicklook.png`."""
    text = os.fspath(out)
    if text.endswith("/") or os.path.isdir(text):
        return os.path.join(text, "quicklook.png")
    return text + QUICKLOOK_SUFFIX


def check_quicklook_target(out: str, *, overwrite: bool) -> str:
    """The quicklook's path for the map `out`, refused before any work when a file is there
    and `overwrite` is not given."""
    path = quicklook_path(out)
    refuse_existing([path], overwrite=overwrite, what="the quicklook (or pass --no-quicklook)")
    return path


def quicklook_png(map_file: MapFile, *, long_side_px: int = QUICKLOOK_PX) -> bytes:
    """The quicklook of `map_file` as PNG bytes: the map at most `long_side_px` on its longer
    side, nodata in white, and the class names with their colours beside it."""
    import matplotlib

    matplotlib.use("Agg")
    with plain_figures():
        return _draw(map_file, long_side_px)


def _draw(map_file: MapFile, long_side_px: int) -> bytes:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    side = min(long_side_px, max(map_file.width, map_file.height))
    grid = DisplayGrid.fitting(map_file.crs, map_file.bounds, long_side_px=side)
    codes = read_classes(locate(map_file.parts, map_file.crs, what="map file"), grid)
    rgba = class_rgba(codes, map_file.class_map)
    present = set(np.unique(codes).tolist())
    classes = [c for c in map_file.class_map.classes if c.code and c.code in present]
    dpi = 100
    legend_in = 2.4
    fig = Figure(figsize=(grid.width / dpi + legend_in, max(grid.height / dpi, 1.6)), dpi=dpi)
    ax = fig.add_axes((0.0, 0.0, grid.width / dpi / fig.get_figwidth(), 1.0))
    ax.imshow(rgba, interpolation="nearest")
    ax.set_axis_off()
    fig.legend(
        handles=[
            Patch(facecolor=_unit(c.color), edgecolor="#555555", label=plot_text(c.name))
            for c in classes
        ],
        loc="center right",
        frameon=False,
        fontsize=9,
        title=plot_text(map_file.name),
        title_fontsize=9,
    )
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, facecolor="white")
    return buffer.getvalue()


def _unit(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    return (rgb[0] / 255, rgb[1] / 255, rgb[2] / 255)


def write_quicklook(out: str, *, overwrite: bool) -> str:
    """Write the quicklook of the map `out` (a COG, VRT or tiled product directory) at
    `quicklook_path(out)` atomically, and return that path."""
    path = quicklook_path(out)
    write_bytes_atomic(path, quicklook_png(open_map(out)), overwrite=overwrite)
    return path
