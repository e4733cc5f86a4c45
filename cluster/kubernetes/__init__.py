"""The kubernetes engine: a Kubeflow TrainJob (`trainjob`) or PyTorchJob (`pytorchjob`) with
its pods (`pod`), applied and followed with kubectl (`engine`); its cluster.json section is
`kubernetes` (`section`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster._lazy import lazy_names

if TYPE_CHECKING:
    from cluster.kubernetes.engine import KubernetesEngine, KubernetesPlan
    from cluster.kubernetes.section import KubernetesSection, KubernetesSpec

__all__ = ["KubernetesEngine", "KubernetesPlan", "KubernetesSection", "KubernetesSpec"]
__getattr__ = lazy_names(
    __name__,
    {
        "engine": ("KubernetesEngine", "KubernetesPlan"),
        "section": ("KubernetesSection", "KubernetesSpec"),
    },
)
