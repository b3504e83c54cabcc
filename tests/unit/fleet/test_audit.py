"""Audit core: drift, baseline diff and drain plans on realistic flat facts of ten nodes."""
from __future__ import annotations

import copy
import json

import pytest

from cluster_kit.errors import InputError
from cluster_kit.fleet import audit
from cluster_kit.fleet.facts import is_per_node

NODES = [f"gpu{i:03d}" for i in range(1, 11)]
per_node = is_per_node


def healthy(node: str, index: int) -> dict[str, str]:
    """Flat facts as facts.flatten reports them for a healthy 2-HCA, 2-GPU node."""
    facts = {
        "hostname": node,
        "os.kernel": "5.15.0-105-generic",
        "gpu.count": "2",
        "gpu.model": "NVIDIA H100 80GB HBM3",
        "gpu.driver": "550.54.15",
        "nccl.version": "2.21.5",
        "rdma.peermem": "nvidia_peermem",
        "sys.memlock": "unlimited",
        "gpu.0.uuid": f"GPU-{index:04d}0000",
        "gpu.1.uuid": f"GPU-{index:04d}0001",
        "net.eth0.address": f"02:00:00:00:00:{index:02x}",
    }
    for hca in ("mlx5_0", "mlx5_3"):
        facts.update({
            f"rdma.{hca}.fw_ver": "28.39.1002",
            f"rdma.{hca}.node_guid": f"0c42:a103:00{index:02d}:{hca[-1]}000",
            f"rdma.{hca}.1.state": "4: ACTIVE",
            f"rdma.{hca}.1.rate": "400 Gb/sec (4X NDR)",
            f"rdma.{hca}.1.link_layer": "InfiniBand",
            f"rdma.{hca}.1.gid.0": f"fe80:0000:0000:0000:0c42:a103:00{index:02d}:0000",
        })
    return facts


@pytest.fixture
def fleet() -> dict[str, dict[str, str]]:
    """Ten nodes: gpu003 runs an older driver, gpu007 has mlx5_3 DOWN, gpu009 lacks mlx5_3."""
    nodes = {node: healthy(node, i) for i, node in enumerate(NODES, start=1)}
    nodes["gpu003"]["gpu.driver"] = "535.104.05"
    nodes["gpu007"]["rdma.mlx5_3.1.state"] = "1: DOWN"
    for fact in [f for f in nodes["gpu009"] if f.startswith("rdma.mlx5_3.")]:
        del nodes["gpu009"][fact]
    return nodes


def by_fact(drift: list[dict]) -> dict[str, dict]:
    return {entry["fact"]: entry for entry in drift}


# ---------------------------------------------------------------- drift


def test_drift_names_majority_folded_nodes_and_outliers(fleet: dict) -> None:
    drift = by_fact(audit.compute_drift(fleet, per_node))
    assert drift["gpu.driver"] == {
        "fact": "gpu.driver", "majority": "550.54.15",
        "majority_nodes": "gpu[001-002,004-010]", "outliers": {"gpu003": "535.104.05"},
    }
    assert drift["rdma.mlx5_3.1.state"] == {
        "fact": "rdma.mlx5_3.1.state", "majority": "4: ACTIVE",
        "majority_nodes": "gpu[001-006,008,010]",
        "outliers": {"gpu007": "1: DOWN", "gpu009": "absent"},
    }
    for fact in ("rdma.mlx5_3.fw_ver", "rdma.mlx5_3.1.rate", "rdma.mlx5_3.1.link_layer"):
        assert drift[fact]["outliers"] == {"gpu009": "absent"}
        assert drift[fact]["majority_nodes"] == "gpu[001-008,010]"


def test_drift_is_sorted_by_fact_and_lists_only_differing_facts(fleet: dict) -> None:
    facts = [entry["fact"] for entry in audit.compute_drift(fleet, per_node)]
    assert facts == ["gpu.driver", "rdma.mlx5_3.1.link_layer", "rdma.mlx5_3.1.rate",
                     "rdma.mlx5_3.1.state", "rdma.mlx5_3.fw_ver"]


def test_per_node_facts_never_drift(fleet: dict) -> None:
    drift = audit.compute_drift(fleet, lambda fact: False)
    facts = {entry["fact"] for entry in drift}
    assert {"hostname", "gpu.0.uuid", "rdma.mlx5_0.node_guid", "net.eth0.address",
            "rdma.mlx5_0.1.gid.0"} <= facts
    assert not any(is_per_node(entry["fact"]) for entry in audit.compute_drift(fleet))  # the default


def probe(node: str, driver: str, port_state: str) -> dict:
    """Nested probe facts (docs/architecture.md) of a one-GPU, one-HCA node."""
    return {"probe_version": 1, "hostname": node,
            "gpu": {"status": "ok", "driver": driver, "gpus": [
                {"index": "0", "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{node}"}]},
            "rdma": {"status": "ok", "hcas": {"mlx5_0": {"fw_ver": "28.39.1002", "node_guid": node, "ports": {
                "1": {"state": port_state, "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"}}}}},
            "peermem": {"status": "ok", "nvidia_peermem": True, "nv_peer_mem": False}}


def test_build_audit_flattens_probe_facts() -> None:
    facts = {"n1": probe("n1", "550.54.15", "4: ACTIVE"), "n2": probe("n2", "550.54.15", "1: DOWN"),
             "n3": probe("n3", "535.104.05", "4: ACTIVE")}
    report = {"nodes": [{"node": n, "status": "pass", "checks": []} for n in facts]}
    doc = audit.build_audit("lab", report, facts)
    assert [(d["fact"], d["majority_nodes"], d["outliers"]) for d in doc["drift"]] == [
        ("gpu.driver", "n[1-2]", {"n3": "535.104.05"}),
        ("rdma.mlx5_0.1.state", "n[1,3]", {"n2": "1: DOWN"})]
    assert doc["facts"]["n1"] == {
        "hostname": "n1",
        "gpu.count": "1", "gpu.model": "NVIDIA H100 80GB HBM3", "gpu.driver": "550.54.15",
        "gpu.0.name": "NVIDIA H100 80GB HBM3", "gpu.0.uuid": "GPU-n1",
        "rdma.hcas": "mlx5_0", "rdma.mlx5_0.fw_ver": "28.39.1002", "rdma.mlx5_0.node_guid": "n1",
        "rdma.mlx5_0.1.state": "4: ACTIVE", "rdma.mlx5_0.1.rate": "400 Gb/sec (4X NDR)",
        "rdma.mlx5_0.1.link_layer": "InfiniBand", "rdma.peermem": "nvidia_peermem",
        # the sections this probe output lacks are named as missing
        "os.status": "missing", "xid.status": "missing", "nccl.status": "missing", "net.status": "missing",
        "memlock.status": "missing", "iommu.status": "missing", "torch.status": "missing",
        "nvlink.status": "missing", "topo.status": "missing",
    }


def test_uniform_fleet_has_no_drift() -> None:
    nodes = {node: healthy(node, i) for i, node in enumerate(NODES)}
    assert audit.compute_drift(nodes, per_node) == []


def test_tie_goes_to_the_value_of_the_first_node_in_natural_order() -> None:
    facts = {"n10": {"gpu.driver": "535"}, "n2": {"gpu.driver": "550"}}
    [entry] = audit.compute_drift(facts, per_node)
    assert entry["majority"] == "550"  # n2 sorts before n10
    assert entry["majority_nodes"] == "n2"
    assert entry["outliers"] == {"n10": "535"}


def test_tie_prefers_a_reported_value_over_absent() -> None:
    facts = {"n1": {}, "n2": {"rdma.mlx5_3.fw_ver": "28.39.1002"}, "n3": {"x": "1"}}
    drift = by_fact(audit.compute_drift(facts, per_node))
    assert drift["rdma.mlx5_3.fw_ver"]["majority"] == "absent"  # 2 absent beat 1 value
    facts["n4"] = {"rdma.mlx5_3.fw_ver": "28.39.1002"}
    drift = by_fact(audit.compute_drift(facts, per_node))
    assert drift["rdma.mlx5_3.fw_ver"]["majority"] == "28.39.1002"  # 2:2, value wins
    assert drift["rdma.mlx5_3.fw_ver"]["outliers"] == {"n1": "absent", "n3": "absent"}


def test_three_way_split_takes_the_biggest_group() -> None:
    values = {"n1": "a", "n2": "b", "n3": "b", "n4": "c", "n5": "b", "n6": "c"}
    facts = {node: {"gpu.driver": value} for node, value in values.items()}
    [entry] = audit.compute_drift(facts, per_node)
    assert (entry["majority"], entry["majority_nodes"]) == ("b", "n[2-3,5]")
    assert entry["outliers"] == {"n1": "a", "n4": "c", "n6": "c"}


# ---------------------------------------------------------------- build_audit


def preflight_report(statuses: dict[str, str]) -> dict:
    entries = []
    for node, status in statuses.items():
        checks = [{"id": "gpu.count", "status": "pass", "message": "2 GPUs", "fix": ""}]
        if status == "fail":
            checks.append({"id": "rdma.port_state", "status": "fail",
                           "message": "mlx5_3 port 1 is DOWN", "fix": "reseat the cable"})
        if status == "unreachable":
            checks = [{"id": "ssh.reachable", "status": "unreachable",
                       "message": "connection refused", "fix": "check sshd"}]
        entries.append({"node": node, "status": status, "elapsed_s": 0.4, "checks": checks})
    return {"profile": "prod", "nodes": entries, "summary": {}}


def fleet_audit(fleet: dict, baseline: dict | None = None, slurm: object = None) -> dict:
    statuses = {node: "pass" for node in reversed(NODES)}
    statuses.update({"gpu007": "fail", "gpu011": "unreachable"})
    return audit.build_audit("prod", preflight_report(statuses), fleet, baseline, slurm,
                             per_node=per_node, flatten=dict)


def test_build_audit_has_the_spec_shape(fleet: dict) -> None:
    doc = fleet_audit(fleet)
    assert doc["profile"] == "prod"
    assert doc["nodes"] == NODES
    assert doc["unreachable"] == ["gpu011"]
    assert [(d["fact"], d["majority"], d["majority_nodes"], d["outliers"]) for d in doc["drift"]] == [
        ("gpu.driver", "550.54.15", "gpu[001-002,004-010]", {"gpu003": "535.104.05"}),
        ("rdma.mlx5_3.1.link_layer", "InfiniBand", "gpu[001-008,010]", {"gpu009": "absent"}),
        ("rdma.mlx5_3.1.rate", "400 Gb/sec (4X NDR)", "gpu[001-008,010]", {"gpu009": "absent"}),
        ("rdma.mlx5_3.1.state", "4: ACTIVE", "gpu[001-006,008,010]", {"gpu007": "1: DOWN", "gpu009": "absent"}),
        ("rdma.mlx5_3.fw_ver", "28.39.1002", "gpu[001-008,010]", {"gpu009": "absent"}),
    ]
    assert [e["node"] for e in doc["checks"]] == NODES + ["gpu011"]
    assert "changes" not in doc
    assert doc["summary"] == {"nodes": 11, "reachable": 10, "unreachable": 1, "pass": 9,
                              "warn": 0, "fail": 1, "drifting_facts": 5, "drifting_nodes": 3,
                              "changes": 0}
    assert doc["facts"]["gpu003"]["gpu.driver"] == "535.104.05"
    json.dumps(doc)  # one JSON document


def test_build_audit_joins_slurm_state(fleet: dict) -> None:
    slurm = [{"node": "gpu004", "state": "drained", "reason": "bad DIMM"},
             {"nodes": "gpu[001-002]", "state": "idle", "reason": ""}]
    doc = fleet_audit(fleet, slurm=slurm)
    assert doc["slurm"]["gpu004"] == {"state": "drained", "reason": "bad DIMM"}
    assert doc["slurm"]["gpu002"]["state"] == "idle"


def test_build_audit_keeps_slurm_state_of_the_audited_nodes_only(fleet: dict) -> None:
    slurm = {"gpu004": {"state": "idle", "reason": ""},
             "gpu099": {"state": "drained", "reason": "admin: not in this audit"}}
    doc = fleet_audit(fleet, slurm=slurm)
    assert doc["slurm"] == {"gpu004": {"state": "idle", "reason": ""}}


# ---------------------------------------------------------------- baseline


def test_baseline_round_trip_and_diff(fleet: dict) -> None:
    saved = json.loads(json.dumps(audit.save_baseline(fleet_audit(fleet), created="2024-05-01T00:00:00Z")))
    assert saved["format"] == audit.BASELINE_FORMAT and saved["version"] == 1
    assert saved["profile"] == "prod" and saved["created"] == "2024-05-01T00:00:00Z"
    assert audit.check_baseline(saved) is saved
    now = copy.deepcopy(fleet)
    for node in NODES[:4] + NODES[5:8]:
        now[node]["gpu.driver"] = "555.42.02"
    now["gpu002"]["rdma.mlx5_0.1.state"] = "1: DOWN"
    now["gpu005"]["rdma.peermem"] = "none"
    del now["gpu010"]
    now["gpu012"] = healthy("gpu012", 12)
    changes = audit.diff_baseline(saved, now)
    assert {"node": "gpu002", "fact": "rdma.mlx5_0.1.state",
            "before": "4: ACTIVE", "after": "1: DOWN"} in changes
    assert {"node": "gpu010", "fact": "node", "before": "present", "after": "absent"} in changes
    assert {"node": "gpu012", "fact": "node", "before": "absent", "after": "present"} in changes
    assert len(changes) == 7 + 1 + 1 + 2
    assert [c["node"] for c in changes] == sorted(c["node"] for c in changes)
    assert audit.summarize_changes(changes) == [
        "gpu.driver 535.104.05 -> 555.42.02 on gpu003",
        "gpu.driver 550.54.15 -> 555.42.02 on gpu[001-002,004,006-008]",
        "node added since the baseline: gpu012",
        "node absent (in the baseline): gpu010",
        "rdma.mlx5_0.1.state 4: ACTIVE -> 1: DOWN on gpu002",
        "rdma.peermem nvidia_peermem -> none on gpu005",
    ]


def test_diff_reports_added_and_removed_facts_as_absent(fleet: dict) -> None:
    saved = audit.save_baseline(fleet, profile="prod")
    now = copy.deepcopy(fleet)
    now["gpu009"]["rdma.mlx5_3.fw_ver"] = "28.39.1002"
    del now["gpu001"]["nccl.version"]
    assert audit.diff_baseline(saved, now) == [
        {"node": "gpu001", "fact": "nccl.version", "before": "2.21.5", "after": "absent"},
        {"node": "gpu009", "fact": "rdma.mlx5_3.fw_ver", "before": "absent", "after": "28.39.1002"},
    ]


def test_unreachable_node_is_not_reported_as_removed(fleet: dict) -> None:
    saved = audit.save_baseline(fleet, profile="prod")
    now = {node: facts for node, facts in fleet.items() if node != "gpu004"}
    assert audit.diff_baseline(saved, now, unreachable=["gpu004"]) == [
        {"node": "gpu004", "fact": "node", "before": "present", "after": "unreachable"}]


def test_build_audit_with_baseline_adds_changes(fleet: dict) -> None:
    saved = audit.save_baseline(fleet, profile="prod", created="2024-05-01T00:00:00Z")
    now = copy.deepcopy(fleet)
    now["gpu007"]["gpu.driver"] = "555.42.02"
    doc = fleet_audit(now, baseline=saved)
    assert doc["changes"] == [{"node": "gpu007", "fact": "gpu.driver",
                               "before": "550.54.15", "after": "555.42.02"}]
    assert doc["baseline"] == {"created": "2024-05-01T00:00:00Z", "profile": "prod"}
    assert doc["summary"]["changes"] == 1


@pytest.mark.parametrize("document", [[], {"format": "other"},
                                      {"format": audit.BASELINE_FORMAT, "version": 99, "nodes": {}},
                                      {"format": audit.BASELINE_FORMAT, "version": 1}])
def test_check_baseline_refuses_foreign_documents(document: object) -> None:
    with pytest.raises(InputError, match="base.json"):
        audit.check_baseline(document, "base.json")


# ---------------------------------------------------------------- drain / undrain


def test_drain_plan_names_failing_checks(fleet: dict) -> None:
    doc = fleet_audit(fleet)
    assert audit.drain_plan(doc) == [("gpu007", "clusterkit: rdma.port_state")]
    assert audit.drain_plan(doc, include_unreachable=True)[-1] == ("gpu011", "clusterkit: ssh.reachable")


def test_drain_reason_is_short_single_line_and_quotable() -> None:
    reason = audit.drain_reason(['gpu.count', 'x"y\nz', "rdma.peermem", "sys.memlock", "gpu.driver"])
    assert reason == "clusterkit: gpu.count,gpu.driver,rdma.peermem +2 more"
    assert '"' not in audit.drain_reason(['a"b']) and "\n" not in audit.drain_reason(["a\nb"])


def test_drain_plan_keeps_an_admin_drain(fleet: dict) -> None:
    doc = fleet_audit(fleet, slurm={"gpu007": {"state": "drained", "reason": "RMA ticket 42"}})
    assert audit.drain_plan(doc) == []
    doc = fleet_audit(fleet, slurm={"gpu007": {"state": "drained", "reason": "clusterkit: gpu.driver"}})
    assert audit.drain_plan(doc) == [("gpu007", "clusterkit: rdma.port_state")]


def test_undrain_only_nodes_clusterkit_drained_that_pass_now(fleet: dict) -> None:
    slurm = {
        "gpu001": {"state": "drained", "reason": "clusterkit: rdma.port_state"},
        "gpu002": {"state": "MIXED+DRAIN", "reason": "clusterkit: gpu.driver"},
        "gpu003": {"state": "drained", "reason": "RMA: clusterkit: said so"},
        "gpu004": {"state": "idle", "reason": "clusterkit: old reason"},
        "gpu007": {"state": "drained", "reason": "clusterkit: rdma.port_state"},  # still fails
        "gpu011": {"state": "drained*", "reason": "clusterkit: ssh.reachable"},  # unreachable
        "gpu099": {"state": "drained", "reason": "clusterkit: gpu.count"},  # not audited
    }
    doc = fleet_audit(fleet)
    assert audit.undrain_plan(doc, slurm) == ["gpu001", "gpu002"]
    assert audit.undrain_plan(fleet_audit(fleet, slurm=slurm)) == ["gpu001", "gpu002"]


def test_scontrol_commands_fold_nodes_per_reason() -> None:
    plan = [("gpu003", "clusterkit: gpu.driver"), ("gpu001", "clusterkit: gpu.driver"),
            ("gpu002", "clusterkit: gpu.driver"), ("gpu007", "clusterkit: rdma.port_state")]
    assert audit.build_drain_commands(plan) == [
        ["scontrol", "update", "NodeName=gpu[001-003]", "State=DRAIN", "Reason=clusterkit: gpu.driver"],
        ["scontrol", "update", "NodeName=gpu007", "State=DRAIN", "Reason=clusterkit: rdma.port_state"],
    ]
    assert audit.build_undrain_commands(["gpu002", "gpu001"]) == [
        ["scontrol", "update", "NodeName=gpu[001-002]", "State=UNDRAIN"]]
    assert audit.build_undrain_commands([]) == []


def test_natural_node_order() -> None:
    assert audit.sort_nodes(["n10", "n2", "a1", "n2"]) == ["a1", "n2", "n10"]
    assert audit.fold_nodes(["n3", "n1", "n2"]) == "n[1-3]"
