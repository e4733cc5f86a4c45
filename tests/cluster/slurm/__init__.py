"""Tests of the slurm engine (`cluster.slurm`)."""
