"""`tile` (and `predict`) on an engine that runs units of work as tasks (`runs_tasks`), its
runner got from the engine registry (`cluster.tasks`), never by importing the engine.

The command runs in this process, as one process runs it, with a unit runner in its context
(`unit_runner(ctx)`): `tile` hands each source to the cluster as a task (`tiling.units`) and
appends the staged parts here, in input order, so the store is byte-identical to one
process's; `predict` of a tiled product (--tile-size) hands each tile to the cluster as a task
(`landcover.prediction.tiled`) and writes the collection and the mosaic here. A one-COG
`predict` runs as one rank per worker through the engine, coordinating through its output as
on every engine.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from cluster.spec import ClusterSpec
from cluster.tasks import task_engine

if TYPE_CHECKING:
    from tiling.units import UnitRunner

UNIT_RUNNER_KEY = "landcover.unit_runner"
# The stages whose command takes a unit runner: their unit, and what this process does with
# the units' results.
_UNITS = {
    "tile": ("source", "this process appends their staged parts in input order"),
    "predict": ("tile", "this process writes the collection and the mosaic of the tiles"),
}


def runs_as_tasks(stage_args: Sequence[str]) -> bool:
    """Whether `landcover STAGE ARGS` runs its units as tasks on a task engine: `tile`, and a
    `predict` of a tiled product (--tile-size); other stages run as ranks."""
    if not stage_args or stage_args[0] not in _UNITS:
        return False
    return stage_args[0] != "predict" or any(
        a == "--tile-size" or a.startswith("--tile-size=") for a in stage_args[1:]
    )


def unit_runner(ctx: click.Context) -> UnitRunner | None:
    """The runner of units of work this command was given, if it runs on a task engine."""
    runner: UnitRunner | None = ctx.meta.get(UNIT_RUNNER_KEY)
    return runner


def describe_stage_tasks(spec: ClusterSpec, stage_args: Sequence[str]) -> str:
    """What `run_stage_as_tasks` does, in the words of a plan."""
    unit, after = _UNITS[stage_args[0]]
    command = " ".join(shlex.quote(a) for a in stage_args)
    return "\n".join(
        [
            f"engine: {spec.engine}",
            *task_engine(spec).describe_tasks(spec, unit=unit, after=after),
            f"command (this process): landcover {command}",
            *(f"note: {n}" for n in spec.notes),
        ]
    )


def run_stage_as_tasks(
    ctx: click.Context, spec: ClusterSpec, stage_args: Sequence[str], *, client: Any = None
) -> None:
    """Run `landcover STAGE ARGS` here with the units of work as tasks on `spec`'s task
    engine (or on `client`, a client object of that engine's kind)."""
    stage, args = stage_args[0], list(stage_args[1:])
    root = ctx.find_root().command
    assert isinstance(root, click.Group)
    command = root.get_command(ctx, stage)
    assert command is not None
    with task_engine(spec).runner(spec, client=client) as runner:
        ctx.meta[UNIT_RUNNER_KEY] = runner
        try:
            with command.make_context(stage, args, parent=ctx) as sub:
                command.invoke(sub)
        finally:
            ctx.meta.pop(UNIT_RUNNER_KEY, None)
