"""The chip store: the Zarr v3 format between tiling and training (docs/CONTRACTS.md).

Its records (`records`, `store_format`, the `sources` array: `source_table`), what decides its
content (`params`, and the train/val rule `split`), its shard objects (`shards`, read back with
every checksum checked: `shard_reader`), the read API (`store`), the one writer (`writer`) and
opening a store for writing (`resume`); `zarrstore` makes the zarr store for a URL.

It imports `tiling.sources` (class tables, rasters), `tiling.runtime` and `tiling.errors`,
nothing of the tile stage (tests/test_layers.py); the modules are imported by name.
"""
