"""GeoTIFF → Zarr v3 chip store. Knows rasterio, zarr and fsspec; knows nothing of torch."""

from tiling.errors import TilingError

__all__ = ["TilingError"]
