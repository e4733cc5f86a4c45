"""Azure VM sizes: GPUs per node (for `processesPerNode: auto`) and the network between nodes
(for scaling projections).

Figures are the published ones, rounded (Azure VM size docs, 2024-2026): GPU count per size and
the interconnect a size has (InfiniBand on the r-sizes, accelerated Ethernet otherwise).
Bandwidths are per node, in bytes per second; latencies are one message's one-way latency.
They feed projections that say they are projections; `--network` overrides them.
"""

from __future__ import annotations

from dataclasses import dataclass

GBIT = 1e9 / 8  # bytes per second in one Gbit/s


@dataclass(frozen=True, slots=True)
class Network:
    """An interconnect: its name, bandwidth per node (bytes/s) and one-way latency (s)."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float

    @property
    def bandwidth_gbit_per_s(self) -> float:
        return self.bandwidth_bytes_per_s / GBIT


@dataclass(frozen=True, slots=True)
class VmSize:
    """One VM size: GPUs, vCPUs, and the network its nodes talk over."""

    name: str
    gpus: int
    gpu_model: str | None
    vcpus: int
    network: Network


ETHERNET_10G = Network("ethernet-10g", 10 * GBIT, 50e-6)
ETHERNET_25G = Network("ethernet-25g", 25 * GBIT, 30e-6)
ETHERNET_40G = Network("ethernet-40g", 40 * GBIT, 25e-6)
ETHERNET_80G = Network("ethernet-80g", 80 * GBIT, 20e-6)
IB_FDR = Network("infiniband-fdr-56g", 56 * GBIT, 2e-6)
IB_EDR = Network("infiniband-edr-100g", 100 * GBIT, 1.5e-6)
IB_HDR = Network("infiniband-hdr-200g", 200 * GBIT, 1.5e-6)
IB_HDR_8X = Network("infiniband-hdr-8x200g", 1600 * GBIT, 1.5e-6)
IB_NDR_8X = Network("infiniband-ndr-8x400g", 3200 * GBIT, 1.5e-6)

NETWORKS: dict[str, Network] = {
    n.name: n
    for n in (
        ETHERNET_10G,
        ETHERNET_25G,
        ETHERNET_40G,
        ETHERNET_80G,
        IB_FDR,
        IB_EDR,
        IB_HDR,
        IB_HDR_8X,
        IB_NDR_8X,
    )
}

_SIZES = [
    # legacy K80 sizes the original Batch AI tutorial used
    VmSize("Standard_NC6", 1, "K80", 6, ETHERNET_10G),
    VmSize("Standard_NC12", 2, "K80", 12, ETHERNET_10G),
    VmSize("Standard_NC24", 4, "K80", 24, ETHERNET_10G),
    VmSize("Standard_NC24r", 4, "K80", 24, IB_FDR),
    # V100
    VmSize("Standard_NC6s_v3", 1, "V100", 6, ETHERNET_10G),
    VmSize("Standard_NC12s_v3", 2, "V100", 12, ETHERNET_10G),
    VmSize("Standard_NC24s_v3", 4, "V100", 24, ETHERNET_25G),
    VmSize("Standard_NC24rs_v3", 4, "V100", 24, IB_EDR),
    VmSize("Standard_ND40rs_v2", 8, "V100", 40, IB_EDR),
    # T4
    VmSize("Standard_NC4as_T4_v3", 1, "T4", 4, ETHERNET_10G),
    VmSize("Standard_NC8as_T4_v3", 1, "T4", 8, ETHERNET_10G),
    VmSize("Standard_NC16as_T4_v3", 1, "T4", 16, ETHERNET_10G),
    VmSize("Standard_NC64as_T4_v3", 4, "T4", 64, ETHERNET_25G),
    # A100
    VmSize("Standard_NC24ads_A100_v4", 1, "A100", 24, ETHERNET_25G),
    VmSize("Standard_NC48ads_A100_v4", 2, "A100", 48, ETHERNET_40G),
    VmSize("Standard_NC96ads_A100_v4", 4, "A100", 96, ETHERNET_80G),
    VmSize("Standard_ND96asr_v4", 8, "A100", 96, IB_HDR_8X),
    VmSize("Standard_ND96amsr_A100_v4", 8, "A100", 96, IB_HDR_8X),
    # H100
    VmSize("Standard_NC40ads_H100_v5", 1, "H100", 40, ETHERNET_40G),
    VmSize("Standard_NC80adis_H100_v5", 2, "H100", 80, ETHERNET_80G),
    VmSize("Standard_ND96isr_H100_v5", 8, "H100", 96, IB_NDR_8X),
    # CPU sizes
    VmSize("Standard_D2s_v3", 0, None, 2, ETHERNET_10G),
    VmSize("Standard_D4s_v3", 0, None, 4, ETHERNET_10G),
    VmSize("Standard_D8s_v3", 0, None, 8, ETHERNET_10G),
    VmSize("Standard_D16s_v3", 0, None, 16, ETHERNET_10G),
    VmSize("Standard_D16s_v5", 0, None, 16, ETHERNET_10G),
    VmSize("Standard_F16s_v2", 0, None, 16, ETHERNET_10G),
    VmSize("Standard_F72s_v2", 0, None, 72, ETHERNET_25G),
    VmSize("Standard_HB120rs_v3", 0, None, 120, IB_HDR),
    VmSize("Standard_HC44rs", 0, None, 44, IB_EDR),
]

VM_SIZES: dict[str, VmSize] = {s.name.lower(): s for s in _SIZES}

# `vmSize: "local"` names this machine (the local engine's default).
LOCAL = "local"


def lookup_vm_size(name: str) -> VmSize | None:
    """The VM size called `name` (case-insensitive, as Azure treats it), or None if unknown."""
    return VM_SIZES.get(name.lower())


def known_vm_sizes() -> list[str]:
    """Every VM size name in the table, for error messages."""
    return [s.name for s in _SIZES]


def network_for(name: str) -> Network | None:
    """A network by its own name (`infiniband-edr-100g`) or by a VM size that has it."""
    if name in NETWORKS:
        return NETWORKS[name]
    size = lookup_vm_size(name)
    return size.network if size else None
