"""The tile stage: sources to chip store, as one process, as ranks or as units of work.

`config` (`TileConfig`, the one definition of tile's options) and `tile` (the orchestration)
over tile's three roles: plan (`plan`, the plan file `planfile`, one process's share
`rankplan`), cut (`cut`, chip statistics `chipstats`, staged parts `parts`) and commit (`commit`,
`append`). A distributed run's ranks (`ranks`, `stager`, the staging folder `staging`, interior
shards `interior`, server-side blob copies `blobcopy`) and a task engine's units (`units`).

It is the top floor of tiling (tests/test_layers.py); the modules are imported by name.
"""
