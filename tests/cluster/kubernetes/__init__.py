"""Tests of the kubernetes engine (`cluster.kubernetes`)."""
