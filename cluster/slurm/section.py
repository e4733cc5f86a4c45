"""The `slurm` section of cluster.json: what the sbatch script asks SLURM for beyond nodes
and tasks, and the checks of the slurm engine.

    "slurm": {"partition": "gpu", "account": "proj42", "timeLimit": "HH:MM:SS",
              "gpusPerNode": 4, "cpusPerTask": 8, "setup": ["module load cuda", "..."],
              "extraDirectives": ["--exclusive"], "socketInterface": "ib0"}

A node is whatever the partition gives: GPUs per node are `gpusPerNode` (else the VM size's,
else none), and "auto" processes are one per GPU (one on CPU nodes). `vmSize` "local" (the
default) means no size: the partition's nodes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, Field, StrictStr

from cluster.engines import EngineRules
from cluster.errors import ClusterSpecError
from cluster.jsonmodel import JsonModel, NonNegativeInt, OneLine, PositiveInt, matching

# SLURM's time formats that name hours: "HH:MM:SS" and "D-HH:MM:SS" (days, hours)
_TIME_LIMIT = re.compile(r"^(?:\d+-)?\d{1,3}:[0-5]\d:[0-5]\d$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.,-]+$")  # a partition (or a comma list of them), account
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # a Linux interface name


def _sbatch_option(value: str) -> str:
    if not value.strip().removeprefix("#SBATCH").strip().startswith("-"):
        raise ValueError('must be an sbatch option such as "--exclusive"')
    return value


class SlurmSection(JsonModel):
    """cluster.json's `slurm` object, as written."""

    partition: Annotated[StrictStr, matching(_SLURM_NAME, "a SLURM partition name")] | None = None
    account: Annotated[StrictStr, matching(_SLURM_NAME, "a SLURM account name")] | None = None
    time_limit: (
        Annotated[StrictStr, matching(_TIME_LIMIT, '"HH:MM:SS" or "D-HH:MM:SS", e.g. "02:00:00"')]
        | None
    ) = None
    gpus_per_node: NonNegativeInt | None = None
    cpus_per_task: PositiveInt | None = None
    setup: list[OneLine] = Field(default_factory=list)
    extra_directives: list[Annotated[OneLine, AfterValidator(_sbatch_option)]] = Field(
        default_factory=list
    )
    socket_interface: (
        Annotated[StrictStr, matching(_IFNAME, 'a network interface name such as "eth0"')] | None
    ) = None


@dataclass(frozen=True, slots=True)
class SlurmSpec:
    """What the sbatch script asks SLURM for beyond nodes and tasks (None: SLURM's default),
    the shell lines it runs first, and the network interface gloo/NCCL should use."""

    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None  # "HH:MM:SS" or "D-HH:MM:SS"
    cpus_per_task: int | None = None
    setup: tuple[str, ...] = ()
    extra_directives: tuple[str, ...] = ()
    socket_interface: str | None = None

    def worker_threads(self, workers: int) -> int | None:
        """The CPUs asked for each task (None: the VM size's share)."""
        return self.cpus_per_task or None


def slurm_spec(raw: SlurmSection) -> SlurmSpec:
    """The checked section; one-line errors."""
    for index, directive in enumerate(raw.extra_directives):
        try:  # sbatch reads an #SBATCH line as a shell reads words: quotes must pair
            shlex.split(directive, comments=True)
        except ValueError:
            raise ClusterSpecError(
                f"slurm.extraDirectives[{index}] {directive!r} has an unmatched quote, which "
                "sbatch refuses: close it or drop the quote"
            ) from None
    return SlurmSpec(
        partition=raw.partition,
        account=raw.account,
        time_limit=raw.time_limit,
        cpus_per_task=raw.cpus_per_task,
        setup=tuple(raw.setup),
        extra_directives=tuple(raw.extra_directives),
        socket_interface=raw.socket_interface,
    )


class _SlurmRules(EngineRules):
    model = SlurmSection
    no_elastic = (
        'engine "slurm" has no elastic restarts: drop "elastic" (or autoScale) and resubmit '
        "a failed job with --resume to continue from its checkpoint"
    )

    def section(self, raw: SlurmSection | None, *, name: str) -> SlurmSpec:
        return slurm_spec(raw or SlurmSection())

    def note_on(self, key: str) -> str | None:
        if key != "network":
            return None
        return (
            "network: a SLURM cluster's links are its own, so the slurm engine ignores it; "
            "the local SLURM testbed takes the rate when it starts "
            "(python -m tests.support.slurm_testbed up --bandwidth RATE)"
        )

    def gpus_per_node(self, raw: SlurmSection | None) -> int | None:
        return None if raw is None else raw.gpus_per_node

    def nodes_here(self, section: SlurmSpec) -> bool:
        return False


RULES = _SlurmRules()
