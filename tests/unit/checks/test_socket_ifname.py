"""net.socket_ifname, whole findings: what NCCL_SOCKET_IFNAME selects, and the fix for each way it fails."""
from __future__ import annotations

from typing import Any

import pytest

from cluster_kit.checks import Finding, net
from cluster_kit.checks.net import IfnameSpec, parse_ifname

UP = {"operstate": "up"}
DOWN = {"operstate": "down"}


def ifname(interfaces: dict[str, Any], value: Any) -> Finding:
    return net.check_socket_ifname({"net": {"status": "ok", "interfaces": interfaces}}, value)


@pytest.mark.parametrize("value, spec", [
    ("eth", IfnameSpec(("eth",))),
    (" ^docker,lo ", IfnameSpec(("docker", "lo"), exclude=True)),
    ("=eth0", IfnameSpec(("eth0",), exact=True)),
    ("^=docker0", IfnameSpec(("docker0",), exclude=True, exact=True)),
    (["eth0", "ib0"], IfnameSpec(("eth0", "ib0"))),
    (("=eth0", "eth1"), IfnameSpec(("eth0", "eth1"), exact=True)),
    ("XX", IfnameSpec(("XX",))),
    ("eth, ,ib", IfnameSpec(("eth", "ib"))),
])
def test_parse_ifname(value: Any, spec: IfnameSpec) -> None:
    assert parse_ifname(value) == spec


@pytest.mark.parametrize("interface, up", [
    ({"operstate": "up"}, True),
    ({"operstate": "unknown", "carrier": "1"}, True),
    ({"operstate": "unknown", "carrier": "0"}, False),
    ({"operstate": "down", "carrier": "1"}, False),
    ({}, False),
])
def test_is_up(interface: dict[str, Any], up: bool) -> None:
    assert net.is_up(interface) is up


def test_unreadable_interfaces() -> None:
    assert net.check_socket_ifname({"net": {"status": "error", "error": "/sys/class/net: Permission denied"}},
                                   "eth0") == Finding(
        "net.socket_ifname", "fail", "cannot list network interfaces: /sys/class/net: Permission denied",
        "check that /sys/class/net is readable on the node")


def test_nothing_matches() -> None:
    assert ifname({"lo": {"operstate": "unknown", "carrier": "1"}, "eth0": UP, "ib0": UP}, "enp") == Finding(
        "net.socket_ifname", "fail", "network.socket_ifname 'enp' matches no interface (interfaces: lo, eth0, ib0)",
        "set network.socket_ifname to an interface that is up: eth0, ib0")
    assert ifname({}, "eth") == Finding(
        "net.socket_ifname", "fail", "network.socket_ifname 'eth' matches no interface (interfaces: none)",
        "set network.socket_ifname to an interface that is up: none")


def test_only_down_interfaces_match() -> None:
    assert ifname({"eth0": DOWN, "eth1": {}, "ib0": UP}, "eth") == Finding(
        "net.socket_ifname", "fail", "network.socket_ifname 'eth' matches only interfaces that are down: "
        "eth0 (operstate down), eth1 (operstate unreadable)",
        "bring it up (`ip link set eth0 up`, check the cable) or use an interface that is up: ib0")


def test_only_loopback() -> None:
    assert ifname({"lo": {"operstate": "unknown", "carrier": "1"}, "eth0": UP}, "lo") == Finding(
        "net.socket_ifname", "warn", "network.socket_ifname 'lo' selects only the loopback interface lo",
        "other nodes cannot reach lo: use an interface that is up: eth0")


def test_an_up_and_two_down_interfaces_match() -> None:
    assert ifname({"eth0": UP, "eth1": DOWN, "eth2": UP, "eth3": {"operstate": "lowerlayerdown"}}, "eth") == Finding(
        "net.socket_ifname", "warn", "eth0, eth2 up; eth1 (operstate down), eth3 (operstate lowerlayerdown) "
        "also matches network.socket_ifname 'eth' and NCCL may pick it",
        "name the interface exactly: network.socket_ifname: =eth0")


def test_pass_names_every_interface_selected() -> None:
    interfaces = {"lo": {"operstate": "unknown", "carrier": "1"}, "eth0": UP, "eth1": UP, "docker0": DOWN}
    assert ifname(interfaces, "^docker,lo") == Finding(
        "net.socket_ifname", "pass", "eth0, eth1 up (network.socket_ifname '^docker,lo')")
    assert ifname(interfaces, ["eth0", "eth1"]) == Finding(
        "net.socket_ifname", "pass", "eth0, eth1 up (network.socket_ifname ['eth0', 'eth1'])")


def test_check_runs_only_when_socket_ifname_is_set() -> None:
    facts = {"net": {"status": "ok", "interfaces": {"eth0": UP}}}
    assert net.check(facts, {"network": {}}) == []
    assert net.check(facts, {"network": {"socket_ifname": "eth0"}}) == [
        Finding("net.socket_ifname", "pass", "eth0 up (network.socket_ifname 'eth0')")]
