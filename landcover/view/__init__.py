"""The map page of `landcover view` and the pictures of maps: opening a map (a COG or a tiled
product's mosaic), exact class areas, reading rasters onto small display grids from their
overviews, the self-contained page, the quicklook PNG, and serving the page locally."""

from __future__ import annotations

from landcover.errors import ViewError
from landcover.view.areas import ClassArea, class_areas
from landcover.view.display import DisplayGrid, class_rgba, read_classes, read_imagery
from landcover.view.mapfile import MapFile, open_map
from landcover.view.page import DEFAULT_DETAIL_PX, Page, ViewConfig, build_page
from landcover.view.quicklook import quicklook_path, quicklook_png, write_quicklook
from landcover.view.serve import PageServer, serve_page

__all__ = [
    "DEFAULT_DETAIL_PX",
    "ClassArea",
    "DisplayGrid",
    "MapFile",
    "Page",
    "PageServer",
    "ViewConfig",
    "ViewError",
    "build_page",
    "class_areas",
    "class_rgba",
    "open_map",
    "quicklook_path",
    "quicklook_png",
    "read_classes",
    "read_imagery",
    "serve_page",
    "write_quicklook",
]
