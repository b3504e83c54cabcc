"""Probe facts -> flat, dotted, stable fact names (audit tables, drift, baselines).

`flatten` keeps values as the node reported them (strings; counts as decimal
strings, booleans as "true"/"false"); unreadable values are left out rather
than invented. Names are part of the product contract (SPEC "Audit JSON"):
add new ones, never rename.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from cluster_kit.checks.gpu_health import FAILING_REASONS, RESET_XIDS
from cluster_kit.checks.rdma import loaded_peermem
from cluster_kit.checks.topology import nearest_hcas

FlatFacts = dict[str, str]

# Facts that differ from node to node by nature, so audit leaves them out of drift.
PER_NODE_FACTS: tuple[str, ...] = (
    r"hostname",
    r"gpu\.\d+\.uuid",
    r"gpu\.\d+\.pci_bus_id",
    r"rdma\.[^.]+\.node_guid",
    r"rdma\.[^.]+\.sys_image_guid",
    r"rdma\.[^.]+\.[^.]+\.lid",
    r"rdma\.[^.]+\.[^.]+\.gid\.\d+",
    r"net\..+\.address",
    # Error counters grow on their own; audit shows their growth since a baseline instead.
    r"rdma\.[^.]+\.[^.]+\.counters\..+",
    r"xid\.count",
)
_PER_NODE = re.compile("|".join(f"(?:{pattern})" for pattern in PER_NODE_FACTS))

PORT_KEYS = ("state", "phys_state", "rate", "link_layer", "lid", "sm_lid")
HCA_KEYS = ("fw_ver", "board_id", "hca_type", "node_guid", "sys_image_guid")
NET_KEYS = ("operstate", "carrier", "mtu", "speed", "address")
GPU_KEYS = ("name", "uuid", "pci_bus_id", "memory_total")
# Health facts that hold still on a healthy GPU (temperature, clock reasons and the
# idle PCIe generation change by the minute and would drown baselines in noise).
GPU_HEALTH_KEYS = ("persistence_mode", "ecc_mode_current", "ecc_errors_uncorrected_volatile_total",
                   "ecc_errors_uncorrected_aggregate_total", "retired_pages_pending",
                   "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
                   "remapped_rows_failure", "pcie_link_gen_max", "pcie_link_width_current",
                   "pcie_link_width_max", "vbios_version", "clocks_applications_graphics",
                   "clocks_applications_memory", "gpu_recovery_action")
HCA_PCI_KEYS = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width", "numa_node")
NOT_REPORTED = ("[N/A]", "N/A", "[Not Supported]")
TORCH_KEYS = ("version", "cuda", "nccl", "cuda_available", "device_count", "distributed_nccl")
ZERO_GID = re.compile(r"^[0:]+$")


def is_per_node(fact: str) -> bool:
    """Whether a flat fact differs per node by nature (GUIDs, MACs, GPU UUIDs, GIDs, ...)."""
    return _PER_NODE.fullmatch(fact) is not None


def text(value: Any) -> str | None:
    """A fact value as a string: booleans "true"/"false", None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def put(flat: FlatFacts, name: str, value: Any) -> None:
    """flat[name] = text(value), unless the node did not report it."""
    shown = text(value)
    if shown is not None and shown != "":
        flat[name] = shown


def mapping(value: Any) -> Mapping[str, Any]:
    """`value` if it is a mapping, else {} (a section the probe did not send)."""
    return value if isinstance(value, Mapping) else {}


def put_keys(flat: FlatFacts, prefix: str, data: Mapping[str, Any], keys: Iterable[str]) -> None:
    """prefix.key for each of `keys` the node reported."""
    for key in keys:
        put(flat, f"{prefix}.{key}", data.get(key))


def flatten_os(flat: FlatFacts, os_facts: Mapping[str, Any]) -> None:
    """os.kernel, os.release, os.arch, os.python."""
    put(flat, "os.kernel", os_facts.get("kernel"))
    put(flat, "os.release", os_facts.get("os_release"))
    put(flat, "os.arch", os_facts.get("arch"))
    put(flat, "os.python", os_facts.get("python"))


def flatten_gpu(flat: FlatFacts, gpu: Mapping[str, Any]) -> None:
    """gpu.count, gpu.model, gpu.driver, gpu.cuda and gpu.<i>.* per GPU."""
    gpus = [mapping(g) for g in gpu.get("gpus") or []]
    put(flat, "gpu.count", len(gpus))
    put(flat, "gpu.model", ", ".join(sorted({str(g.get("name")) for g in gpus if g.get("name")})))
    put(flat, "gpu.driver", gpu.get("driver"))
    put(flat, "gpu.cuda", gpu.get("cuda"))
    for position, one in enumerate(gpus):
        put_keys(flat, f"gpu.{one.get('index', position)}", one, GPU_KEYS)
        reported = {key: one.get(key) for key in GPU_HEALTH_KEYS if one.get(key) not in NOT_REPORTED}
        put_keys(flat, f"gpu.{one.get('index', position)}", reported, GPU_HEALTH_KEYS)
        put(flat, f"gpu.{one.get('index', position)}.slowdown", slowdown(one.get("clocks_event_reasons_active")))


def slowdown(active: Any) -> str | None:
    """The failing clock-event reasons of a clocks_event_reasons.active mask ("none" when
    clear): steady on a healthy GPU, unlike the mask itself, which follows the load."""
    try:
        bits = int(str(active), 0)
    except ValueError:
        return None
    names = [name.lower().replace(" ", "_") for bit, name in FAILING_REASONS.items() if bits & bit]
    return ",".join(names) or "none"


def flatten_nccl(flat: FlatFacts, nccl: Mapping[str, Any]) -> None:
    """nccl.version, nccl.path, nccl.source (the library a job loads first)."""
    put_keys(flat, "nccl", nccl, ("version", "path", "source"))


def flatten_port(flat: FlatFacts, prefix: str, port: Mapping[str, Any]) -> None:
    """rdma.<hca>.<port>.{state,...} and its populated GIDs (gid.<i>, .type, .ndev)."""
    put_keys(flat, prefix, port, PORT_KEYS)
    for name, count in mapping(port.get("counters")).items():
        put(flat, f"{prefix}.counters.{name}", count)
    types, ndevs = mapping(port.get("gid_types")), mapping(port.get("gid_ndevs"))
    for index, gid in mapping(port.get("gids")).items():
        if ZERO_GID.match(str(gid)) and index not in types:
            continue
        put(flat, f"{prefix}.gid.{index}", gid)
        put(flat, f"{prefix}.gid.{index}.type", types.get(index))
        put(flat, f"{prefix}.gid.{index}.ndev", ndevs.get(index))


def flatten_rdma(flat: FlatFacts, rdma: Mapping[str, Any]) -> None:
    """rdma.hcas (names) and rdma.<hca>.* / rdma.<hca>.<port>.*."""
    hcas = mapping(rdma.get("hcas"))
    put(flat, "rdma.hcas", ",".join(hcas))
    for name, hca_data in hcas.items():
        hca = mapping(hca_data)
        put_keys(flat, f"rdma.{name}", hca, HCA_KEYS)
        put_keys(flat, f"rdma.{name}.pci", mapping(hca.get("pci")), HCA_PCI_KEYS)
        for number, port in mapping(hca.get("ports")).items():
            flatten_port(flat, f"rdma.{name}.{number}", mapping(port))


def flatten_xid(flat: FlatFacts, xid: Mapping[str, Any]) -> None:
    """xid.source (dmesg | journal), xid.count (Xid lines the log holds) and xid.reset_codes
    (the distinct Xids of the log that need a reset or RMA, "none" when there is none)."""
    put(flat, "xid.source", xid.get("source"))
    put(flat, "xid.count", xid.get("total"))
    codes = {event.get("xid") for event in xid.get("events") or [] if isinstance(event, Mapping)}
    reset = sorted(code for code in RESET_XIDS if code in codes)
    put(flat, "xid.reset_codes", ",".join(str(code) for code in reset) or "none")


def flatten_topo(flat: FlatFacts, topo: Mapping[str, Any]) -> None:
    """gpu.<i>.numa_node: the NUMA node of each GPU's PCI function."""
    for index, pci in mapping(topo.get("gpus")).items():
        put(flat, f"gpu.{index}.numa_node", mapping(pci).get("numa_node"))


def flatten_nvlink(flat: FlatFacts, nvlink: Mapping[str, Any]) -> None:
    """gpu.<i>.nvlinks_active (of the links nvidia-smi lists; only GPUs that have NVLinks)."""
    for index, gpu_data in mapping(nvlink.get("gpus")).items():
        gpu = mapping(gpu_data)
        links = mapping(gpu.get("links"))
        if links or gpu.get("all_inactive"):
            active = sum(1 for state in links.values() if state != "inactive")
            put(flat, f"gpu.{index}.nvlinks_active", f"{active}/{len(links)}" if links else "0")


def flatten_gpu_nic(flat: FlatFacts, facts: Mapping[str, Any]) -> None:
    """gpu.<i>.nic: the HCAs nearest each GPU ("mlx5_6", "none"), with how near
    ("mlx5_6 (same PCIe switch)"), the GPU<->NIC map audit compares across nodes."""
    for near in nearest_hcas(facts):
        shown = f"{','.join(near.hcas)} ({near.tier})" if near.hcas else "none"
        put(flat, f"gpu.{near.gpu}.nic", shown)


def flatten_net(flat: FlatFacts, net: Mapping[str, Any]) -> None:
    """net.<if>.{operstate,carrier,mtu,speed,address}."""
    for name, interface in mapping(net.get("interfaces")).items():
        put_keys(flat, f"net.{name}", mapping(interface), NET_KEYS)


def peermem_value(peermem: Mapping[str, Any]) -> str:
    """The loaded peer-memory module(s), or "none"."""
    return ",".join(loaded_peermem(peermem)) or "none"


def flatten_peermem(flat: FlatFacts, peermem: Mapping[str, Any]) -> None:
    """rdma.peermem: the loaded peer-memory module(s), or "none"."""
    put(flat, "rdma.peermem", peermem_value(peermem))


def flatten_memlock(flat: FlatFacts, memlock: Mapping[str, Any]) -> None:
    """sys.memlock and sys.memlock_hard (KiB or "unlimited")."""
    put(flat, "sys.memlock", memlock.get("soft_kib"))
    put(flat, "sys.memlock_hard", memlock.get("hard_kib"))


def flatten_iommu(flat: FlatFacts, iommu: Mapping[str, Any]) -> None:
    """iommu.groups, iommu.cmdline."""
    put_keys(flat, "iommu", iommu, ("groups", "cmdline"))


def flatten_torch(flat: FlatFacts, torch: Mapping[str, Any]) -> None:
    """torch.* (--deep only)."""
    put_keys(flat, "torch", torch, TORCH_KEYS)


# One flattener per probe section, in the order the flat facts are built.
FLATTENERS = {
    "os": flatten_os, "gpu": flatten_gpu, "topo": flatten_topo, "nvlink": flatten_nvlink, "xid": flatten_xid, "nccl": flatten_nccl, "rdma": flatten_rdma, "net": flatten_net,
    "peermem": flatten_peermem, "memlock": flatten_memlock, "iommu": flatten_iommu, "torch": flatten_torch,
}
SECTIONS = tuple(FLATTENERS)


def flatten_section(flat: FlatFacts, name: str, data: Mapping[str, Any]) -> None:
    """One probe section's flat facts (only `<name>.status`/`.error` when it is not ok)."""
    status = data.get("status")
    if status == "skipped":
        return
    if status != "ok":
        put(flat, f"{name}.status", status or "missing")
        put(flat, f"{name}.error", data.get("error"))
        return
    FLATTENERS[name](flat, data)


def flatten(facts: Mapping[str, Any]) -> FlatFacts:
    """Probe facts (docs/architecture.md "Probe facts") -> {dotted name: string value}.

    A section that is absent or failed yields `<section>.status` and
    `<section>.error` (e.g. gpu.status = "error"), so drift shows it.
    """
    flat: FlatFacts = {}
    put(flat, "hostname", facts.get("hostname"))
    for name in SECTIONS:
        flatten_section(flat, name, mapping(facts.get(name)))
    flatten_gpu_nic(flat, facts)
    return flat


def comparable(flat: Mapping[str, str]) -> FlatFacts:
    """The flat facts drift compares: everything but PER_NODE_FACTS."""
    return {name: value for name, value in flat.items() if not is_per_node(name)}
