"""`clusterkit preflight` and `probe`, run as real processes against the dev cluster.

Each broken test node must fail exactly the check of its fault, with the message
and exit code a user sees; unreachable nodes must be reported within the SSH
timeouts, and the table must fold nodes with the same outcome into one hostlist.
docs/dev-cluster.md describes each node's fake hardware.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from jobcli import clusterkit, ssh_section, write_yaml

pytestmark = pytest.mark.integration

CONNECT_TIMEOUT = 3
COMMAND_TIMEOUT = 20
IB_NODES = ["ib-ok", "ib-portdown", "ib-nohca", "ib-nopeermem"]
UNREACHABLE = ["refuse", "silent", "badkey"]
EXPECT = {"gpus_per_node": 8, "gpu_model": "H100", "min_driver": "535.104", "nccl": ">=2.18",
          "ib_rate_gbps": 400, "peermem": True}
CLI_TIMEOUT = 90


def write_profile(path: Path, name: str, dev_cluster: Any, network: dict[str, Any],
                  expect: dict[str, Any]) -> Path:
    ssh = ssh_section(dev_cluster, connect_timeout=CONNECT_TIMEOUT, command_timeout=COMMAND_TIMEOUT)
    return write_yaml(path, {"name": name, "ssh": ssh, "network": network, "expect": expect})


@pytest.fixture(scope="module")
def profiles(dev_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ib (the fake IB nodes), roce (roce-ok/roce-v1), slurm (n1/n2: 4 GPUs, 2 HCAs)."""
    folder = tmp_path_factory.mktemp("profiles")
    ib_hca = [f"mlx5_{i}:1" for i in range(4)]
    return {
        "ib": write_profile(folder / "ib.yaml", "ib-test", dev_cluster,
                            {"fabric": "infiniband", "ib_hca": ib_hca}, EXPECT),
        "roce": write_profile(folder / "roce.yaml", "roce-test", dev_cluster,
                              {"fabric": "roce", "ib_hca": ["mlx5_0:1", "mlx5_1:1"], "gid_index": 3},
                              EXPECT),
        "slurm": write_profile(folder / "slurm.yaml", "slurm-nodes", dev_cluster,
                               {"fabric": "infiniband", "ib_hca": ["mlx5_0:1", "mlx5_1:1"]},
                               dict(EXPECT, gpus_per_node=4)),
    }


def preflight_json(dev_cluster: Any, profile: Path, nodes: str, *extra: str) -> tuple[dict[str, Any], int, str]:
    """(report, exit code, stderr) of `preflight --json`; stdout must be one JSON document."""
    done = clusterkit(dev_cluster, "preflight", "--profile", str(profile), "--nodes", nodes, "--json",
                      *extra, cwd=profile.parent, timeout=CLI_TIMEOUT)
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout), done.returncode, done.stderr


def by_node(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["node"]: entry for entry in report["nodes"]}


def failing(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The checks of a node that did not pass, by id."""
    return {c["id"]: c for c in entry["checks"] if c["status"] != "pass"}


@pytest.fixture(scope="module")
def mixed_run(dev_cluster: Any, profiles: dict[str, Path]) -> tuple[dict[str, Any], int, float]:
    """One preflight of the IB nodes and the three unreachable ones: report, rc, seconds."""
    start = time.monotonic()
    report, code, _ = preflight_json(dev_cluster, profiles["ib"], ",".join(IB_NODES + UNREACHABLE))
    return report, code, time.monotonic() - start


def test_report_has_exactly_the_spec_shape(mixed_run: tuple[dict[str, Any], int, float]) -> None:
    report, _, _ = mixed_run
    assert set(report) == {"profile", "nodes", "summary"}
    assert report["profile"] == "ib-test"
    assert [e["node"] for e in report["nodes"]] == IB_NODES + UNREACHABLE
    for entry in report["nodes"]:
        assert set(entry) == {"node", "status", "elapsed_s", "checks"}
        assert isinstance(entry["elapsed_s"], (int, float)) and entry["elapsed_s"] >= 0
        assert entry["status"] in {"pass", "warn", "fail", "unreachable"}
        for check in entry["checks"]:
            assert set(check) == {"id", "status", "message", "fix"}
            assert all(isinstance(check[k], str) for k in check)
            assert check["message"]
            assert bool(check["fix"]) == (check["status"] != "pass"), check
    assert report["summary"] == {"pass": 1, "warn": 0, "fail": 3, "unreachable": 3}


def test_exit_code_is_1_when_a_node_fails_or_is_unreachable(
        mixed_run: tuple[dict[str, Any], int, float]) -> None:
    assert mixed_run[1] == 1


def test_healthy_ib_node_passes_every_configured_check(
        mixed_run: tuple[dict[str, Any], int, float]) -> None:
    entry = by_node(mixed_run[0])["ib-ok"]
    assert entry["status"] == "pass"
    assert failing(entry) == {}
    assert {c["id"] for c in entry["checks"]} == {
        "gpu.count", "gpu.model", "gpu.driver", "gpu.ecc", "gpu.pcie_link", "gpu.throttle", "gpu.xid",
        "gpu.recovery_action", "gpu.nvlink", "nccl.library", "rdma.hca_present", "rdma.port_state", "rdma.link_rate",
        "rdma.link_layer", "rdma.port_errors", "rdma.nic_pcie", "topo.gpu_nic", "rdma.peermem"}


@pytest.mark.parametrize("node, check_id, words", [
    ("ib-portdown", "rdma.port_state", ["mlx5_3 port 1", "DOWN"]),
    ("ib-nohca", "rdma.hca_present", ["mlx5_3", "missing"]),
    ("ib-nopeermem", "rdma.peermem", ["neither nvidia_peermem nor nv_peer_mem is loaded"]),
])
def test_broken_node_fails_exactly_its_check(mixed_run: tuple[dict[str, Any], int, float],
                                             node: str, check_id: str, words: list[str]) -> None:
    entry = by_node(mixed_run[0])[node]
    assert entry["status"] == "fail"
    assert list(failing(entry)) == [check_id]
    check = failing(entry)[check_id]
    assert check["status"] == "fail"
    for word in words:
        assert word in check["message"], check["message"]
    assert check["fix"]


def test_broken_nodes_name_the_way_out(mixed_run: tuple[dict[str, Any], int, float]) -> None:
    nodes = by_node(mixed_run[0])
    # the two fixes name what NCCL can still use: the three healthy HCAs
    for node, check_id in (("ib-portdown", "rdma.port_state"), ("ib-nohca", "rdma.hca_present")):
        assert "mlx5_0:1,mlx5_1:1,mlx5_2:1" in failing(nodes[node])[check_id]["fix"]
    assert "modprobe nvidia_peermem" in failing(nodes["ib-nopeermem"])["rdma.peermem"]["fix"]


@pytest.mark.parametrize("node, cause", [
    ("refuse", "refused"), ("silent", f"no answer within {CONNECT_TIMEOUT}s"),
    ("badkey", "host key"),
])
def test_unreachable_node_names_its_cause(mixed_run: tuple[dict[str, Any], int, float],
                                          node: str, cause: str) -> None:
    entry = by_node(mixed_run[0])[node]
    assert entry["status"] == "unreachable"
    assert [c["id"] for c in entry["checks"]] == ["ssh.reachable"]
    check = entry["checks"][0]
    assert check["status"] == "unreachable"
    assert cause in check["message"], check["message"]
    assert check["fix"]


def test_changed_host_key_fix_says_to_replace_the_old_line(
        mixed_run: tuple[dict[str, Any], int, float]) -> None:
    check = by_node(mixed_run[0])["badkey"]["checks"][0]
    assert "HAS CHANGED" in check["message"]
    assert "ssh-keygen -R" in check["fix"]


def test_unreachable_nodes_cost_no_more_than_the_timeouts(
        mixed_run: tuple[dict[str, Any], int, float]) -> None:
    report, _, seconds = mixed_run
    assert seconds < CONNECT_TIMEOUT + COMMAND_TIMEOUT + 5, seconds
    nodes = by_node(report)
    # the silent node is given up on at connect_timeout, not later
    assert CONNECT_TIMEOUT - 0.5 <= nodes["silent"]["elapsed_s"] <= CONNECT_TIMEOUT + 2
    assert nodes["refuse"]["elapsed_s"] < 1 and nodes["badkey"]["elapsed_s"] < 2


def test_roce_nodes(dev_cluster: Any, profiles: dict[str, Path]) -> None:
    report, code, _ = preflight_json(dev_cluster, profiles["roce"], "roce-ok,roce-v1")
    nodes = by_node(report)
    assert code == 1
    assert nodes["roce-ok"]["status"] == "pass" and failing(nodes["roce-ok"]) == {}
    assert "rdma.gid_index" in {c["id"] for c in nodes["roce-ok"]["checks"]}
    assert list(failing(nodes["roce-v1"])) == ["rdma.gid_index"]
    check = failing(nodes["roce-v1"])["rdma.gid_index"]
    assert "GID 3 is IB/RoCE v1, not RoCE v2" in check["message"]
    # The fix names a RoCE v2 GID of the node: roce-v1 has v2 at index 1 (link-local)
    # and 2 (IPv4-mapped); NCCL wants the routable IPv4 one, so 2.
    index = re.search(r"network\.gid_index: (\d+)", check["fix"])
    assert index, check["fix"]
    types = dev_cluster.node_dir("roce-v1") / "class/infiniband/mlx5_0/ports/1/gid_attrs/types"
    assert (types / index.group(1)).read_text().strip() == "RoCE v2"
    assert index.group(1) == "2" and "NCCL_IB_GID_INDEX=2" in check["fix"]


def test_all_healthy_exits_0_and_folds_into_one_line(dev_cluster: Any, profiles: dict[str, Path]) -> None:
    done = clusterkit(dev_cluster, "preflight", "--profile", str(profiles["slurm"]), "--nodes", "n[1-2]",
                      cwd=profiles["slurm"].parent, timeout=CLI_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""  # no progress output without a terminal
    rows = done.stdout.splitlines()
    assert rows[0].split() == ["STATUS", "NODES", "CHECK", "MESSAGE"]
    assert len([r for r in rows[1:] if r.strip() and not r.startswith("profile ")]) == 1
    assert re.match(r"pass\s+n\[1-2\]\s+-\s+all \d+ checks passed$", rows[1]), rows
    assert rows[-1] == "profile slurm-nodes: 2 pass, 0 warn, 0 fail, 0 unreachable"


def test_table_groups_each_distinct_problem_once(dev_cluster: Any, profiles: dict[str, Path]) -> None:
    done = clusterkit(dev_cluster, "preflight", "--profile", str(profiles["slurm"]), "--nodes", "n[1-2],refuse",
                      cwd=profiles["slurm"].parent, timeout=CLI_TIMEOUT)
    assert done.returncode == 1
    body = [r for r in done.stdout.splitlines()[1:] if r.strip() and not r.startswith("profile ")]
    assert len(body) == 2, done.stdout
    assert re.match(r"unreachable\s+refuse\s+ssh\.reachable\s+connection refused", body[0]), body
    assert re.match(r"pass\s+n\[1-2\]\s+-\s+all \d+ checks passed$", body[1]), body
    assert "1 unreachable" in done.stdout.splitlines()[-1]


def test_deep_reports_missing_torch_as_a_check(dev_cluster: Any, profiles: dict[str, Path]) -> None:
    # the nodes' python3 (/usr/bin/python3 for ckuser) has no torch
    report, code, _ = preflight_json(dev_cluster, profiles["ib"], "ib-ok", "--deep")
    assert code == 1
    entry = by_node(report)["ib-ok"]
    assert list(failing(entry)) == ["nccl.torch"]
    check = failing(entry)["nccl.torch"]
    assert check["status"] == "fail"
    assert "cannot import torch" in check["message"] and "No module named 'torch'" in check["message"]
    assert "environment.python" in check["fix"]


def test_a_changed_node_is_seen_on_the_next_run(dev_cluster: Any, profiles: dict[str, Path]) -> None:
    with dev_cluster.override("ib-ok", "class/infiniband/mlx5_0/ports/1/state", "1: DOWN"):
        report, code, _ = preflight_json(dev_cluster, profiles["ib"], "ib-ok")
    assert code == 1
    assert list(failing(by_node(report)["ib-ok"])) == ["rdma.port_state"]
    assert "mlx5_0 port 1 is DOWN" in failing(by_node(report)["ib-ok"])["rdma.port_state"]["message"]
    report, code, _ = preflight_json(dev_cluster, profiles["ib"], "ib-ok")
    assert code == 0 and by_node(report)["ib-ok"]["status"] == "pass"


def test_probe_json_reports_this_machine(dev_cluster: Any, tmp_path: Path) -> None:
    done = clusterkit(dev_cluster, "probe", "--json", cwd=tmp_path, timeout=CLI_TIMEOUT)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    facts = json.loads(done.stdout)
    for section in ("os", "gpu", "nccl", "rdma", "net", "peermem", "memlock", "iommu", "torch"):
        assert "status" in facts[section], section
    assert facts["probe_version"] == 1 and facts["hostname"]
    if shutil.which("nvidia-smi") is None:
        assert facts["gpu"] == {"status": "absent", "error": "nvidia-smi not found on PATH"}
