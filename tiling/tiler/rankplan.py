"""Tile's plan role for one process: the run's plan, which rank cuts which source, and the
fingerprints of the inputs this process reads or records.

`plan_rank` is all a process of a tile run decides before it reads a pixel: rank 0 (and a
one-process run) plans the run (`tiling.tiler.plan.plan_tiling`) and, with other ranks, publishes
the plan beside the store; the others load it (`tiling.tiler.planfile`). Ownership follows from
the plan alone (`tiling.tiler.commit.source_owners`), so every rank agrees on it without talking
to the others. The `RankPlan` it returns is what the cut role (`tiling.tiler.cut`) and the commit
role (`tiling.tiler.append`) work from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tiling.runtime.fingerprint import Fingerprint, fingerprints
from tiling.tiler.commit import check_rank, source_owners
from tiling.tiler.config import TileConfig
from tiling.tiler.plan import SourcePlan, TilePlan
from tiling.tiler.planfile import plan_for_rank, publish_plan
from tiling.tiler.staging import PartStaging

__all__ = ["RankPlan", "input_fingerprints", "plan_rank"]


@dataclass(frozen=True, slots=True)
class RankPlan:
    """What one process of a tile run works from."""

    config: TileConfig
    plan: TilePlan
    rank: int
    world_size: int
    owners: tuple[int, ...]  # the rank that cuts each source of the plan, in input order
    prints: Mapping[str, Fingerprint]  # rank 0: every input's; other ranks: their sources'

    @property
    def workers(self) -> int:
        return self.config.effective_workers

    @property
    def mine(self) -> list[SourcePlan]:
        """The sources this rank cuts, in input order."""
        return [s for s in self.plan.sources if self.owners[s.id] == self.rank]

    def staging(self) -> PartStaging:
        """The staging folder beside the store."""
        return PartStaging(self.config.out, self.config.storage_options)


def plan_rank(
    config: TileConfig, *, plan: TilePlan | None = None, rank: int = 0, world_size: int = 1
) -> RankPlan:
    """This rank's plan of the run of `config` (`plan`: one made already, else planned
    or loaded here); rank 0 of several publishes the plan for the others."""
    check_rank(rank, world_size)
    plan = plan or plan_for_rank(config, rank=rank, world_size=world_size)
    if rank == 0 and world_size > 1:  # the other ranks load it instead of planning the run
        publish_plan(plan, PartStaging(config.out, config.storage_options))
    owners = tuple(source_owners(plan, world_size))
    if rank == 0:
        sources, labels = list(plan.sources), list(plan.params.labels)
    else:
        sources = [s for s in plan.sources if owners[s.id] == rank]
        labels = [lab.path for s in sources for lab in s.labels]
    prints = input_fingerprints(config, sources, labels, config.effective_workers)
    return RankPlan(config, plan, rank, world_size, owners, prints)


def input_fingerprints(
    config: TileConfig, sources: Sequence[SourcePlan], labels: Sequence[str], workers: int
) -> dict[str, Fingerprint]:
    """Fingerprints of the images of `sources` and of `labels` (each once), by path."""
    inputs = [s.image.path for s in sources] + list(dict.fromkeys(labels))
    return dict(
        zip(inputs, fingerprints(inputs, config.storage_options, workers=workers), strict=True)
    )
