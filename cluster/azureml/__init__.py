"""The azureml engine: an Azure ML command job (`engine`), its environment and code
(`assets`); its cluster.json section is `azureml` (`section`). The Azure SDK is imported only
when a plan is launched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster._lazy import lazy_names

if TYPE_CHECKING:
    from cluster.azureml.engine import AzureMLEngine, AzureMLPlan
    from cluster.azureml.section import AzureMLSection, AzureMLSpec

__all__ = ["AzureMLEngine", "AzureMLPlan", "AzureMLSection", "AzureMLSpec"]
__getattr__ = lazy_names(
    __name__,
    {"engine": ("AzureMLEngine", "AzureMLPlan"), "section": ("AzureMLSection", "AzureMLSpec")},
)
