"""facts.flatten and the per-node facts, on facts the real probe printed for fake nodes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.fleet.facts import comparable, flatten, is_per_node

FACTS_DIR = Path(__file__).resolve().parents[2] / "data" / "facts"


def load(name: str) -> dict[str, Any]:
    """The committed probe facts of one fake node."""
    return dict(json.loads((FACTS_DIR / f"{name}.json").read_text()))


def test_spec_fact_names_are_all_there() -> None:
    flat = flatten(load("ib-ok"))
    assert flat["gpu.count"] == "8"
    assert flat["gpu.model"] == "NVIDIA H100 80GB HBM3"
    assert flat["gpu.driver"] == "550.54.15"
    assert flat["gpu.cuda"] == "12.4"
    assert flat["nccl.version"] == load("ib-ok")["nccl"]["version"]
    assert flat["rdma.peermem"] == "nvidia_peermem"
    assert flat["sys.memlock"] == "unlimited"
    assert flat["os.kernel"] == load("ib-ok")["os"]["kernel"]
    assert flat["os.release"] == "Ubuntu 22.04.4 LTS"
    assert flat["rdma.mlx5_0.fw_ver"] == "28.39.1002"
    assert flat["rdma.mlx5_0.1.state"] == "4: ACTIVE"
    assert flat["rdma.mlx5_0.1.phys_state"] == "5: LinkUp"
    assert flat["rdma.mlx5_0.1.rate"] == "400 Gb/sec (4X NDR)"
    assert flat["rdma.mlx5_0.1.link_layer"] == "InfiniBand"
    assert flat["rdma.hcas"] == ",".join(f"mlx5_{n}" for n in range(8))
    assert flat["net.eth0.operstate"] == "up"
    assert flat["iommu.cmdline"] == "iommu=pt intel_iommu=on"


def test_values_are_all_strings() -> None:
    for name in sorted(p.stem for p in FACTS_DIR.glob("*.json")):
        assert all(isinstance(v, str) and v for v in flatten(load(name)).values()), name


def test_roce_gids_are_flattened_with_type_and_netdev_but_not_empty_ones() -> None:
    flat = flatten(load("roce-ok"))
    assert flat["rdma.mlx5_0.1.gid.3"] == "0000:0000:0000:0000:0000:ffff:0a00:0001"
    assert flat["rdma.mlx5_0.1.gid.3.type"] == "RoCE v2"
    assert flat["rdma.mlx5_0.1.gid.3.ndev"] == "ens1np0"
    assert "rdma.mlx5_0.1.gid.5" not in flat  # all-zero, unpopulated


def test_a_down_port_and_a_missing_hca_show_up_as_different_values() -> None:
    assert flatten(load("ib-portdown"))["rdma.mlx5_3.1.state"] == "1: DOWN"
    flat = flatten(load("ib-nohca"))
    assert "mlx5_3" not in flat["rdma.hcas"]
    assert not [name for name in flat if name.startswith("rdma.mlx5_3.")]


def test_failed_sections_become_status_and_error_facts() -> None:
    flat = flatten(load("smi-fail"))
    assert flat["gpu.status"] == "error"
    assert flat["gpu.error"].startswith("NVIDIA-SMI has failed")
    assert "gpu.count" not in flat
    assert flatten(load("smi-missing"))["gpu.status"] == "absent"
    assert flatten(load("no-rdma"))["rdma.status"] == "absent"
    assert flatten(load("no-rdma"))["rdma.peermem"] == "none"


def test_deep_torch_facts_only_when_probed() -> None:
    facts = load("ib-ok")
    assert not [name for name in flatten(facts) if name.startswith("torch.")]
    facts["torch"] = {"status": "ok", "version": "2.3.0", "cuda": "12.1", "cuda_available": True,
                      "device_count": 8, "nccl": "2.20.5", "distributed_nccl": True}
    flat = flatten(facts)
    assert (flat["torch.version"], flat["torch.cuda_available"], flat["torch.device_count"]) == ("2.3.0", "true", "8")


@pytest.mark.parametrize("fact", [
    "hostname", "gpu.3.uuid", "gpu.3.pci_bus_id", "rdma.mlx5_0.node_guid", "rdma.mlx5_0.sys_image_guid",
    "rdma.mlx5_0.1.gid.3", "rdma.mlx5_0.1.lid", "net.eth0.address", "net.eth0.100.address",
])
def test_per_node_facts(fact: str) -> None:
    assert is_per_node(fact)


@pytest.mark.parametrize("fact", [
    "gpu.driver", "gpu.count", "gpu.3.name", "rdma.mlx5_0.fw_ver", "rdma.mlx5_0.1.state",
    "rdma.mlx5_0.1.gid.3.type", "rdma.mlx5_0.1.gid.3.ndev", "net.eth0.mtu", "nccl.version", "sys.memlock",
])
def test_comparable_facts(fact: str) -> None:
    assert not is_per_node(fact)


def test_two_healthy_nodes_differ_only_in_per_node_facts() -> None:
    a, b = load("ib-ok"), load("ib-ok")
    b["hostname"] = "gpu002"
    b["rdma"]["hcas"]["mlx5_0"]["node_guid"] = "b859:9f03:00d4:9a00"
    b["rdma"]["hcas"]["mlx5_0"]["ports"]["1"]["gids"]["0"] = "fe80:0000:0000:0000:b859:9f03:00d4:9a00"
    b["gpu"]["gpus"][0]["uuid"] = "GPU-ffffffff-7b5a-4c1e-9f2d-0a1b2c3d4e00"
    b["net"]["interfaces"]["eth0"]["address"] = "3c:ec:ef:10:20:99"
    assert flatten(a) != flatten(b)
    assert comparable(flatten(a)) == comparable(flatten(b))


def test_vbios_persistence_application_clocks_and_the_gpu_nic_map_drift() -> None:
    """The facts of "More hardware checks" that must be the same on every node of a fleet."""
    from cluster_kit.fleet.audit import compute_drift

    nodes = {f"gpu{i:03d}": load("ib-ok") for i in range(1, 4)}
    odd = nodes["gpu003"]
    odd["gpu"]["gpus"][2].update(vbios_version="96.00.5E.00.01", persistence_mode="Disabled",
                                  clocks_applications_graphics="1755 MHz")
    odd["rdma"]["hcas"]["mlx5_2"]["pci"]["path"] = ["0000:f4:01.0", "0000:2c:00.0"]
    odd["rdma"]["hcas"]["mlx5_2"]["pci"]["current_link_width"] = "8"
    flat = {node: flatten(facts) for node, facts in nodes.items()}
    assert flat["gpu001"]["gpu.2.vbios_version"] == "96.00.89.00.01"
    assert flat["gpu001"]["gpu.2.nic"] == "mlx5_2 (same PCIe switch)"
    assert flat["gpu003"]["gpu.2.nic"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3 (same NUMA node)"
    drift = {entry["fact"]: entry["outliers"] for entry in compute_drift(flat)}
    assert drift == {
        "gpu.2.vbios_version": {"gpu003": "96.00.5E.00.01"},
        "gpu.2.persistence_mode": {"gpu003": "Disabled"},
        "gpu.2.clocks_applications_graphics": {"gpu003": "1755 MHz"},
        "gpu.2.nic": {"gpu003": "mlx5_0,mlx5_1,mlx5_2,mlx5_3 (same NUMA node)"},
        "rdma.mlx5_2.pci.current_link_width": {"gpu003": "8"},
    }


def test_nvlinks_active_only_for_gpus_with_nvlinks() -> None:
    assert flatten(load("nvlink-down"))["gpu.4.nvlinks_active"] == "17/18"
    assert flatten(load("nvlink-down"))["gpu.0.nvlinks_active"] == "18/18"
    assert not any(key.endswith("nvlinks_active") for key in flatten(load("ib-ok")))
