"""Degraded-but-up hardware on the dev cluster: each planted fault fails exactly its check.

The nodes gpu-ecc, gpu-x8, gpu-throttle, gpu-xid, ib-flap, gpu-reboot, nic-x8, nic-gen4, nvlink-down, topo-far and gpu-powercap
(scripts/devcluster/nodes.tsv) run a real sshd in their own namespace; their
stand-in nvidia-smi answers the probe's real query fields from gpus.csv, their
stand-in nvidia-smi also answers `nvlink -s` / `nvlink -e`, their stand-in dmesg prints the planted Xid lines, their HCA ports carry sysfs
counter files, and their HCAs' PCI functions sysfs link attributes (scripts/devcluster/fakehw.py). The CLI runs as a real process and reaches them over SSH.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jobcli import clusterkit, ssh_section, write_yaml

pytestmark = pytest.mark.integration

DEGRADED = {"gpu-ecc": "gpu.ecc", "gpu-x8": "gpu.pcie_link", "gpu-throttle": "gpu.throttle",
            "gpu-xid": "gpu.xid", "ib-flap": "rdma.port_errors", "gpu-reboot": "gpu.recovery_action",
            "nic-x8": "rdma.nic_pcie", "nic-gen4": "rdma.nic_pcie", "nvlink-down": "gpu.nvlink"}
WARNED = {"topo-far": "topo.gpu_nic"}
HEALTHY = ["gpu-powercap"]
HEALTH_IDS = {"gpu.ecc", "gpu.pcie_link", "gpu.throttle", "gpu.xid", "rdma.port_errors", "gpu.recovery_action",
              "rdma.nic_pcie", "gpu.nvlink", "topo.gpu_nic"}
EXPECT = {"gpus_per_node": 8, "gpu_model": "H100", "min_driver": "535.104", "ib_rate_gbps": 400,
          "peermem": True}
CLI_TIMEOUT = 120


def own_ssh_files(folder: Path, dev_cluster: Any) -> dict[str, str]:
    """An ssh_config (HostName per node) and known_hosts for these nodes only.

    The shared /etc/hosts and $DIR/ssh/known_hosts are rewritten by every checkout's
    `up` from its own nodes.tsv; these files keep this module independent of that.
    """
    config, known = [], []
    for node in [*DEGRADED, *WARNED, *HEALTHY]:
        address = dev_cluster.nodes[node]
        config.append(f"Host {node}\n    HostName {address}\n")
        key = (dev_cluster.state_dir / "ssh" / "hostkeys" / f"{node}.pub").read_text().split()[:2]
        known.append(f"{node},{address} {' '.join(key)}\n")
    (folder / "ssh_config").write_text("".join(config))
    (folder / "known_hosts").write_text("".join(known))
    return {"config_file": str(folder / "ssh_config"), "known_hosts": str(folder / "known_hosts")}


def profile(folder: Path, dev_cluster: Any, **expect: Any) -> Path:
    ssh = ssh_section(dev_cluster, connect_timeout=3, command_timeout=30, **own_ssh_files(folder, dev_cluster))
    return write_yaml(folder / "hw.yaml", {
        "name": "hw-test", "ssh": ssh,
        "network": {"fabric": "infiniband", "ib_hca": [f"mlx5_{i}:1" for i in range(4)]},
        "expect": dict(EXPECT, **expect)})


def run_json(dev_cluster: Any, path: Path, *args: str) -> tuple[dict[str, Any], int]:
    done = clusterkit(dev_cluster, *args, "--profile", str(path), cwd=path.parent, timeout=CLI_TIMEOUT)
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout), done.returncode


@pytest.fixture(scope="module")
def report(dev_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], int]:
    path = profile(tmp_path_factory.mktemp("hw"), dev_cluster)
    return run_json(dev_cluster, path, "preflight", "--nodes", ",".join([*DEGRADED, *WARNED, *HEALTHY]), "--json")


def not_passing(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in entry["checks"] if c["status"] != "pass"}


@pytest.mark.parametrize(("node", "check_id"), sorted(DEGRADED.items()))
def test_each_degraded_node_fails_exactly_its_check(report: tuple[dict[str, Any], int], node: str,
                                                     check_id: str) -> None:
    entry = {e["node"]: e for e in report[0]["nodes"]}[node]
    assert entry["status"] == "fail"
    assert list(not_passing(entry)) == [check_id]
    assert HEALTH_IDS <= {c["id"] for c in entry["checks"]}
    assert not_passing(entry)[check_id]["fix"]


@pytest.mark.parametrize(("node", "check_id"), sorted(WARNED.items()))
def test_each_misplaced_node_warns_exactly_its_check(report: tuple[dict[str, Any], int], node: str,
                                                     check_id: str) -> None:
    entry = {e["node"]: e for e in report[0]["nodes"]}[node]
    assert entry["status"] == "warn"
    assert list(not_passing(entry)) == [check_id]
    assert not_passing(entry)[check_id]["message"] == (
        "GPU 6 (00000000:BA:00.0): nearest HCA mlx5_4 (same PCIe switch) is not in network.ib_hca; "
        "GPU 7 (00000000:DB:00.0): nearest HCA mlx5_4 (same PCIe switch) is not in network.ib_hca")
    assert not_passing(entry)[check_id]["fix"].startswith("add mlx5_4 to network.ib_hca")


def test_messages_name_the_gpu_or_port(report: tuple[dict[str, Any], int]) -> None:
    entries = {e["node"]: not_passing(e) for e in report[0]["nodes"]}
    assert "GPU 2 (00000000:3A:00.0): 2 uncorrected volatile ECC errors, row remap pending" in (
        entries["gpu-ecc"]["gpu.ecc"]["message"])
    assert entries["gpu-x8"]["gpu.pcie_link"]["message"] == "GPU 5 (00000000:AB:00.0): PCIe link x8, capable of x16"
    assert "GPU 3 (00000000:5D:00.0): HW slowdown + HW thermal slowdown" in (
        entries["gpu-throttle"]["gpu.throttle"]["message"])
    # The kernel log holds nothing from before boot: on a machine up for less than the
    # planted 10 minutes, the stand-in dmesg stamps the line at boot.
    assert f"Xid 79 on GPU 1 (00000000:2A:00.0) {planted_age(600)}" in entries["gpu-xid"]["gpu.xid"]["message"]
    assert entries["gpu-reboot"]["gpu.recovery_action"]["message"] == "GPU 6 (00000000:BA:00.0) asks for: Node Reboot"
    assert entries["nvlink-down"]["gpu.nvlink"]["message"] == "GPU 4 (00000000:9A:00.0): NVLink 7 inactive"
    assert entries["nic-x8"]["rdma.nic_pcie"]["message"] == "mlx5_2 (0000:99:02.0): PCIe x8 of x16"
    assert entries["nic-gen4"]["rdma.nic_pcie"]["message"] == "mlx5_1 (0000:39:01.0): PCIe 16 GT/s of 32 GT/s"
    assert "mlx5_1 port 1: symbol_error 4021 (> 100), link_error_recovery 112 (> 10), link_downed 37 (> 5)" == (
        entries["ib-flap"]["rdma.port_errors"]["message"])


def planted_age(seconds: float) -> str:
    """How the check words a kernel-log line planted `seconds` ago, on this machine."""
    from cluster_kit.checks.gpu_health import ago

    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return ago(min(seconds, uptime))


def test_power_capped_node_with_pre_535_names_passes(report: tuple[dict[str, Any], int]) -> None:
    entry = {e["node"]: e for e in report[0]["nodes"]}["gpu-powercap"]
    assert entry["status"] == "pass", not_passing(entry)
    assert HEALTH_IDS <= {c["id"] for c in entry["checks"]}
    assert report[0]["summary"] == {"pass": 1, "warn": len(WARNED), "fail": len(DEGRADED), "unreachable": 0}
    assert report[1] == 1


def test_xid_window_from_the_profile(dev_cluster: Any, tmp_path: Path) -> None:
    path = profile(tmp_path, dev_cluster, xid_window="5m")
    data, code = run_json(dev_cluster, path, "preflight", "--nodes", "gpu-xid", "--json")
    checks = {c["id"]: c for c in data["nodes"][0]["checks"]}
    assert (code, checks["gpu.xid"]["status"]) == (0, "pass")
    assert checks["gpu.xid"]["message"] == "no Xid needing a reset in the last 5m (dmesg; other Xids: 13)"


def test_audit_json_carries_the_new_facts_and_counter_growth(dev_cluster: Any, tmp_path: Path) -> None:
    path = profile(tmp_path, dev_cluster)
    baseline = tmp_path / "baseline.json"
    nodes = "gpu-x8,gpu-powercap,ib-flap,gpu-throttle,gpu-xid"
    saved, _ = run_json(dev_cluster, path, "audit", "--nodes", nodes, "--format", "json",
                        "--save-baseline", str(baseline))
    facts = saved["facts"]
    assert facts["gpu-x8"]["gpu.5.pcie_link_width_current"] == "8"
    assert facts["gpu-powercap"]["gpu.5.pcie_link_width_current"] == "16"
    assert facts["ib-flap"]["rdma.mlx5_1.1.counters.link_downed"] == "37"
    assert facts["gpu-x8"]["xid.source"] == "dmesg"
    drift = {d["fact"]: d for d in saved["drift"]}
    assert drift["gpu.5.pcie_link_width_current"]["outliers"] == {"gpu-x8": "8"}
    assert drift["gpu.3.slowdown"]["outliers"] == {"gpu-throttle": "hw_slowdown,hw_thermal_slowdown"}
    assert drift["xid.reset_codes"]["outliers"] == {"gpu-xid": "79"}
    assert not any(".counters." in fact for fact in drift)   # counters differ by nature: growth, not drift

    with dev_cluster.override("ib-flap", "class/infiniband/mlx5_1/ports/1/counters/link_downed", "41"):
        after, _ = run_json(dev_cluster, path, "audit", "--nodes", nodes, "--format", "json",
                            "--baseline", str(baseline))
    assert after["changes"] == [{"node": "ib-flap", "fact": "rdma.mlx5_1.1.counters.link_downed",
                                 "before": "37", "after": "41", "growth": 4}]


def test_audit_drift_shows_the_gpu_nic_map_and_inactive_nvlinks(dev_cluster: Any, tmp_path: Path) -> None:
    path = profile(tmp_path, dev_cluster)
    data, _ = run_json(dev_cluster, path, "audit", "--nodes", "gpu-x8,gpu-powercap,nvlink-down,topo-far",
                       "--format", "json")
    facts = data["facts"]
    assert facts["gpu-x8"]["gpu.6.nic"] == "mlx5_3 (same PCIe switch)"
    assert facts["gpu-x8"]["gpu.6.vbios_version"] == "96.00.89.00.01"
    assert facts["gpu-x8"]["gpu.6.clocks_applications_graphics"] == "1980 MHz"
    assert facts["gpu-x8"]["rdma.mlx5_2.pci.current_link_width"] == "16"
    drift = {d["fact"]: d for d in data["drift"]}
    assert drift["gpu.6.nic"]["outliers"] == {"topo-far": "mlx5_4 (same PCIe switch)"}
    assert drift["gpu.4.nvlinks_active"]["outliers"] == {"nvlink-down": "17/18"}
