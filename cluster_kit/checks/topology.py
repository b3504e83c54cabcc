"""topo.gpu_nic (warn): which HCA is nearest each GPU, and whether NCCL is told to use it.

The facts are PCI paths: the probe resolves each GPU's `/sys/bus/pci/devices/<bus id>`
(the `topo` section) and each HCA's `/sys/class/infiniband/<hca>/device` (the
`rdma` section's `pci`) to the PCI functions from the root port down, with the
device's `numa_node`. An HCA is nearest a GPU when they share a bridge below the
root port (the same PCIe switch: GPUDirect RDMA stays inside the switch), else
when they sit on the same NUMA node (traffic crosses the root complex but not the
CPU interconnect). A GPU whose nearest HCAs are all missing from
`network.ib_hca`, or that has no HCA on its switch or NUMA node while the HCAs
span sockets (so one could have been local), warns: the job
runs, with its rails crossing sockets. Runs with the rdma port checks; only HCAs
of the fabric's link layer count (a storage NIC is not a rail).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    passed,
    plural,
    section,
    settings,
    warned,
)
from cluster_kit.checks.gpu_health import gpu_list, label
from cluster_kit.checks.rdma import LINK_LAYER, hca_facts, listed_hcas, port_checks_run

SWITCH = "same PCIe switch"
NUMA = "same NUMA node"


@dataclass(frozen=True)
class Nearest:
    """The HCAs nearest one GPU and how near they are (SWITCH, NUMA, or "" for none)."""

    gpu: str            # the GPU's index
    tier: str
    hcas: tuple[str, ...]


def pci_of(data: Any) -> Mapping[str, Any]:
    """A device's PCI facts ({} when the probe did not read them)."""
    return data if isinstance(data, Mapping) else {}


def shares_switch(a: list[str], b: list[str]) -> bool:
    """Whether two PCI paths (root port first) meet below the root port."""
    common = 0
    for left, right in zip(a, b):
        if left != right:
            break
        common += 1
    return common >= 2


def same_numa(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Both devices on one known NUMA node (-1: the platform does not say)."""
    node = str(a.get("numa_node") or "-1").strip()
    return node not in ("-1", "") and node == str(b.get("numa_node") or "").strip()


def rail_hcas(facts: Facts, fabric: Any) -> dict[str, Mapping[str, Any]]:
    """{hca: pci facts} of the HCAs with a PCI path (and, with a fabric, a port of its link layer)."""
    wanted = LINK_LAYER.get(str(fabric)) if fabric else None
    rails = {}
    for name, hca in hca_facts(facts).items():
        pci = pci_of(hca.get("pci"))
        layers = {str((port or {}).get("link_layer")) for port in (hca.get("ports") or {}).values()}
        if pci.get("path") and (wanted is None or wanted in layers):
            rails[name] = pci
    return rails


def gpu_devices(facts: Facts) -> dict[str, Mapping[str, Any]]:
    """{gpu index: pci facts} of the GPUs whose PCI path the probe resolved."""
    gpus = section(facts, "topo").get("gpus") or {}
    return {index: pci_of(pci) for index, pci in gpus.items() if pci_of(pci).get("path")}


def nearest_hcas(facts: Facts, fabric: Any = None) -> list[Nearest]:
    """For each GPU with a known PCI path: its nearest HCAs (same switch, else same NUMA node)."""
    rails = rail_hcas(facts, fabric)
    found = []
    for index, gpu in gpu_devices(facts).items():
        switch = tuple(name for name, pci in rails.items() if shares_switch(gpu["path"], list(pci["path"])))
        numa = tuple(name for name, pci in rails.items() if same_numa(gpu, pci))
        tier, hcas = (SWITCH, switch) if switch else (NUMA, numa) if numa else ("", ())
        found.append(Nearest(index, tier, hcas))
    return found


def affinity_order(facts: Facts, ports: list[str]) -> list[str]:
    """`ports` ("mlx5_3:1") reordered by GPU: GPU 0's nearest HCA's ports first, then GPU 1's
    nearest that is not taken yet, ...; HCAs near no GPU keep their order at the end."""
    by_gpu = sorted(nearest_hcas(facts), key=lambda near: (len(near.gpu), near.gpu))
    order = list(dict.fromkeys(hca for near in by_gpu for hca in near.hcas))
    rank = {hca: position for position, hca in enumerate(order)}
    return sorted(ports, key=lambda port: rank.get(port.partition(":")[0], len(rank)))


def gpu_name(index: str, gpus: list[Mapping[str, Any]]) -> str:
    """ "GPU 6 (00000000:BA:00.0)" when nvidia-smi listed it, else "GPU 6"."""
    gpu = next((g for g in gpus if str(g.get("index")) == index), None)
    return label(gpu) if gpu is not None else f"GPU {index}"


def numa_nodes(rails: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """The known NUMA nodes the HCAs sit on."""
    return {str(pci.get("numa_node")).strip() for pci in rails.values()} - {"-1", "", "None"}


def placement_problems(nearest: list[Nearest], listed: list[str], gpus: list[Mapping[str, Any]],
                       spans_sockets: bool) -> list[str]:
    """One line per GPU whose nearest HCAs ib_hca leaves out, or (when the HCAs span
    sockets, so that a local one was possible) without a local HCA."""
    problems = []
    for near in nearest:
        if not near.hcas:
            if spans_sockets:
                problems.append(f"{gpu_name(near.gpu, gpus)}: no HCA on its PCIe switch or NUMA node")
        elif listed and not set(near.hcas) & set(listed):
            problems.append(f"{gpu_name(near.gpu, gpus)}: nearest HCA {', '.join(near.hcas)} ({near.tier}) "
                            "is not in network.ib_hca")
    return problems


def check_gpu_nic(facts: Facts, profile: Profile) -> Finding | None:
    """topo.gpu_nic; None when the probe resolved no GPU's or no HCA's PCI path."""
    network = settings(profile, "network")
    nearest = nearest_hcas(facts, network.get("fabric"))
    if not nearest or not rail_hcas(facts, network.get("fabric")):
        return None
    listed = [name for name, _ in listed_hcas(network)]
    spans = len(numa_nodes(rail_hcas(facts, network.get("fabric")))) > 1
    problems = placement_problems(nearest, listed, gpu_list(facts), spans)
    if problems:
        missing = sorted({h for near in nearest for h in near.hcas if listed and h not in listed})
        add = f"add {', '.join(missing)} to network.ib_hca (`clusterkit init` lists HCAs by GPU affinity)" \
            if missing else "put a NIC on each socket's PCIe switches, or pin those GPUs' ranks to the NIC's socket"
        return warned("topo.gpu_nic", "; ".join(problems),
                      f"{add}: otherwise those GPUs reach a NIC through the root complex or across sockets "
                      "(`nvidia-smi topo -m`: NODE or SYS instead of PIX/PXB)")
    tiers = sorted({near.tier or "no local HCA" for near in nearest})
    return passed("topo.gpu_nic", f"{plural(len(nearest), 'GPU')}: nearest HCA listed ({', '.join(tiers)})")


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """topo.gpu_nic when the rdma port checks run (fabric infiniband/roce or ib_hca)."""
    if not port_checks_run(settings(profile, "network")):
        return []
    finding = check_gpu_nic(facts, profile)
    return [finding] if finding else []
