"""`init --from-node`'s derivation on recorded probe facts: values, comments, votes, YAML."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cluster_kit import checks
from cluster_kit.cli import cli
from cluster_kit.config import spec, specs, validators
from cluster_kit.config.init_profile import (
    derive,
    kib_size,
    profile_name,
    render_profile,
    scalar,
    ssh_section,
)
from cluster_kit.node.probe import parse_default_route
from cluster_kit.ssh import SshSettings, resolve_endpoint

FACTS = Path(__file__).resolve().parents[2] / "data" / "facts"
# /proc/net/route of a node whose default route leaves through eth0 (gateway 192.0.2.1).
ROUTE = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
"""


def facts(name: str, route: str | None = "eth0") -> dict[str, Any]:
    data = json.loads((FACTS / f"{name}.json").read_text())
    data["route"] = {"status": "ok", "default_interface": route, "default_gateway": "192.0.2.1"}
    return data


def resolved(text: str) -> dict[str, Any]:
    """The written profile as `config` resolves it (defaults filled), for the checks."""
    data = yaml.safe_load(text)
    assert spec.check(data, specs.PROFILE) == []
    return spec.with_defaults(data, specs.PROFILE)


def statuses(node_facts: dict[str, Any], profile: dict[str, Any]) -> dict[str, str]:
    return {f.id: f.status for f in checks.evaluate(node_facts, profile)}


def test_the_storage_nic_is_left_out_with_its_reason() -> None:
    node = facts("ib-storage")
    out = derive({"gpu001": node}, {}, "prod")
    data = out.data()
    assert data["network"]["fabric"] == "infiniband"
    assert data["network"]["ib_hca"] == [f"mlx5_{i}:1" for i in range(8)]
    assert out.notes["network"] == ["mlx5_8:1: Ethernet 200 Gb/s, unlike the 8 InfiniBand 400 Gb/s ports: left out"]
    assert data["expect"]["ib_rate_gbps"] == 400
    assert "gid_index" not in data["network"]
    assert out.outliers == []


def test_the_written_profile_passes_every_check_on_its_node() -> None:
    node = facts("ib-storage")
    text = render_profile(derive({"gpu001": node}, {}, "prod"), ["header"])
    profile = resolved(text)
    found = statuses(node, profile)
    assert set(found.values()) == {"pass"}, found
    assert {"gpu.count", "gpu.model", "gpu.driver", "nccl.library", "rdma.port_state", "rdma.link_rate",
            "rdma.link_layer", "rdma.peermem", "net.socket_ifname", "sys.memlock"} <= set(found)


def test_every_value_sits_under_its_comment() -> None:
    out = derive({"gpu001": facts("ib-ok")}, {}, "prod")
    lines = render_profile(out, ["header"]).splitlines()
    for index, line in enumerate(lines):
        if line.strip() and not line.strip().startswith("#") and not line.endswith(":"):
            assert lines[index - 1].strip().startswith("# "), line
    assert ("  # the 8 ACTIVE InfiniBand 400 Gb/s ports (/sys/class/infiniband/*/ports/*/state, phys_state), "
            "in GPU order (each GPU's nearest HCA: same PCIe switch, else NUMA node)") in lines
    assert "  ib_hca: [\"mlx5_0:1\", \"mlx5_1:1\", \"mlx5_2:1\", \"mlx5_3:1\", \"mlx5_4:1\", \"mlx5_5:1\", " \
        "\"mlx5_6:1\", \"mlx5_7:1\"]" in lines


@pytest.mark.parametrize(("name", "index"), [("roce-ok", 3), ("roce-v1", 2)])
def test_roce_gets_the_v2_gid_with_an_ipv4_address(name: str, index: int) -> None:
    node = facts(name)
    out = derive({name: node}, {}, name)
    data = out.data()
    assert data["network"]["fabric"] == "roce"
    assert data["network"]["gid_index"] == index
    assert "RoCE v2, IPv4" in out.comments[("network", "gid_index")]
    assert set(statuses(node, resolved(render_profile(out, [])) ).values()) == {"pass"}


def test_with_several_nodes_the_majority_wins_and_the_outliers_are_named() -> None:
    nodes = {"gpu001": facts("ib-ok"), "gpu002": facts("ib-ok"), "gpu003": facts("ib-portdown"),
             "gpu004": facts("ib-nopeermem")}
    out = derive(nodes, {}, "prod")
    data = out.data()
    assert data["nodes"] == "gpu[001-004]"
    assert data["network"]["ib_hca"] == [f"mlx5_{i}:1" for i in range(8)]
    assert data["expect"]["peermem"] is True
    assert "on 3/4 nodes" in out.comments[("expect", "peermem")]
    assert any(line.startswith("gpu003: network.ib_hca port mlx5_3:1 is 1: DOWN") for line in out.outliers)
    assert any(line.startswith("gpu004: GPUDirect RDMA") and "not loaded" in line for line in out.outliers)
    assert not any(line.startswith(("gpu001", "gpu002")) for line in out.outliers)
    profile = resolved(render_profile(out, []))
    assert statuses(nodes["gpu003"], profile)["rdma.port_state"] == "fail"
    assert statuses(nodes["gpu004"], profile)["rdma.peermem"] == "fail"
    assert set(statuses(nodes["gpu001"], profile).values()) == {"pass"}


def test_a_tie_goes_to_the_reference_node() -> None:
    first = derive({"a": facts("ib-nopeermem"), "b": facts("ib-ok")}, {}, "p")
    second = derive({"b": facts("ib-ok"), "a": facts("ib-nopeermem")}, {}, "p")
    assert first.data()["expect"]["peermem"] is False
    assert second.data()["expect"]["peermem"] is True
    assert first.outliers == [("b: GPUDirect RDMA (nvidia_peermem / nv_peer_mem) is loaded "
                              "(the majority's: not loaded, on 1 node(s))")]


def test_a_node_without_rdma_is_ethernet_without_rdma_keys() -> None:
    out = derive({"cpu1": facts("no-rdma")}, {}, "cpu")
    network, expect = out.data()["network"], out.data()["expect"]
    assert network["fabric"] == "ethernet"
    assert "ib_hca" not in network and "peermem" not in expect and "ib_rate_gbps" not in expect
    assert out.comments[("network", "fabric")].startswith("no RDMA device (/sys/class/infiniband does not exist")


def test_a_node_without_nvidia_smi_leaves_the_gpu_checks_out() -> None:
    out = derive({"gpu1": facts("smi-missing")}, {}, "p")
    assert "gpus_per_node" not in out.data()["expect"]
    assert out.notes["expect"] == ["GPU checks left out: nvidia-smi not found on PATH"]
    assert "# GPU checks left out: nvidia-smi not found on PATH" in render_profile(out, [])


def test_the_default_route_interface_must_exist_on_the_node() -> None:
    out = derive({"gpu1": facts("ib-ok", route="ens9")}, {}, "p")
    assert "socket_ifname" not in out.data()["network"]
    assert "socket_ifname left out: the default route's interface ens9 is not in /sys/class/net" \
        in out.notes["network"]


def test_a_prefix_of_another_interface_is_written_exact() -> None:
    node = facts("ib-ok")
    node["net"]["interfaces"]["eth0.100"] = dict(node["net"]["interfaces"]["eth0"])
    out = derive({"gpu1": node}, {}, "p")
    assert out.data()["network"]["socket_ifname"] == "=eth0"
    assert "eth0.100" in out.comments[("network", "socket_ifname")]


def test_the_default_route_is_read_from_proc_net_route() -> None:
    assert parse_default_route(ROUTE) == {"status": "ok", "default_interface": "eth0",
                                          "default_gateway": "192.0.2.1"}
    two = ROUTE + "ib0\t00000000\t0100000A\t0003\t0\t0\t50\t00000000\t0\t0\t0\n"
    assert parse_default_route(two)["default_interface"] == "eth0"
    lower = ROUTE.replace("0003\t0\t0\t0\t00000000", "0003\t0\t0\t100\t00000000") \
        + "ib0\t00000000\t0100000A\t0003\t0\t0\t50\t00000000\t0\t0\t0\n"
    assert parse_default_route(lower) == {"status": "ok", "default_interface": "ib0",
                                          "default_gateway": "10.0.0.1"}
    no_default = ROUTE.splitlines()[0] + "\n" + ROUTE.splitlines()[2] + "\n"
    assert parse_default_route(no_default)["default_interface"] is None


def test_the_ssh_section_names_where_each_setting_came_from() -> None:
    options = {"hostname": "10.0.0.1", "user": "alice", "port": "2222",
               "identityfile": ["/home/alice/.ssh/id_cluster"], "userknownhostsfile": "/etc/ck/known_hosts",
               "proxyjump": "bastion"}
    endpoint = resolve_endpoint("gpu001", options, SshSettings(), "root")
    section = ssh_section(endpoint, options, "/etc/ck/ssh_config", "gpu001")
    assert {key: value for key, (value, _) in section.items()} == {
        "config_file": "/etc/ck/ssh_config", "user": "alice", "port": 2222,
        "identity_file": "/home/alice/.ssh/id_cluster", "known_hosts": "/etc/ck/known_hosts",
        "proxy_jump": "bastion"}
    assert section["user"][1] == "User in ssh_config /etc/ck/ssh_config for gpu001"
    bare = ssh_section(resolve_endpoint("gpu001", {}, SshSettings(), "root"), {}, None, "gpu001")
    assert bare == {"user": ("root", "the local user (ssh_config names none)")}


@pytest.mark.parametrize(("kib", "shown"), [(8192, "8M"), (1048576, "1G"), (100, "100K"), (0, "0K")])
def test_memlock_sizes(kib: int, shown: str) -> None:
    assert kib_size(kib) == shown
    assert validators.memlock()(shown) is None


@pytest.mark.parametrize("value", ["yes", "on", "8M", "/a/b", ">=2.18", "NVIDIA H100 80GB HBM3", "true", 3, True])
def test_scalars_read_back_as_written(value: Any) -> None:
    assert yaml.safe_load(f"k: {scalar(value)}")["k"] == value


def test_profile_names_are_safe() -> None:
    assert profile_name("gpu001.cluster") == "gpu001.cluster"
    assert profile_name("my prod@site") == "my-prod-site"
    assert spec.check({"name": profile_name("a b$c")}, specs.PROFILE) == []


def test_init_refuses_to_overwrite_before_probing(tmp_path: Path) -> None:
    target = tmp_path / "prod.yaml"
    target.write_text("keep me\n")
    result = CliRunner().invoke(cli, ["init", "--from-node", "nonexistent.invalid", "-o", str(target)])
    assert result.exit_code == 2
    assert "the file exists; nothing was written" in result.output and "--force" in result.output
    assert target.read_text() == "keep me\n"


@pytest.mark.parametrize(("nodes", "message"), [("", "--nodes is empty"), ("gpu[01-", "--nodes 'gpu[01-'")])
def test_init_refuses_a_bad_nodes_list(nodes: str, message: str) -> None:
    result = CliRunner().invoke(cli, ["init", "--from-node", "gpu001", "--nodes", nodes])
    assert result.exit_code == 2
    assert message in result.output


def test_a_port_without_link_is_left_out_by_its_state_not_its_rate() -> None:
    out = derive({"gpu1": facts("ib-portdown")}, {}, "p")
    assert "mlx5_3:1" not in out.data()["network"]["ib_hca"]
    assert [note for note in out.notes["network"] if note.startswith("mlx5_3:1")] == [
        "mlx5_3:1: 1: DOWN / 2: Polling on gpu1: left out"]


def test_a_slower_port_of_the_same_link_layer_is_left_out_too() -> None:
    out = derive({"gpu1": facts("ib-slow")}, {}, "p")
    assert out.data()["network"]["ib_hca"] == [f"mlx5_{i}:1" for i in range(8) if i != 5]
    assert out.notes["network"] == ["mlx5_5:1: InfiniBand 200 Gb/s, unlike the 7 InfiniBand 400 Gb/s ports: left out"]


def test_an_unreadable_memlock_is_left_out_with_the_reason() -> None:
    node = facts("ib-ok")
    node["memlock"] = {"status": "error", "error": "ValueError: no such limit"}
    out = derive({"gpu1": node}, {}, "p")
    assert "memlock" not in out.data()["expect"]
    assert "memlock left out: ValueError: no such limit" in out.notes["expect"]


def test_ib_hca_follows_gpu_affinity_of_the_reference_node() -> None:
    """GPU i sits on mlx5_i's PCIe switch (tests/unit/node/test_probe.py's board): with the
    HCAs enumerated out of order, ib_hca still lists GPU 0's nearest first."""
    data = copy.deepcopy(facts("ib-ok"))
    hcas = data["rdma"]["hcas"]
    data["rdma"]["hcas"] = {name: hcas[name] for name in reversed(list(hcas))}
    out = derive({"gpu001": data}, {}, "prod")
    assert out.data()["network"]["ib_hca"] == [f"mlx5_{n}:1" for n in range(8)]
    del data["topo"]
    out = derive({"gpu001": data}, {}, "prod")
    assert out.data()["network"]["ib_hca"] == [f"mlx5_{n}:1" for n in reversed(range(8))]
