"""The slurm engine: one sbatch script per job (`plan`), submitted and followed with sbatch
and scontrol (`engine`); its cluster.json section is `slurm` (`section`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster._lazy import lazy_names

if TYPE_CHECKING:
    from cluster.slurm.engine import SlurmEngine
    from cluster.slurm.plan import SCRIPT_NAME, SlurmPlan, plan_slurm
    from cluster.slurm.section import SlurmSection, SlurmSpec

__all__ = ["SCRIPT_NAME", "SlurmEngine", "SlurmPlan", "SlurmSection", "SlurmSpec", "plan_slurm"]
__getattr__ = lazy_names(
    __name__,
    {
        "engine": ("SlurmEngine",),
        "plan": ("SCRIPT_NAME", "SlurmPlan", "plan_slurm"),
        "section": ("SlurmSection", "SlurmSpec"),
    },
)
