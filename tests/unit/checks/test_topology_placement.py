"""topo.gpu_nic findings written out whole and init's GPU-affinity order of ib_hca, on the
probe's facts of fake sysfs trees (tests/data/facts/ib-ok: PCIe switch k holds GPU k and
mlx5_k, NUMA node 0 for 0-3 and 1 for 4-7; ib-storage adds mlx5_8, an Ethernet storage
NIC on a root port of node 0; roce-ok: two HCAs on root ports of node 0), edited as other
machines lay them out."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.checks import evaluate, topology
from cluster_kit.checks.findings import Finding

DATA = Path(__file__).resolve().parents[2] / "data" / "facts"
TAIL = (": otherwise those GPUs reach a NIC through the root complex or across sockets "
        "(`nvidia-smi topo -m`: NODE or SYS instead of PIX/PXB)")


def load(name: str) -> dict[str, Any]:
    return copy.deepcopy(dict(json.loads((DATA / f"{name}.json").read_text())))


def profile(hcas: list[int], fabric: str = "infiniband") -> dict[str, Any]:
    return {"network": {"fabric": fabric, "ib_hca": [f"mlx5_{n}:1" for n in hcas]},
            "expect": {"gpus_per_node": 8}}


def topo(facts: dict[str, Any], prof: dict[str, Any]) -> Finding | None:
    return next((f for f in evaluate(facts, prof) if f.id == "topo.gpu_nic"), None)


def whole(f: Finding | None) -> tuple[str, str, str] | None:
    return None if f is None else (f.status, f.message, f.fix)


def not_listed(gpu: str, hcas: str, tier: str = "same PCIe switch") -> str:
    return f"{gpu}: nearest HCA {hcas} ({tier}) is not in network.ib_hca"


def test_a_storage_nic_of_another_link_layer_is_never_a_gpus_nearest() -> None:
    """ib-storage without mlx5_3: GPU 3 falls back to its NUMA node, where the InfiniBand
    HCAs are mlx5_0-2; the Ethernet storage NIC mlx5_8 there is not offered."""
    facts = load("ib-storage")
    del facts["rdma"]["hcas"]["mlx5_3"]
    near = {n.gpu: n for n in topology.nearest_hcas(facts, "infiniband")}["3"]
    assert (near.tier, near.hcas) == (topology.NUMA, ("mlx5_0", "mlx5_1", "mlx5_2"))
    assert whole(topo(facts, profile([4, 5, 6, 7]))) == (
        "warn",
        "; ".join([not_listed("GPU 0 (00000000:18:00.0)", "mlx5_0"), not_listed("GPU 1 (00000000:2A:00.0)", "mlx5_1"),
                   not_listed("GPU 2 (00000000:3A:00.0)", "mlx5_2"),
                   not_listed("GPU 3 (00000000:5D:00.0)", "mlx5_0, mlx5_1, mlx5_2", "same NUMA node")]),
        "add mlx5_0, mlx5_1, mlx5_2 to network.ib_hca (`clusterkit init` lists HCAs by GPU affinity)" + TAIL)


def test_no_hca_of_the_fabric_skips_the_check() -> None:
    """fabric roce on an InfiniBand node: rdma.link_layer says so; no HCA is a RoCE rail."""
    assert topo(load("ib-ok"), profile(list(range(8)), fabric="roce")) is None


def test_numa_node_minus_one_everywhere_is_no_numa_match() -> None:
    """A platform that does not say (numa_node -1, as in most VMs): roce-ok's HCAs sit on
    root ports, so no GPU shares a switch with one, and -1 = -1 is no NUMA match."""
    facts = load("roce-ok")
    for device in [*facts["topo"]["gpus"].values(), *(h["pci"] for h in facts["rdma"]["hcas"].values())]:
        device["numa_node"] = "-1"
    prof = {"network": {"fabric": "roce", "ib_hca": ["mlx5_0:1", "mlx5_1:1"]}, "expect": {}}
    assert whole(topo(facts, prof)) == ("pass", "8 GPUs: nearest HCA listed (no local HCA)", "")


@pytest.mark.parametrize("numa", ["-1", None, ""])
def test_an_hca_of_unknown_numa_node_is_no_second_socket(numa: str | None) -> None:
    """HCAs on node 0 (mlx5_0-3) and mlx5_7 of unknown node (-1, unreadable, empty): the
    HCAs do not span sockets, so GPUs 4-6 without a local HCA are a design, not a warning."""
    facts = load("ib-ok")
    for name in ("mlx5_4", "mlx5_5", "mlx5_6"):
        del facts["rdma"]["hcas"][name]
    facts["rdma"]["hcas"]["mlx5_7"]["pci"]["numa_node"] = numa
    assert whole(topo(facts, profile([0, 1, 2, 3, 7]))) == (
        "pass", "8 GPUs: nearest HCA listed (no local HCA, same PCIe switch)", "")


def test_gpus_without_a_local_hca_while_hcas_span_sockets_whole_finding() -> None:
    """mlx5_4-6 gone, mlx5_7 on a switch of NUMA node 2 (no GPU there): GPUs 4-7 have no
    local HCA, though HCAs sit on two nodes."""
    facts = load("ib-ok")
    hcas = facts["rdma"]["hcas"]
    for name in ("mlx5_4", "mlx5_5", "mlx5_6"):
        del hcas[name]
    hcas["mlx5_7"]["pci"]["path"] = ["0000:d4:01.0", "0000:d5:00.0", "0000:d6:01.0", "0000:dc:00.0"]
    hcas["mlx5_7"]["pci"]["numa_node"] = "2"
    assert whole(topo(facts, profile([0, 1, 2, 3, 7]))) == (
        "warn",
        "; ".join(f"GPU {i} (00000000:{bus}:00.0): no HCA on its PCIe switch or NUMA node"
                  for i, bus in ((4, "9A"), (5, "AB"), (6, "BA"), (7, "DB"))),
        "put a NIC on each socket's PCIe switches, or pin those GPUs' ranks to the NIC's socket" + TAIL)


def test_a_gpu_nvidia_smi_does_not_list_is_named_by_its_index() -> None:
    facts = load("ib-ok")
    facts["gpu"]["gpus"] = [gpu for gpu in facts["gpu"]["gpus"] if gpu["index"] != "6"]
    assert whole(topo(facts, profile([0, 1, 2, 3, 4, 5]))) == (
        "warn", not_listed("GPU 6", "mlx5_6") + "; " + not_listed("GPU 7 (00000000:DB:00.0)", "mlx5_7"),
        "add mlx5_6, mlx5_7 to network.ib_hca (`clusterkit init` lists HCAs by GPU affinity)" + TAIL)


# ---------------------------------------------------------------- affinity_order (clusterkit init)

def sixteen_gpus() -> dict[str, Any]:
    """A DGX-2-like board of 16 GPUs and 8 HCAs: GPUs 2k and 2k+1 share the PCIe switch of
    mlx5_(7-k) (the HCAs are numbered the other way round). The probe prints its facts with
    sorted keys, so the GPUs arrive as "0", "1", "10", ..., "15", "2", ..."""
    facts = load("ib-ok")
    eight = facts["topo"]["gpus"]
    gpus = {}
    for k in range(8):
        first = copy.deepcopy(eight[str(7 - k)])   # ib-ok's GPU 7-k sits on mlx5_(7-k)'s switch
        second = copy.deepcopy(first)
        root, switch, port, device = first["path"]          # e.g. 04:01.0, 05:00.0, 06:00.0, 18:00.0
        bus = int(device.split(":")[1], 16) + 1
        second["path"] = [root, switch, port.replace(":00.0", ":02.0"), f"0000:{bus:02x}:00.0"]
        gpus[str(2 * k)], gpus[str(2 * k + 1)] = first, second
    facts["topo"]["gpus"] = gpus
    return dict(json.loads(json.dumps(facts, sort_keys=True)))


def test_affinity_order_follows_the_gpu_numbers_not_their_text() -> None:
    facts = sixteen_gpus()
    assert list(facts["topo"]["gpus"])[:3] == ["0", "1", "10"]
    ports = [f"mlx5_{k}:1" for k in range(8)]
    assert topology.affinity_order(facts, ports) == [f"mlx5_{k}:1" for k in (7, 6, 5, 4, 3, 2, 1, 0)]


def test_affinity_order_puts_hcas_near_no_gpu_last_and_takes_bare_hca_names() -> None:
    """ib-storage: mlx5_8 is nearest no GPU (each has an HCA on its switch)."""
    ports = ["mlx5_8:1", "mlx5_3", "mlx5_1:1", "mlx5_0:1"]
    assert topology.affinity_order(load("ib-storage"), ports) == ["mlx5_0:1", "mlx5_1:1", "mlx5_3", "mlx5_8:1"]
