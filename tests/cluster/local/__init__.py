"""Tests of the local engine (`cluster.local`)."""
