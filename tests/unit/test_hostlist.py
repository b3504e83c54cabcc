"""Hostlist expand/fold and the NodeSet value: table tests plus a differential test
against Slurm's scontrol.

The differential part runs `scontrol show hostnames` / `scontrol show hostlist`
(which need only a slurm.conf, no daemon) on a few hundred seeded random cases.
"""
from __future__ import annotations

import copy
import os
import pickle
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from cluster_kit.hostlist import NodeSet, expand, fold

EXPAND_TABLE = [
    ("gpu[001-004,010]", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"]),
    ("n1,n2", ["n1", "n2"]),
    ("n1 n2\tn3", ["n1", "n2", "n3"]),
    ("n1,,n2,", ["n1", "n2"]),
    ("", []),
    ("login", ["login"]),
    ("n[3,1-2]", ["n3", "n1", "n2"]),
    ("a,b,a", ["a", "b", "a"]),
    ("n[1-3,2-4]", ["n1", "n2", "n3", "n2", "n3", "n4"]),
    ("n[01-3]", ["n01", "n02", "n03"]),
    ("n[1-03]", ["n1", "n2", "n3"]),
    ("x[9-11]", ["x9", "x10", "x11"]),
    ("n[007]", ["n007"]),
    ("[1-3]", ["1", "2", "3"]),
    ("rack[1-2]-gpu[01-02]", ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"]),
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    (
        "x[0-1]y[0-1]z[0-1]",
        ["x0y0z0", "x0y0z1", "x1y0z0", "x1y0z1", "x0y1z0", "x0y1z1", "x1y1z0", "x1y1z1"],
    ),
    ("a[1-2],b1x[1-2],c", ["a1", "a2", "b1x1", "b1x2", "c"]),
    ("n_1,n.2,n-3", ["n_1", "n.2", "n-3"]),
]

EXPAND_ERRORS = [
    ("n[1-2", "without a matching ']'"),
    ("n1-2]", "without a matching '['"),
    ("n[[1-2]]", "nested"),
    ("n[5-3]", "reversed"),
    ("n[]", "empty range"),
    ("n[1-2,]", "empty range"),
    ("n[a-b]", "'a-b'"),
    ("n[1-]", "'1-'"),
    ("n[ 1-2]", "' 1-2'"),
    ("gpu[1-2]-ib", "no text after the last ']'"),
    ("n[1-2]x[1-2]y", "no text after the last ']'"),
    ("n@1", "'@'"),
    ("n;rm", "';'"),
    ("n[0-65536]", "more than 65536"),
    ("n[1-65536]x[1-65536]", "it names more than 65536 hosts"),  # 4 billion, refused before built
    ("n[1-40000,1-40000]", "it names more than 65536 hosts"),
    ("a[1-40000],b[1-40000]", "it names more than 65536 hosts"),
    ("a[1-65536],b", "it names more than 65536 hosts"),
]

FOLD_TABLE = [
    (["gpu001", "gpu002", "gpu003"], "gpu[001-003]"),
    ([], ""),
    (["a", "b", "a"], "a,b,a"),
    (["n3", "n1", "n2"], "n[3,1-2]"),
    (["b1", "a1", "a2", "b2"], "b1,a[1-2],b2"),
    (["n9", "n10", "n11"], "n[9-11]"),
    (["n09", "n10", "n11"], "n[09-11]"),
    (["n09", "n10", "n100"], "n[09-10,100]"),
    (["n8", "n9", "n010"], "n[8-9,010]"),
    (["n1", "n01", "n001"], "n[1,01,001]"),
    (["n", "n1", "n2"], "n,n[1-2]"),
    (["n1-ib", "n2-ib"], "n1-ib,n2-ib"),
    (["1", "2"], "[1-2]"),
    (["5"], "5"),
    (["rack1-gpu01", "rack1-gpu02", "rack2-gpu01"], "rack1-gpu[01-02],rack2-gpu01"),
]


@pytest.mark.parametrize("expr,hosts", EXPAND_TABLE)
def test_expand_table(expr: str, hosts: list[str]) -> None:
    assert expand(expr) == hosts


@pytest.mark.parametrize("expr,fragment", EXPAND_ERRORS)
def test_expand_errors_name_the_problem(expr: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        expand(expr)
    assert fragment in str(info.value)
    assert repr(expr) in str(info.value)


@pytest.mark.parametrize("hosts,folded", FOLD_TABLE)
def test_fold_table(hosts: list[str], folded: str) -> None:
    assert fold(hosts) == folded


@pytest.mark.parametrize("bad", ["", "a,b", "n[1]", "a b", "n$x"])
def test_fold_rejects_bad_names(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid host name"):
        fold(["ok1", bad])


def test_fold_then_expand_round_trips() -> None:
    rng = random.Random(7)
    for _ in range(300):
        hosts = _random_hosts(rng)
        assert expand(fold(hosts)) == hosts


# ------------------------------------------------------- random cases

_PREFIXES = ["n", "gpu", "rack1-gpu", "a.b", "x_", "", "node-"]


def _random_number(rng: random.Random) -> str:
    base = rng.choice([0, 1, 7, 8, 9, 10, 11, 98, 99, 100, 101, 998, 999, 1000, 1001])
    value = max(0, base + rng.randint(-2, 2))
    return str(value).zfill(len(str(value)) + rng.choice([0, 0, 0, 1, 2]))


def _random_range(rng: random.Random) -> str:
    low = _random_number(rng)
    if rng.random() < 0.4:
        return low
    high = int(low) + rng.randint(0, 12)
    return f"{low}-{str(high).zfill(rng.choice([1, len(low)]))}"


def _random_group(rng: random.Random) -> str:
    return "[" + ",".join(_random_range(rng) for _ in range(rng.randint(1, 3))) + "]"


def _random_item(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return rng.choice(_PREFIXES[:-2]) + rng.choice(["", _random_number(rng)]) or "h"
    groups = rng.choice([1, 1, 1, 2, 2, 3])
    literals = [rng.choice(_PREFIXES) for _ in range(groups)]
    if groups > 2:  # keep products small: single numbers in the inner groups
        return "".join(f"{lit}[{_random_number(rng)},{_random_number(rng)}]" for lit in literals)
    return "".join(lit + _random_group(rng) for lit in literals)


def _random_expression(rng: random.Random) -> str:
    items = [_random_item(rng) for _ in range(rng.randint(1, 4))]
    return rng.choice([",", ",", " "]).join(items)


_INVALID_TEMPLATES = [
    "n[{a}-{b}]",  # reversed when a > b
    "n[{a}]-ib",
    "n[{a}]x[{b}]y",
    "n[[{a}]]",
    "n[]",
    "n[{a},]",
    "n[{a}-x]",
    "n{a},x[{a}]]",
]


def _random_invalid(rng: random.Random) -> str:
    a = rng.randint(5, 99)
    return rng.choice(_INVALID_TEMPLATES).format(a=a, b=rng.randint(0, a - 1))


def _random_hosts(rng: random.Random) -> list[str]:
    hosts: list[str] = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.15:
            hosts.append(rng.choice(["login", "n", "n1-ib", "x1y"]))
        elif kind < 0.3 and hosts:
            hosts.append(rng.choice(hosts))  # a duplicate
        else:
            start = int(_random_number(rng))
            width = rng.choice([1, 2, 3, 4])
            prefix = rng.choice(_PREFIXES[:4])
            for n in range(start, start + rng.randint(1, 4)):
                hosts.append(prefix + str(n).zfill(rng.choice([width, width, 1])))
    return hosts


# ------------------------------------------------------- differential

_SCONTROL_BATCH = r"""
for arg in "$@"; do
  scontrol show "$MODE" "$arg" 2>&1
  echo "@@end"
done
"""


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for an offline scontrol: a minimal slurm.conf, no daemons."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed (apt-get install slurm-client)")
    conf: Path = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text(
        "ClusterName=hostlisttest\nSlurmctldHost=localhost\n"
        "NodeName=dummy CPUs=1\nPartitionName=p Nodes=dummy\n"
    )
    return {**os.environ, "SLURM_CONF": str(conf)}


def _scontrol_batch(env: dict[str, str], mode: str, args: list[str]) -> list[list[str]]:
    """Run `scontrol show MODE ARG` for every arg in one shell; lines per arg."""
    proc = subprocess.run(
        ["bash", "-c", _SCONTROL_BATCH, "batch", *args],
        env={**env, "MODE": mode},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    chunks = proc.stdout.split("@@end\n")
    assert chunks[-1] == ""
    return [chunk.splitlines() for chunk in chunks[:-1]]


def _slurm_expansion(lines: list[str]) -> object:
    if any(line.startswith("Invalid hostlist: ") for line in lines):
        return "invalid"
    return lines


def _our_expansion(expr: str) -> object:
    try:
        return expand(expr)
    except ValueError:
        return "invalid"


def test_expand_matches_scontrol_show_hostnames(slurm_env: dict[str, str]) -> None:
    rng = random.Random(20240601)
    exprs = [_random_expression(rng) for _ in range(400)]
    exprs += [_random_invalid(rng) for _ in range(60)]
    exprs += [expr for expr, _ in EXPAND_TABLE if expr]
    outputs = _scontrol_batch(slurm_env, "hostnames", exprs)
    mismatches = [
        (expr, _our_expansion(expr), _slurm_expansion(lines))
        for expr, lines in zip(exprs, outputs)
        if _our_expansion(expr) != _slurm_expansion(lines)
    ]
    assert mismatches == []


def test_fold_matches_scontrol_show_hostlist(slurm_env: dict[str, str]) -> None:
    rng = random.Random(1234)
    cases = [_random_hosts(rng) for _ in range(400)]
    cases += [hosts for hosts, _ in FOLD_TABLE if hosts]
    outputs = _scontrol_batch(slurm_env, "hostlist", [",".join(hosts) for hosts in cases])
    mismatches = [
        (hosts, fold(hosts), lines)
        for hosts, lines in zip(cases, outputs)
        if [fold(hosts)] != lines
    ]
    assert mismatches == []


def test_the_most_hosts_an_expression_may_name() -> None:
    assert len(expand("n[1-65536]")) == 65536
    assert len(expand("a[1-32768],b[1-32768]")) == 65536
    assert len(expand("r[1-256]n[1-256]")) == 65536


# ------------------------------------------------------- NodeSet

NODESET_TABLE = [
    # (hostlist, nodes in order, each once, str())
    ("gpu[001-004,010]", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"], "gpu[001-004,010]"),
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"], "gpu[01-04,07]"),
    ("n[1-3,2-4]", ["n1", "n2", "n3", "n4"], "n[1-4]"),
    ("a,b,a", ["a", "b"], "a,b"),
    ("n[3,1-2]", ["n3", "n1", "n2"], "n[3,1-2]"),
    ("gpu[01-02],cpu[1-2],gpu03", ["gpu01", "gpu02", "cpu1", "cpu2", "gpu03"], "gpu[01-02],cpu[1-2],gpu03"),
    ("n[09-11] login", ["n09", "n10", "n11", "login"], "n[09-11],login"),
    ("rack[1-2]-gpu[01-02]", ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"],
     "rack1-gpu[01-02],rack2-gpu[01-02]"),
    ("n1-ib,n2-ib,n1-ib", ["n1-ib", "n2-ib"], "n1-ib,n2-ib"),
    ("", [], ""),
    (" , ", [], ""),
]


@pytest.mark.parametrize("expr,nodes,folded", NODESET_TABLE)
def test_nodeset_from_a_hostlist(expr: str, nodes: list[str], folded: str) -> None:
    node_set = NodeSet(expr)
    assert list(node_set) == nodes
    assert len(node_set) == len(nodes)
    assert all(node in node_set for node in nodes)
    assert str(node_set) == folded
    assert NodeSet(str(node_set)) == node_set
    assert bool(node_set) == bool(nodes)


def test_nodeset_of_names_keeps_their_order_once() -> None:
    node_set = NodeSet.of(["gpu10", "gpu2", "gpu10", "gpu3"])
    assert list(node_set) == ["gpu10", "gpu2", "gpu3"]
    assert str(node_set) == "gpu[10,2-3]"
    assert str(node_set.sorted()) == "gpu[2-3,10]"
    assert NodeSet.of([]) == NodeSet() == NodeSet("")
    assert NodeSet.of(n for n in ["a1", "a2"]) == NodeSet("a[1-2]")
    assert NodeSet.of(node_set) is node_set


def test_nodeset_arithmetic_keeps_the_left_order() -> None:
    gpus = NodeSet("gpu[01-04,07]")
    assert str(gpus | NodeSet("gpu[05-06],gpu01")) == "gpu[01-04,07,05-06]"
    assert str(gpus & NodeSet("gpu07,gpu[02-03],cpu1")) == "gpu[02-03,07]"
    assert str(gpus - NodeSet("gpu[02-03]")) == "gpu[01,04,07]"
    assert str(gpus - gpus) == ""
    assert NodeSet("gpu[02-03]") <= gpus
    assert not gpus <= NodeSet("gpu[01-04]")
    assert NodeSet("n[1-2]") | NodeSet() == NodeSet("n[1-2]")


def test_nodeset_is_a_hashable_value() -> None:
    assert NodeSet("n[1-3]") == NodeSet("n3,n1,n2") == NodeSet.of(["n2", "n3", "n1"])
    assert NodeSet("n[1-3]") != NodeSet("n[1-4]")
    assert NodeSet("n01") != NodeSet("n1")  # zero padding is part of the name
    assert NodeSet("n[1-3]") != "n[1-3]"
    assert len({NodeSet("n[1-3]"), NodeSet("n[3,1-2]"), NodeSet("n[1-2]")}) == 2
    # equal sets hash alike, and different ones (all but surely) differently
    assert hash(NodeSet("n[1-3]")) == hash(NodeSet("n[3,1-2]")) != hash(NodeSet("n[1-2]"))
    assert NodeSet("n[1-3]") <= NodeSet("n[3,1-2]")  # a set is within itself
    assert repr(NodeSet("gpu[01-02]")) == "NodeSet('gpu[01-02]')"
    with pytest.raises(AttributeError):
        NodeSet("n1")._nodes = ("n2",)  # type: ignore[misc]
    node_set = NodeSet("n[3,1-2]")
    for copied in (copy.copy(node_set), copy.deepcopy(node_set), pickle.loads(pickle.dumps(node_set))):
        assert copied == node_set and str(copied) == "n[3,1-2]"


@pytest.mark.parametrize("expr,fragment", EXPAND_ERRORS)
def test_nodeset_refuses_what_expand_refuses(expr: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        NodeSet(expr)
    assert fragment in str(info.value)
    assert repr(expr) in str(info.value)


def test_nodeset_of_refuses_what_fold_refuses() -> None:
    with pytest.raises(ValueError, match="invalid host name 'n\\[1\\]'"):
        NodeSet.of(["ok1", "n[1]"])
    with pytest.raises(TypeError) as one_string:
        NodeSet.of("n[1-2]")
    assert str(one_string.value) == "NodeSet.of takes node names, not one string; use NodeSet(hostlist)"
    with pytest.raises(TypeError) as a_list:
        NodeSet(["n1"])  # type: ignore[arg-type]
    assert str(a_list.value) == "NodeSet takes a hostlist string, not list; use NodeSet.of(names) for node names"


def test_nodeset_round_trips_random_hostlists() -> None:
    rng = random.Random(11)
    for _ in range(300):
        hosts = _random_hosts(rng)
        node_set = NodeSet.of(hosts)
        assert list(node_set) == list(dict.fromkeys(hosts))
        assert NodeSet(str(node_set)) == node_set
        assert list(NodeSet(str(node_set))) == list(node_set)


# ---------------------------------------------------------------- limits and messages
# (survivors of scripts/mutation: docs/mutation.md)


def test_the_host_limit_is_exact_across_items_and_bracket_groups() -> None:
    assert len(expand("n[1-65536]")) == 65536
    assert expand("n[1-65535],a")[-2:] == ["n65535", "a"]  # 65,536 hosts: at the limit, not over it
    refused = {
        "n[1-65537]": "the range '1-65537' has more than 65536 hosts",
        "n[1-300]x[1-300]": "it names more than 65536 hosts",  # 90,000: the groups multiply
        "n[1-65536],a": "it names more than 65536 hosts",
        "n[1-2]a[1-3]b": "Slurm accepts no text after the last ']' ('b' in 'n[1-2]a[1-3]b')",
        "n[]": "an empty range is not N or N-M with decimal digits",
        "gpu 01;": "character ';' is not allowed in a host name (letters, digits, '-', '_' and '.' are)",
    }
    for expr, message in refused.items():
        with pytest.raises(ValueError) as raised:
            expand(expr)
        assert str(raised.value) == f"invalid hostlist {expr!r}: {message}" + (
            "; list such hosts one by one" if "after the last" in message else "")
