"""Slurm's names for the nodes a rank names, on `scontrol show node --oneliner` text.

`scontrol_show_node_all` and `_n1` were recorded on the dev cluster (Slurm 22.05.8; every
node's NodeHostName is `localhost` there, as on any one-machine cluster), and
`scontrol_show_node_fqdn` is that text with FQDN and cloud host names and 10.1.0.x
addresses, as on a cluster whose host names are not its Slurm names.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster_kit.slurm import builders as slurm
from cluster_kit.slurm.builders import SlurmNode
from cluster_kit.slurm.node_names import slurm_name, slurm_names

DATA = Path(__file__).resolve().parents[2] / "data" / "slurm"
CASES = json.loads((DATA / "cases.json").read_text())


def nodes(case: str) -> list[SlurmNode]:
    return slurm.parse_scontrol_show_nodes((DATA / f"scontrol_show_node_{case}.stdout").read_text())


def test_the_recorded_argv_is_what_the_builder_makes() -> None:
    assert CASES["scontrol_show_node_all"]["argv"] == slurm.build_scontrol_show_nodes() == [
        "scontrol", "show", "node", "--oneliner"]
    assert CASES["scontrol_show_node_n1"]["argv"] == slurm.build_scontrol_show_nodes("n1")
    assert slurm.build_scontrol_show_nodes("n[1-2],gpu007") == ["scontrol", "show", "node", "--oneliner", "n[1-2],gpu007"]
    with pytest.raises(ValueError, match="node list"):
        slurm.build_scontrol_show_nodes("n1 --all")


def test_every_node_line_is_read_with_its_names_and_state() -> None:
    assert nodes("all") == [SlurmNode("n1", "localhost", "127.0.1.1", "IDLE"),
                            SlurmNode("n2", "localhost", "127.0.1.2", "IDLE"),
                            SlurmNode("n3", "localhost", "127.0.1.3", "IDLE")]
    assert nodes("n1") == nodes("all")[:1]
    # `Node n9 not found` (exit 1, on stdout): no node
    assert CASES["scontrol_show_node_unknown"]["returncode"] == 1
    assert slurm.parse_scontrol_show_nodes((DATA / "scontrol_show_node_unknown.stdout").read_text()) == []


def test_a_value_with_blanks_does_not_end_the_line() -> None:
    """OS= holds blanks (`Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0`); the keys after it still count."""
    line = (DATA / "scontrol_show_node_n1.stdout").read_text()
    assert "OS=Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=4000" in line
    assert line.index("OS=") < line.index("State=")
    down = line.replace("State=IDLE", "State=DOWN+DRAIN+NOT_RESPONDING")
    assert slurm.parse_scontrol_show_nodes(down)[0].state == "DOWN+DRAIN+NOT_RESPONDING"


@pytest.mark.parametrize("host, addresses, name", [
    ("n2", (), "n2"),  # SLURMD_NODENAME: the name itself
    ("gpu002.cluster.local", (), "n2"),  # NodeHostName
    ("GPU002.cluster.local.", (), "n2"),  # host names have no case; a root dot changes nothing
    ("gpu002", (), "n2"),  # short name of an FQDN NodeHostName
    ("ip-10-1-0-3.ec2.internal", (), "n3"),  # a cloud name
    ("ip-10-1-0-3", (), "n3"),
    ("10.1.0.1", (), "n1"),  # NodeAddr
    ("trainer-7", ("10.1.0.3",), "n3"),  # resolves to a NodeAddr
    ("gpu002.other.site", (), None),  # another domain's gpu002
    ("10", (), None),  # the first number of an address (NodeAddr 10.1.0.x) is no short name
    ("trainer-7", ("10.9.9.9",), None),
    ("", (), None),
])
def test_a_host_name_is_matched_to_its_slurm_name(host: str, addresses: tuple[str, ...], name: str | None) -> None:
    assert slurm_name(host, nodes("fqdn"), addresses) == name


def test_on_a_one_machine_cluster_the_host_name_matches_every_node_so_none() -> None:
    """All three nodes are `localhost` here: a rank that wrote `localhost` (or this
    machine's name, `vm`, which no node has) stays unknown, never a guess."""
    assert slurm_name("localhost", nodes("all")) is None
    assert slurm_name("vm", nodes("all"), ("127.0.0.1",)) is None
    assert slurm_name("vm", nodes("all"), ("127.0.1.2",)) == "n2"
    assert slurm_name("n3", nodes("all")) == "n3"


def test_a_host_that_is_one_nodes_name_and_anothers_host_name_is_the_first() -> None:
    crossed = [SlurmNode("a", "b.example", "10.0.0.1", "IDLE"), SlurmNode("b", "a.example", "10.0.0.2", "IDLE")]
    assert slurm_name("b", crossed) == "b" and slurm_name("b.example", crossed) == "a"


def test_many_hosts_at_once_leave_the_unknown_out() -> None:
    hosts = ["gpu001.cluster.local", "n2", "gpu009", "trainer-7"]
    assert slurm_names(hosts, nodes("fqdn"), {"trainer-7": ["10.1.0.3"]}) == {
        "gpu001.cluster.local": "n1", "n2": "n2", "trainer-7": "n3"}
    assert slurm_names(hosts, nodes("fqdn")) == {"gpu001.cluster.local": "n1", "n2": "n2"}


def test_an_address_has_no_short_name() -> None:
    one = [SlurmNode("n1", "h1", "10.1.0.1", "IDLE")]
    assert slurm_name("10", one) is None and slurm_name("10.1.0.1", one) == "n1"
