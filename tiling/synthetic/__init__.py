"""Synthetic NAIP-like scenes with Chesapeake-style labels: the inputs the demo, the tests
and the benchmarks run on. Not tiling, and nothing of tiling imports it.

`scenes` writes the GeoTIFFs (`synthesize_scenes`); they are windows cut from one world
(`world`: smooth fields from `noise` and vector layers), rendered (`render`) from the surfaces
and their digital numbers (`surfaces`).

It imports only the class tables (`tiling.sources.classes`) and the atomic writer
(`tiling.runtime`); the modules are imported by name.
"""
