"""GeoTIFF → Zarr v3 chip store. Knows rasterio, zarr and fsspec; knows nothing of torch.

Sub-packages by role, each importing only its own modules and those on the floors below it
(tests/test_layers.py, `TILING_FLOORS`), from the top:

- `tiler`: the tile stage (config, plan, cut, commit; one process, ranks or units);
- `chipstore`: the chip store's format, reader and writer; `synthetic`: generated scenes;
- `sources`: inputs, STAC, rasters, grids, labels, class tables; `staged`: the staged-parts
  protocol tile and predict share;
- `runtime`: storage URLs, atomic writes, fingerprints, polling, this machine, the rank
  environment, option flags (cluster and landcover use it too);
- `errors`: the error classes.
"""

from tiling.errors import TilingError

__all__ = ["TilingError"]
