"""The page of `landcover view`: land-cover maps over their imagery in one HTML file that needs
nothing else (Leaflet and every picture inside it), with a legend of class areas, an opacity
slider, a layer switch, and zoom and pan over the whole region.

The maps and the imagery are drawn on a small pyramid of display grids over the union of the
maps (in the first map's CRS): the finest level's longer side has `detail_px` pixels (or the
maps' own pixel count, when smaller), each coarser level half as many, down to 256. Each level
is cut into pieces of at most 1,024 px, embedded as PNG (classes) and WebP (imagery) data
URIs and shown as Leaflet image overlays at the bounds of their grid, so the layers line up
exactly at every zoom; the page shows the level that fits the zoom. The page's size grows with
`detail_px`, not with the maps' size. Reads use the rasters' overviews
(`landcover.view.display`); the areas in the legend count every pixel
(`landcover.view.areas`), on the ellipsoid.

Every user string (file and directory names, class names, the title) is text on the page: HTML
escaped in the markup, JSON escaped for a `<script>` element (`landcover.markup`), and put into
Leaflet's layer switch (which writes names as HTML) escaped by the page's script. Missing tiles
of a product and codes outside a map's class table are said beside the legend.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import rasterio
import rasterio.warp

from landcover.errors import ViewError
from landcover.markup import html_text, script_json
from landcover.view.areas import ClassArea, class_areas
from landcover.view.display import (
    DisplayGrid,
    Located,
    classes_png,
    data_uri,
    locate,
    read_classes,
    read_imagery,
    webp_bytes,
)
from landcover.view.mapfile import MapFile

__all__ = ["DEFAULT_DETAIL_PX", "Page", "ViewConfig", "build_page", "map_warnings"]

logger = logging.getLogger(__name__)

DEFAULT_DETAIL_PX = 2048
MIN_DETAIL_PX = 256
CHUNK_PX = 1024
DEFAULT_OPACITY = 0.7


@dataclass(frozen=True, slots=True)
class ViewConfig:
    """What `build_page` shows: `maps` (opened with `open_map`), over `imagery` (None: the
    images each map records), with the finest level's longer side at most `detail_px`."""

    maps: tuple[MapFile, ...]
    imagery: tuple[str, ...] | None = None
    detail_px: int = DEFAULT_DETAIL_PX
    title: str | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """The page's HTML and what it holds."""

    html: str
    levels: tuple[tuple[int, int], ...]  # (width, height) px of each level, coarsest first
    images: tuple[str, ...]  # the imagery shown beneath the maps (those that could be read)
    areas: tuple[tuple[ClassArea, ...], ...] = field(default=())  # per map


def build_page(config: ViewConfig) -> Page:
    """The page of `config.maps` (see the module docstring)."""
    if not config.maps:
        raise ViewError("no map given; pass the land-cover COG(s) to show")
    if config.detail_px < MIN_DETAIL_PX:
        raise ViewError(f"--detail {config.detail_px}: must be at least {MIN_DETAIL_PX} px")
    crs = config.maps[0].crs
    bounds, native_px = _union(config.maps)
    finest = min(native_px, config.detail_px)
    sizes = [finest]
    while sizes[-1] > MIN_DETAIL_PX:
        sizes.append(max(MIN_DETAIL_PX, math.ceil(sizes[-1] / 2)))
    grids = [DisplayGrid.fitting(crs, bounds, long_side_px=s) for s in reversed(sizes)]
    located = locate(_images(config), crs)  # images that cannot be read are left out
    images = tuple(i.path for i in located)
    if not images:
        logger.info("no imagery to show beneath the map(s): showing the classes alone")
    areas = tuple(tuple(class_areas(m)) for m in config.maps)
    for m, a in zip(config.maps, areas, strict=True):
        unknown = _unknown_codes(m, a)
        if unknown:  # missing tiles are said as the map is opened
            logger.warning("%s", unknown)
    parts = [locate(m.parts, crs, what="map file") for m in config.maps]
    levels = [_level(grid, grids[0], parts, config.maps, located) for grid in grids]
    origin = grids[0]
    data = {
        "levels": levels,
        "bounds": _leaflet_bounds(origin, origin.bounds),
        "maps": [m.name for m in config.maps],
        "imagery": bool(images),
        "opacity": DEFAULT_OPACITY,
    }
    title = config.title or ", ".join(m.name for m in config.maps)
    page = _render(title, data, config.maps, areas, images)
    return Page(
        html=page,
        levels=tuple((g.width, g.height) for g in grids),
        images=images,
        areas=areas,
    )


def _union(maps: Sequence[MapFile]) -> tuple[tuple[float, float, float, float], int]:
    """The union of the maps' bounds in the first map's CRS, and its longer side in pixels of
    the finest map."""
    crs = maps[0].crs
    boxes, sizes = [], []
    for m in maps:
        b = m.bounds
        if m.crs != crs:
            b = rasterio.warp.transform_bounds(m.crs, crs, *b, densify_pts=21)
        boxes.append(b)
        sizes.append(max(b[2] - b[0], b[3] - b[1]) / max(m.width, m.height))  # pixel size
    left = min(b[0] for b in boxes)
    bottom = min(b[1] for b in boxes)
    right = max(b[2] for b in boxes)
    top = max(b[3] for b in boxes)
    native_px = math.ceil(max(right - left, top - bottom) / min(sizes) - 1e-9)
    return (left, bottom, right, top), max(1, native_px)


def _images(config: ViewConfig) -> tuple[str, ...]:
    if config.imagery is not None:
        return config.imagery
    found: dict[str, None] = {}
    for m in config.maps:
        found.update(dict.fromkeys(m.sources))
    return tuple(found)


def _level(
    grid: DisplayGrid,
    origin: DisplayGrid,
    parts: Sequence[Sequence[Located]],
    maps: Sequence[MapFile],
    images: Sequence[Located],
) -> dict[str, Any]:
    """The pieces of one level: bounds in page units, imagery and each map's classes."""
    pieces = []
    for row0 in range(0, grid.height, CHUNK_PX):
        for col0 in range(0, grid.width, CHUNK_PX):
            piece = grid.part(
                row0, col0, min(CHUNK_PX, grid.height - row0), min(CHUNK_PX, grid.width - col0)
            )
            classes: list[str | None] = []
            for m, files in zip(maps, parts, strict=True):
                codes = read_classes(files, piece)
                png = classes_png(codes, m.class_map) if codes.any() else None
                classes.append(None if png is None else data_uri(png, "image/png"))
            imagery = read_imagery(images, piece) if images else None
            pieces.append(
                {
                    "bounds": _leaflet_bounds(origin, piece.bounds),
                    "imagery": None
                    if imagery is None
                    else data_uri(webp_bytes(imagery), "image/webp"),
                    "classes": classes,
                }
            )
    return {"width": grid.width, "height": grid.height, "pieces": pieces}


def _leaflet_bounds(
    origin: DisplayGrid, bounds: tuple[float, float, float, float]
) -> list[list[float]]:
    """`bounds` in page units: pixels of the coarsest level from its top-left corner, north
    up ([[south, west], [north, east]] for Leaflet's plain CRS)."""
    left, bottom, right, top = bounds
    size = origin.transform.a
    x0, y0 = origin.transform.c, origin.transform.f
    return [
        [(bottom - y0) / size, (left - x0) / size],
        [(top - y0) / size, (right - x0) / size],
    ]


def _render(
    title: str,
    data: dict[str, Any],
    maps: Sequence[MapFile],
    areas: Sequence[Sequence[ClassArea]],
    images: Sequence[str],
) -> str:
    # third-party files live under vendor/ (Leaflet, BSD-2-Clause, with its licence)
    static = resources.files("landcover.view").joinpath("static", "vendor", "leaflet")
    leaflet_css = _inline_css(static.joinpath("leaflet.css").read_text(encoding="utf-8"))
    leaflet_js = _inline_js(static.joinpath("leaflet.js").read_text(encoding="utf-8"))
    payload = script_json(data)
    legend = "\n".join(_legend(m, a) for m, a in zip(maps, areas, strict=True))
    warnings = "".join(
        f'<p class="warning">{html_text(w)}</p>'
        for m, a in zip(maps, areas, strict=True)
        for w in map_warnings(m, a)
    )
    if images:
        shown = f"{len(images)} image(s) beneath the map" + ("s" if len(maps) > 1 else "")
    else:
        shown = "no imagery recorded in the map, or none readable; pass --imagery to show it"
    return _TEMPLATE.format(
        title=html_text(title),
        leaflet_css=leaflet_css,
        leaflet_js=leaflet_js,
        page_css=_PAGE_CSS,
        page_js=_PAGE_JS,
        payload=payload,
        legend=legend,
        warnings=warnings,
        imagery=html_text(shown),
        opacity=round(DEFAULT_OPACITY * 100),
    )


def map_warnings(map_file: MapFile, areas: Sequence[ClassArea]) -> list[str]:
    """What the legend of `map_file` does not cover: missing tiles, codes outside its class
    table (one line each, for the page and the command's output)."""
    found = []
    if map_file.missing:
        names = ", ".join(Path(m).name for m in map_file.missing[:5])
        more = len(map_file.missing) - 5
        found.append(
            f"{map_file.name}: {len(map_file.missing)} tile(s) missing ({names}"
            + (f" and {more} more" if more > 0 else "")
            + "): the areas and pictures leave them out; predict the product again"
        )
    unknown = _unknown_codes(map_file, areas)
    if unknown:
        found.append(unknown)
    return found


def _unknown_codes(map_file: MapFile, areas: Sequence[ClassArea]) -> str | None:
    unknown = [a for a in areas if not a.known]
    if not unknown:
        return None
    return (
        f"{map_file.name}: {sum(a.pixels for a in unknown):,} pixel(s) hold codes outside the "
        f"class table ({', '.join(str(a.code) for a in unknown)}): listed as unknown codes, "
        "not drawn"
    )


def _legend(map_file: MapFile, areas: Sequence[ClassArea]) -> str:
    rows = []
    for a in areas:
        colour = "#{:02x}{:02x}{:02x}".format(*a.color)
        swatch = "swatch" if a.known else "swatch unknown"
        rows.append(
            f'<tr data-code="{a.code}" data-pixels="{a.pixels}" data-km2="{a.area_km2!r}"'
            f' data-known="{str(a.known).lower()}">'
            f'<td><span class="{swatch}" style="background:{colour}"></span></td>'
            f'<td class="name">{html_text(a.name)}</td>'
            f'<td class="km2">{format_km2(a.area_km2)}</td>'
            f'<td class="share">{a.share * 100:.1f}</td></tr>'
        )
    total = format_km2(sum(a.area_km2 for a in areas))
    return (
        f'<section class="legend-map"><h2>{html_text(map_file.name)}</h2>'
        "<table><thead><tr><th></th><th>class</th><th>km²</th><th>%</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody>"
        f'<tfoot><tr><td></td><td>mapped</td><td class="km2">{total}</td>'
        "<td>100</td></tr></tfoot></table></section>"
    )


def format_km2(km2: float) -> str:
    """An area for people: four decimals below 1 km² (a field), two below 100, whole
    square kilometres with thousands separators above (a county)."""
    if km2 < 1:
        return f"{km2:.4f}"
    if km2 < 100:
        return f"{km2:.2f}"
    return f"{km2:,.0f}"


def _inline_js(text: str) -> str:
    """Leaflet's script, safe inside a <script> element and without its source map link."""
    text = re.sub(r"^//# sourceMappingURL=.*$", "", text, flags=re.MULTILINE)
    return text.replace("</script", "<\\/script")


def _inline_css(text: str) -> str:
    """Leaflet's style sheet without its image files (marker and layer icons this page does
    not use), so the page asks for no other file."""
    return re.sub(r"url\(images/[^)]*\)", "none", text)


_PAGE_CSS = """
html, body { margin: 0; height: 100%; font: 14px/1.4 system-ui, sans-serif; color: #222; }
body { display: flex; }
#map { flex: 1; height: 100%; background: #f4f4f4; }
#side { width: 320px; padding: 12px 16px; overflow-y: auto; border-left: 1px solid #ccc; }
#side h1 { font-size: 16px; margin: 0 0 8px; word-break: break-all; }
#side h2 { font-size: 14px; margin: 14px 0 4px; word-break: break-all; }
#side table { border-collapse: collapse; width: 100%; }
#side td, #side th { padding: 2px 4px; text-align: right; }
#side td.name, #side th:nth-child(2) { text-align: left; }
#side tfoot td { border-top: 1px solid #ccc; }
.swatch { display: inline-block; width: 14px; height: 14px; border: 1px solid #555; }
.note { color: #666; font-size: 12px; }
.warning { color: #a00; font-size: 12px; }
.swatch.unknown {
  background: repeating-linear-gradient(45deg, #fff 0 3px, #555 3px 5px) !important;
}
img.classes { image-rendering: pixelated; }
"""

_PAGE_JS = """
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("view-data").textContent);
  // Leaflet's layer switch writes a layer's name as HTML: a name is text, so it goes escaped.
  function asText(name) {
    return String(name).replace(/[&<>"']/g, function (c) {
      return "&#" + c.charCodeAt(0) + ";";
    });
  }
  const top = data.levels.length - 1;
  const map = L.map("map", {
    crs: L.CRS.Simple, minZoom: -3, maxZoom: top + 5, zoomSnap: 0.25,
    attributionControl: false,
  });
  map.createPane("imagery").style.zIndex = 350;
  data.maps.forEach(function (_, m) { map.createPane("classes" + m).style.zIndex = 400 + m; });
  function levelFor(zoom) { return Math.max(0, Math.min(top, Math.ceil(zoom - 1e-6))); }
  // One layer per picture, shown one level at a time: the level that fits the zoom.
  const Pyramid = L.LayerGroup.extend({
    initialize: function (perLevel) {
      L.LayerGroup.prototype.initialize.call(this, []);
      this.perLevel = perLevel; this.shown = -1;
    },
    onAdd: function (m) {
      L.LayerGroup.prototype.onAdd.call(this, m);
      m.on("zoomend", this.update, this); this.update();
    },
    onRemove: function (m) {
      m.off("zoomend", this.update, this);
      L.LayerGroup.prototype.onRemove.call(this, m);
      this.clearLayers(); this.shown = -1;
    },
    update: function () {
      const k = levelFor(this._map.getZoom());
      if (k === this.shown) { return; }
      this.clearLayers();
      this.perLevel[k].forEach(function (layer) { this.addLayer(layer); }, this);
      this.shown = k;
    },
    setOpacity: function (value) {
      this.perLevel.forEach(function (layers) {
        layers.forEach(function (layer) { layer.setOpacity(value); });
      });
    },
  });
  function overlays(pick, options) {
    return data.levels.map(function (level) {
      return level.pieces.filter(function (p) { return pick(p); }).map(function (p) {
        return L.imageOverlay(pick(p), p.bounds, options);
      });
    });
  }
  const layers = Object.create(null);  // a map named "__proto__" is a name too
  let imagery = null;
  if (data.imagery) {
    imagery = new Pyramid(overlays(function (p) { return p.imagery; }, { pane: "imagery" }));
    imagery.addTo(map);
    layers["imagery"] = imagery;
  }
  const classes = data.maps.map(function (name, m) {
    const layer = new Pyramid(overlays(function (p) { return p.classes[m]; }, {
      pane: "classes" + m, className: "classes", opacity: data.opacity,
    }));
    layer.addTo(map);
    let label = asText(name);
    for (let n = 2; Object.prototype.hasOwnProperty.call(layers, label); n += 1) {
      label = asText(name) + " (" + n + ")";
    }
    layers[label] = layer;
    return layer;
  });
  L.control.layers(null, layers, { collapsed: false }).addTo(map);
  const slider = document.getElementById("opacity");
  const label = document.getElementById("opacity-value");
  slider.addEventListener("input", function () {
    const value = Number(slider.value) / 100;
    classes.forEach(function (layer) { layer.setOpacity(value); });
    label.textContent = slider.value + " %";
  });
  map.fitBounds(data.bounds);
  window.landcoverView = { map: map, classes: classes, imagery: imagery };
})();
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{leaflet_css}</style>
<style>{page_css}</style>
</head>
<body>
<div id="map"></div>
<aside id="side">
<h1>{title}</h1>
<p class="note">{imagery}</p>
<label for="opacity">map opacity</label>
<input id="opacity" type="range" min="0" max="100" value="{opacity}">
<span id="opacity-value">{opacity} %</span>
{warnings}
<div id="legend">
{legend}
</div>
<p class="note">Areas count every pixel of the map, on the ellipsoid; nodata is left out of the
shares.</p>
</aside>
<script id="view-data" type="application/json">{payload}</script>
<script>{leaflet_js}</script>
<script>{page_js}</script>
</body>
</html>
"""
