"""Where a job's ranks run on a Dask cluster: each rank's worker and host, its place among
the nodes (`assign_ranks`), and the variables it reads that place from (`rank_environment`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cluster.errors import LaunchError
from tiling.runtime import rankenv
from tiling.runtime.rankenv import DistEnv


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Where one rank runs: its worker and the place torch is told."""

    rank: int
    worker: str
    host: str
    local_rank: int
    local_world_size: int
    node_rank: int


def assign_ranks(
    hosts: Mapping[str, str], *, nodes: int, per_node: int, one_host: bool
) -> list[RankPlace]:
    """The ranks' places among the workers `hosts` (address → host): `one_host` (the embedded
    LocalCluster), nodes x per_node workers of that machine as one node; else `per_node`
    workers on each of the first `nodes` hosts that have that many. One line when the cluster
    has too few."""
    by_host: dict[str, list[str]] = {}
    for address, host in sorted(hosts.items(), key=lambda item: (item[1], item[0])):
        by_host.setdefault(host, []).append(address)
    world = nodes * per_node
    if one_host:
        chosen = [(host, a) for host, found in by_host.items() for a in found][:world]
        if len(chosen) < world:
            raise LaunchError(
                f"the Dask cluster has {len(chosen)} worker(s), the job needs {world}: "
                "wait for the workers to start or lower targetNodeCount x processesPerNode"
            )
        return [
            RankPlace(rank, address, host, rank, world, 0)
            for rank, (host, address) in enumerate(chosen)
        ]
    usable = [(host, found[:per_node]) for host, found in by_host.items() if len(found) >= per_node]
    if len(usable) < nodes:
        counts = ", ".join(f"{h}: {len(f)}" for h, f in by_host.items()) or "none"
        raise LaunchError(
            f"the Dask cluster has {len(usable)} host(s) with {per_node} worker(s) or more "
            f"(workers per host: {counts}); the job needs {nodes} x {per_node}: start more "
            "workers or lower targetNodeCount / processesPerNode in cluster.json"
        )
    places = []
    for node, (host, found) in enumerate(usable[:nodes]):
        for local, address in enumerate(found):
            places.append(RankPlace(node * per_node + local, address, host, local, per_node, node))
    return places


def rank_environment(place: RankPlace, *, world: int, master: tuple[str, int]) -> dict[str, str]:
    """The variables a rank reads its place from (`tiling.runtime.rankenv`), and its worker."""
    return rankenv.rank_environment(
        DistEnv(
            rank=place.rank,
            world_size=world,
            local_rank=place.local_rank,
            local_world_size=place.local_world_size,
            node_rank=place.node_rank,
            master_addr=master[0],
            master_port=master[1],
            worker_address=place.worker,
        )
    )
