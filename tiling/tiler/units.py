"""Tile's unit of work for a task scheduler: one source, cut into a part staged beside the
store (`tiling.tiler.staging`), the same part a rank of a distributed run stages.

`tile(config, run_units=...)` hands every source not yet in the store to `run_units` (a Dask
cluster's `cluster.dask.client.TaskRunner`, or anything with its call signature), which runs
`tiling.tiler.cut.stage_source` once per source, anywhere, as often as it must: a part is a pure
function of the plan and the source, and is published whole. The caller then writes the store as a
one-process run does, appending each staged part in input order, so the store is
byte-identical to one process's.
"""

from __future__ import annotations

from tiling.runtime.units import UnitRunner

__all__ = ["UnitRunner"]
