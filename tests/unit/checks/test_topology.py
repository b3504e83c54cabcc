"""topo.gpu_nic on probe facts of fake sysfs trees: tests/unit/node/test_probe.py lays out
a DGX H100-like board (PCIe switch k: GPU k and mlx5_k below root port k; GPUs and HCAs
0-3 on NUMA node 0, 4-7 on node 1) as /sys/devices paths behind /sys/bus/pci/devices
and /sys/class/infiniband/<hca>/device links."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from cluster_kit.checks import evaluate, topology
from cluster_kit.checks.findings import Finding

DATA = Path(__file__).resolve().parents[2] / "data" / "facts"


def profile(hcas: range | list[int] = range(8), fabric: str = "infiniband") -> dict[str, Any]:
    return {"network": {"fabric": fabric, "ib_hca": [f"mlx5_{n}:1" for n in hcas]},
            "expect": {"gpus_per_node": 8}}


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((DATA / f"{name}.json").read_text()))


def topo(facts: dict[str, Any], prof: dict[str, Any] | None = None) -> Finding | None:
    return next((f for f in evaluate(facts, prof or profile()) if f.id == "topo.gpu_nic"), None)


def test_real_sysfs_layout_pairs_each_gpu_with_the_hca_on_its_switch() -> None:
    nearest = topology.nearest_hcas(load("ib-ok"), "infiniband")
    assert [(n.gpu, n.tier, n.hcas) for n in nearest] == [
        (str(i), topology.SWITCH, (f"mlx5_{i}",)) for i in range(8)]
    facts = load("ib-ok")
    assert facts["topo"]["gpus"]["6"]["path"] == ["0000:64:01.0", "0000:65:00.0", "0000:66:00.0", "0000:ba:00.0"]
    assert facts["rdma"]["hcas"]["mlx5_6"]["pci"]["path"][:2] == ["0000:64:01.0", "0000:65:00.0"]


def test_healthy_placement_passes() -> None:
    found = topo(load("ib-ok"))
    assert found is not None and (found.status, found.message) == (
        "pass", "8 GPUs: nearest HCA listed (same PCIe switch)")


def test_a_gpu_whose_nearest_hca_is_not_listed_warns_exactly_this_check() -> None:
    facts = load("ib-ok")
    bad = {f.id: f for f in evaluate(facts, profile(range(6))) if f.status != "pass"}
    assert list(bad) == ["topo.gpu_nic"]
    assert bad["topo.gpu_nic"].status == "warn"
    assert bad["topo.gpu_nic"].message == (
        "GPU 6 (00000000:BA:00.0): nearest HCA mlx5_6 (same PCIe switch) is not in network.ib_hca; "
        "GPU 7 (00000000:DB:00.0): nearest HCA mlx5_7 (same PCIe switch) is not in network.ib_hca")
    assert bad["topo.gpu_nic"].fix.startswith("add mlx5_6, mlx5_7 to network.ib_hca")


def test_without_a_switch_local_hca_the_numa_node_decides() -> None:
    facts = load("ib-nohca")           # mlx5_3 is gone: GPU 3 falls back to its NUMA node
    near = {n.gpu: n for n in topology.nearest_hcas(facts, "infiniband")}["3"]
    assert (near.tier, near.hcas) == (topology.NUMA, ("mlx5_0", "mlx5_1", "mlx5_2"))
    found = topo(facts, profile([0, 1, 2, 4, 5, 6, 7]))
    assert found is not None and found.status == "pass"
    found = topo(facts, profile([4, 5, 6, 7]))
    assert found is not None and found.status == "warn"
    assert "GPU 3 (00000000:5D:00.0): nearest HCA mlx5_0, mlx5_1, mlx5_2 (same NUMA node)" in found.message


def test_hcas_on_both_sockets_but_none_local_to_a_gpu_warns() -> None:
    facts = copy.deepcopy(load("ib-ok"))
    hcas = facts["rdma"]["hcas"]
    for name in ("mlx5_4", "mlx5_5", "mlx5_6"):
        del hcas[name]
    hcas["mlx5_7"]["pci"]["path"] = ["0000:d4:01.0", "0000:d5:00.0", "0000:d6:01.0", "0000:dc:00.0"]
    hcas["mlx5_7"]["pci"]["numa_node"] = "2"       # NUMA node 2: no GPU there
    found = topo(facts, profile([0, 1, 2, 3, 7]))
    assert found is not None and found.status == "warn"
    assert found.message.startswith("GPU 4 (00000000:9A:00.0): no HCA on its PCIe switch or NUMA node")


def test_all_hcas_on_one_socket_is_a_design_not_a_warning() -> None:
    facts = copy.deepcopy(load("ib-ok"))
    for name in ("mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"):
        del facts["rdma"]["hcas"][name]
    found = topo(facts, profile(range(4)))
    assert found is not None and found.status == "pass"
    assert found.message == "8 GPUs: nearest HCA listed (no local HCA, same PCIe switch)"


def test_storage_nics_of_another_link_layer_are_not_rails() -> None:
    assert "mlx5_8" not in topology.rail_hcas(load("ib-storage"), "infiniband")
    assert "mlx5_8" in topology.rail_hcas(load("ib-storage"), None)


def test_skipped_without_pci_facts_or_outside_rdma_profiles() -> None:
    facts = copy.deepcopy(load("ib-ok"))
    del facts["topo"]
    assert topo(facts) is None
    assert topo(load("ib-ok"), {"network": {"fabric": "ethernet"}, "expect": {}}) is None
    assert topo(load("smi-fail")) is None


def test_shares_switch_needs_a_bridge_below_the_root_port() -> None:
    gpu = ["0000:04:01.0", "0000:05:00.0", "0000:06:00.0", "0000:18:00.0"]
    assert topology.shares_switch(gpu, ["0000:04:01.0", "0000:05:00.0", "0000:06:01.0", "0000:0c:00.0"])
    assert not topology.shares_switch(gpu, ["0000:04:01.0", "0000:0c:00.0"])
    assert not topology.shares_switch(gpu, ["0000:14:01.0", "0000:15:00.0"])
