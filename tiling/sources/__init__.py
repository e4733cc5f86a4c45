"""Sources: what a tile run reads, checked before a pixel is cut.

Expanding inputs into raster paths (`inputs`; STAC documents and searches: `stac`, `stacdoc`,
`stacquery`, `stacsearch`), opening and validating rasters (`rasters`) and their bands
(`bands`), pixel grids (`grid`) and CRSs (`crs`), matching labels to images (`labels`), the class
tables labels are mapped onto (`classes`), and reading windows of pixels and labels (`reader`).

It imports nothing of tiling but `tiling.runtime` and `tiling.errors`
(tests/test_layers.py); the modules are imported by name.
"""
