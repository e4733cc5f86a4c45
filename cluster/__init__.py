"""Where training runs: cluster.json specs and engines (local torchrun, Azure ML, Kubernetes).

Knows nothing of models: an engine launches an entry module with arguments.
"""

from cluster.errors import ClusterError

__all__ = ["ClusterError"]
