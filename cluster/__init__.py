"""Where training runs: cluster.json specs and engines (local torchrun, SLURM, Azure ML,
Kubernetes, Dask), one sub-package each, found through the registry `cluster.engines`.

Knows nothing of models: an engine launches an entry module with arguments.
"""

from cluster.errors import ClusterError

__all__ = ["ClusterError"]
