"""Tests of the azureml engine (`cluster.azureml`)."""
