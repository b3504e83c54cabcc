"""rdma.* and rdma.port_errors findings written out whole (message and fix), on the
probe's facts of fake sysfs trees (tests/data/facts/) with the edits a real node shows:
an attribute the kernel would not give (the probe records None), a port on the wrong
link layer, a GID table with a second address, two ports that disagree.

Each expectation is worked out by hand from the facts named in the test."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from cluster_kit.checks import evaluate
from cluster_kit.checks.findings import Finding
from cluster_kit.checks.rdma import gid_address

FACTS_DIR = Path(__file__).resolve().parents[2] / "data" / "facts"
IB = {"network": {"fabric": "infiniband", "ib_hca": [f"mlx5_{n}:1" for n in range(8)]},
      "expect": {"gpus_per_node": 8}}
ROCE = {"network": {"fabric": "roce", "ib_hca": ["mlx5_0:1", "mlx5_1:1"], "gid_index": 3},
        "expect": {"gpus_per_node": 8}}
TOOLS = "(`ibstat {0} 1`, `mlxlink -d {0} -p 1`)"
ONE_VALUE = "; network.gid_index is one value for every HCA, so make the GID tables agree"


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((FACTS_DIR / f"{name}.json").read_text()))


def network(profile: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of `profile` with network keys replaced (None deletes)."""
    result = copy.deepcopy(profile)
    for key, value in changes.items():
        if value is None:
            result["network"].pop(key, None)
        else:
            result["network"][key] = value
    return result


def finding(facts: dict[str, Any], profile: dict[str, Any], check_id: str) -> Finding:
    found = [f for f in evaluate(facts, profile) if f.id == check_id]
    assert len(found) == 1, [f.id for f in evaluate(facts, profile)]
    return found[0]


def whole(f: Finding) -> tuple[str, str, str]:
    return f.status, f.message, f.fix


# ---------------------------------------------------------------- rdma.hca_present

def test_no_infiniband_directory_whole_finding() -> None:
    f = finding(load("no-rdma"), IB, "rdma.hca_present")
    assert whole(f) == (
        "fail",
        ("no RDMA devices: /sys/class/infiniband does not exist (no RDMA device or the ib_core/mlx5_ib "
         "driver is not loaded)"),
        ("load the RDMA driver (`modprobe mlx5_ib`) and check the cards (`lspci | grep -i mellanox`); "
         "for a TCP-only cluster set network.fabric: ethernet"))


def test_an_empty_infiniband_directory_whole_finding() -> None:
    """The real H200 machine: /sys/class/infiniband exists and holds no device."""
    f = finding(load("real-h200"), IB, "rdma.hca_present")
    assert whole(f) == ("fail", "no RDMA device under /sys/class/infiniband",
                        "load the RDMA driver (`modprobe mlx5_ib`) or set network.fabric: ethernet")


# ---------------------------------------------------------------- rdma.port_state

def test_unreadable_and_down_ports_whole_finding() -> None:
    facts = copy.deepcopy(load("ib-ok"))
    facts["rdma"]["hcas"]["mlx5_2"]["ports"]["1"].update(state=None, phys_state=None)
    facts["rdma"]["hcas"]["mlx5_5"]["ports"]["1"].update(state="1: DOWN", phys_state="2: Polling")
    f = finding(facts, IB, "rdma.port_state")
    assert whole(f) == (
        "fail",
        "mlx5_2 port 1 is unreadable (phys_state unreadable); mlx5_5 port 1 is DOWN (phys_state 2: Polling)",
        "mlx5_2:1 has no stable link: check the cable/transceiver and the switch port " + TOOLS.format("mlx5_2")
        + "; mlx5_5:1 has no link partner: check the cable and the switch port " + TOOLS.format("mlx5_5")
        + "; or drop mlx5_2:1, mlx5_5:1 from network.ib_hca, leaving network.ib_hca: [mlx5_0:1, mlx5_1:1, "
        'mlx5_3:1, mlx5_4:1, mlx5_6:1, mlx5_7:1] (the job then gets NCCL_IB_HCA="=mlx5_0:1,mlx5_1:1,mlx5_3:1,'
        'mlx5_4:1,mlx5_6:1,mlx5_7:1")')


# ---------------------------------------------------------------- rdma.link_layer

def two_wrong_layers() -> dict[str, Any]:
    """ib-ok with mlx5_3 on Ethernet (a RoCE card in the slot) and mlx5_6's link_layer unreadable."""
    facts = copy.deepcopy(load("ib-ok"))
    facts["rdma"]["hcas"]["mlx5_3"]["ports"]["1"]["link_layer"] = "Ethernet"
    facts["rdma"]["hcas"]["mlx5_6"]["ports"]["1"]["link_layer"] = None
    return facts


WRONG_LAYERS = ("mlx5_3 port 1 link layer is Ethernet, but network.fabric is infiniband; "
                "mlx5_6 port 1 link layer is unreadable, but network.fabric is infiniband")
SET_ROCE = "set network.fabric: roce (with network.gid_index) if that is this cluster's fabric"
RIGHT = ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_4:1", "mlx5_5:1", "mlx5_7:1"]


def test_listed_ports_on_the_wrong_link_layer_fail_and_offer_the_others() -> None:
    f = finding(two_wrong_layers(), IB, "rdma.link_layer")
    assert whole(f) == (
        "fail", WRONG_LAYERS,
        SET_ROCE + "; or drop mlx5_3:1, mlx5_6:1 from network.ib_hca, leaving network.ib_hca: "
        f'[{", ".join(RIGHT)}] (the job then gets NCCL_IB_HCA="={",".join(RIGHT)}")')


def test_unlisted_ports_on_the_wrong_link_layer_only_warn_while_others_are_right() -> None:
    f = finding(two_wrong_layers(), network(IB, ib_hca=None), "rdma.link_layer")
    assert whole(f) == ("warn", WRONG_LAYERS,
                        SET_ROCE + f"; or list only the working ports: network.ib_hca: [{', '.join(RIGHT)}]")


# ---------------------------------------------------------------- rdma.gid_index

def test_ipv4_gid_octets() -> None:
    """192.168.10.5 is c0a8:0a05 in the last two groups: every octet from its own bits."""
    assert gid_address("0000:0000:0000:0000:0000:ffff:c0a8:0a05") == ("ipv4", "192.168.10.5")
    assert gid_address("0000:0000:0000:0000:0000:ffff:ac10:ff01") == ("ipv4", "172.16.255.1")


def test_gid_index_on_infiniband_passes_as_set() -> None:
    f = finding(load("ib-ok"), network(IB, gid_index=0), "rdma.gid_index")
    assert whole(f) == ("pass", "GID 0 is set on " + ", ".join(IB["network"]["ib_hca"]), "")


def test_zero_gid_on_infiniband_points_at_the_port_gid() -> None:
    f = finding(load("ib-ok"), network(IB, ib_hca=["mlx5_0:1", "mlx5_1:1"], gid_index=3), "rdma.gid_index")
    assert whole(f) == (
        "fail",
        "mlx5_0 port 1 GID 3 is all zero (no address); mlx5_1 port 1 GID 3 is all zero (no address)",
        "set network.gid_index: 0 (the port GID) / export NCCL_IB_GID_INDEX=0")


def test_malformed_gid_whole_finding() -> None:
    """A GID of seven groups (a short read): malformed, however RoCE v2 its type says it is."""
    facts = copy.deepcopy(load("roce-ok"))
    facts["rdma"]["hcas"]["mlx5_0"]["ports"]["1"]["gids"]["3"] = "0000:0000:0000:0000:0000:ffff:0a00"
    f = finding(facts, network(ROCE, ib_hca=["mlx5_0:1"]), "rdma.gid_index")
    assert whole(f) == (
        "fail", "mlx5_0 port 1 GID 3 is malformed (0000:0000:0000:0000:0000:ffff:0a00)",
        "mlx5_0:1 has no RoCE v2 GID with an IPv4 or global address: give its netdev an IP address" + ONE_VALUE)


def test_gid_of_unknown_type_whole_finding() -> None:
    """sysfs answers EINVAL for the type of some GIDs; the probe leaves the index out of gid_types."""
    facts = copy.deepcopy(load("roce-ok"))
    del facts["rdma"]["hcas"]["mlx5_1"]["ports"]["1"]["gid_types"]["3"]
    f = finding(facts, ROCE, "rdma.gid_index")
    assert whole(f) == (
        "fail", "mlx5_1 port 1 GID 3 is of unknown type, not RoCE v2",
        "mlx5_1:1 has no RoCE v2 GID with an IPv4 or global address: give its netdev an IP address" + ONE_VALUE)


def test_gid_indexes_sort_as_numbers() -> None:
    """A port with four addresses: GIDs 0-1 link-local, 2-3 10.0.0.1, 4-5 a VLAN's link-local,
    6-7 a global IPv6, 8-9 zero, 10-11 172.16.0.1 of another VLAN (each v1 then v2). The first
    IPv4 RoCE v2 GID is 3, not "11" (which sorts before "3" as text)."""
    facts = copy.deepcopy(load("roce-ok"))
    for hca, ip, vlan in (("mlx5_0", "0a00:0001", "ens1np0"), ("mlx5_1", "0a00:0101", "ens2np0")):
        data = facts["rdma"]["hcas"][hca]["ports"]["1"]
        link_local = data["gids"]["0"]
        addresses = [link_local, f"0000:0000:0000:0000:0000:ffff:{ip}", link_local,
                     "fd00:0000:0000:0000:0000:0000:0000:0001", "0000:0000:0000:0000:0000:0000:0000:0000",
                     "0000:0000:0000:0000:0000:ffff:ac10:0001"]
        ndevs = [vlan, vlan, f"{vlan}.100", vlan, None, f"{vlan}.200"]
        data["gids"] = {str(i): addresses[i // 2] for i in range(12)}
        data["gid_types"] = {str(i): "RoCE v2" if i % 2 else "IB/RoCE v1" for i in range(12) if i not in (8, 9)}
        data["gid_ndevs"] = {str(i): ndevs[i // 2] for i in range(12) if ndevs[i // 2]}
    f = finding(facts, network(ROCE, gid_index=2), "rdma.gid_index")
    assert whole(f) == (
        "fail", "mlx5_0 port 1 GID 2 is IB/RoCE v1, not RoCE v2; mlx5_1 port 1 GID 2 is IB/RoCE v1, not RoCE v2",
        "set network.gid_index: 3 (RoCE v2, IPv4 10.0.0.1 on ens1np0) / export NCCL_IB_GID_INDEX=3")


def test_a_global_ipv6_gid_is_offered_when_there_is_no_ipv4_one() -> None:
    facts = copy.deepcopy(load("roce-ok"))
    for hca, address in (("mlx5_0", "fd00:0000:0000:0000:0000:0000:0000:0001"),
                         ("mlx5_1", "fd00:0000:0000:0000:0000:0000:0000:0101")):
        gids = facts["rdma"]["hcas"][hca]["ports"]["1"]["gids"]
        gids["2"] = gids["3"] = address
    f = finding(facts, network(ROCE, gid_index=2), "rdma.gid_index")
    assert whole(f) == (
        "fail", "mlx5_0 port 1 GID 2 is IB/RoCE v1, not RoCE v2; mlx5_1 port 1 GID 2 is IB/RoCE v1, not RoCE v2",
        "set network.gid_index: 3 (RoCE v2, fd00::1 on ens1np0) / export NCCL_IB_GID_INDEX=3")


def test_a_gid_without_a_netdev_is_offered_without_one() -> None:
    facts = copy.deepcopy(load("roce-v1"))
    for hca in facts["rdma"]["hcas"].values():
        hca["ports"]["1"]["gid_ndevs"] = {}
    f = finding(facts, ROCE, "rdma.gid_index")
    assert f.fix == "set network.gid_index: 2 (RoCE v2, IPv4 10.0.0.1) / export NCCL_IB_GID_INDEX=2"


def test_ports_whose_usable_gid_indexes_differ_are_named_one_by_one() -> None:
    """roce-ok's mlx5_0 has its IPv4 RoCE v2 GID at 3; mlx5_1 here has it at 2 (v2 before v1,
    as in roce-v1). GID 5 is zero on both."""
    facts = copy.deepcopy(load("roce-ok"))
    facts["rdma"]["hcas"]["mlx5_1"]["ports"]["1"]["gid_types"].update({"2": "RoCE v2", "3": "IB/RoCE v1"})
    f = finding(facts, network(ROCE, gid_index=5), "rdma.gid_index")
    assert whole(f) == (
        "fail", "mlx5_0 port 1 GID 5 is all zero (no address); mlx5_1 port 1 GID 5 is all zero (no address)",
        "mlx5_0:1: index 3 (RoCE v2, IPv4 10.0.0.1 on ens1np0); mlx5_1:1: index 2 (RoCE v2, IPv4 10.0.1.1 on "
        "ens2np0)" + ONE_VALUE)


def test_one_port_with_a_usable_gid_and_one_without() -> None:
    facts = copy.deepcopy(load("roce-ok"))
    facts["rdma"]["hcas"]["mlx5_1"]["ports"]["1"]["gid_types"]["3"] = "IB/RoCE v1"
    f = finding(facts, network(ROCE, gid_index=5), "rdma.gid_index")
    assert f.fix == ("mlx5_0:1: index 3 (RoCE v2, IPv4 10.0.0.1 on ens1np0); mlx5_1:1 has no RoCE v2 GID with an "
                     "IPv4 or global address: give its netdev an IP address" + ONE_VALUE)


# ---------------------------------------------------------------- rdma.port_errors

PERFQUERY = ("confirm on the node with `perfquery -x` (the port's LID) or `mlxlink -d mlx5_1 -p 1 -c` "
             "(BER, FEC and cable info), then reseat or replace the cable or transceiver and check the switch "
             "port; clear the counters afterwards (`perfquery -R`) and drain the node meanwhile: NCCL "
             "over a flapping link stalls or times out")


def test_two_noisy_ports_whole_finding() -> None:
    facts = copy.deepcopy(load("ib-flap"))  # mlx5_1: link_downed 37, link_error_recovery 112, symbol_error 4021
    facts["rdma"]["hcas"]["mlx5_6"]["ports"]["1"]["counters"]["port_rcv_errors"] = "250"
    f = finding(facts, IB, "rdma.port_errors")
    assert whole(f) == (
        "fail", ("mlx5_1 port 1: symbol_error 4021 (> 100), link_error_recovery 112 (> 10), link_downed 37 (> 5); "
                 "mlx5_6 port 1: port_rcv_errors 250 (> 100)"), PERFQUERY)


def test_port_errors_pass_counts_the_ports_with_counters() -> None:
    assert whole(finding(load("ib-ok"), IB, "rdma.port_errors")) == (
        "pass", "8 ports: error counters within expect.ib_error_thresholds", "")
    facts = copy.deepcopy(load("ib-ok"))
    for name in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6"):
        facts["rdma"]["hcas"][name]["ports"]["1"]["counters"] = {}   # no counters/ folder
    assert whole(finding(facts, IB, "rdma.port_errors")) == (
        "pass", "1 port: error counters within expect.ib_error_thresholds", "")


# ---------------------------------------------------------------- which checks run

def test_fabric_ethernet_runs_no_port_check_even_with_hcas_listed() -> None:
    profile = network(IB, fabric="ethernet")
    ids = [f.id for f in evaluate(load("ib-flap"), profile)]
    assert [i for i in ids if i.startswith(("rdma.", "topo."))] == []
