"""Tests of the dask engine (`cluster.dask`)."""
