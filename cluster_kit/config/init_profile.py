"""A cluster profile derived from probed nodes (`clusterkit init --from-node`).

Pure: probe facts (one dict per node, the reference node first) and the SSH
settings that reached it in, a `Derivation` out: the profile's values, a comment
on each saying where it came from, the ports left out and why, and the nodes
that disagree with the majority. `render_profile` writes it as commented YAML.

With several nodes every value is a vote: the most common value wins, a tie
goes to the reference node (the one given as HOST), and every node that differs
is an outlier. Ports vote one by one, so a port down on one node of three stays
in `ib_hca` and that node is the outlier (preflight will fail it).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster_kit.checks.findings import section, section_problem
from cluster_kit.checks.rdma import (
    PortRef,
    best_roce_gid,
    is_active,
    loaded_peermem,
    rate_gbps,
)
from cluster_kit.checks.topology import affinity_order, nearest_hcas

Facts = Mapping[str, Any]
LAYER_FABRIC = {"InfiniBand": "infiniband", "Ethernet": "roce"}
SECTION_ORDER = ("name", "nodes", "ssh", "slurm", "network", "expect")
PROFILE_NAME_RE = re.compile(r"[^A-Za-z0-9_.,+-]")


@dataclass
class Derivation:
    """What `init` learnt: values with their comments, notes and outliers.

    `values` maps (section, key) to a value, `section` "" for top-level keys;
    `comments` has one entry per value. `notes` are comments of a section
    (e.g. a port left out); `outliers` one line per node that differs.
    """

    values: dict[tuple[str, str], Any] = field(default_factory=dict)
    comments: dict[tuple[str, str], str] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    outliers: list[str] = field(default_factory=list)

    def set(self, where: str, key: str, value: Any, comment: str) -> None:
        """One derived value and where it came from."""
        self.values[(where, key)] = value
        self.comments[(where, key)] = comment

    def note(self, where: str, text: str) -> None:
        """A comment on a section: something seen and deliberately not written."""
        self.notes.setdefault(where, []).append(text)

    def data(self) -> dict[str, Any]:
        """The profile as plain data, sections in SECTION_ORDER."""
        out: dict[str, Any] = {}
        for (where, key), value in sorted(self.values.items(), key=lambda item: _order(item[0])):
            if where:
                out.setdefault(where, {})[key] = value
            else:
                out[key] = value
        return out


def _order(where_key: tuple[str, str]) -> int:
    where, key = where_key
    return SECTION_ORDER.index(where or key)


# --------------------------------------------------------------------------- voting

@dataclass(frozen=True)
class Vote:
    """The winning value of one fact over the nodes, and who differs."""

    value: Any
    agree: tuple[str, ...]
    others: dict[str, Any]

    def share(self, total: int) -> str:
        """ "on 2/3 nodes"."""
        return f"on {len(self.agree)}/{total} node{'s' if total != 1 else ''}"


def vote(values: Mapping[str, Hashable], reference: str) -> Vote:
    """The most common of the nodes' values; a tie goes to `reference`'s value."""
    counts = Counter(values.values())
    top = max(counts.values())
    tied = [value for value, count in counts.items() if count == top]
    winner = values[reference] if values.get(reference) in tied else tied[0]
    agree = tuple(node for node, value in values.items() if value == winner)
    return Vote(winner, agree, {node: value for node, value in values.items() if value != winner})


def record_outliers(out: Derivation, what: str, result: Vote, shown: Any = str) -> None:
    """One outlier line per node whose value lost the vote."""
    for node, value in result.others.items():
        out.outliers.append(f"{node}: {what} is {shown(value)} "
                            f"(the majority's: {shown(result.value)}, on {len(result.agree)} node(s))")


# --------------------------------------------------------------------------- ports

@dataclass(frozen=True)
class Port:
    """One HCA port as `init` sees it."""

    name: str          # mlx5_0:1
    layer: str         # InfiniBand | Ethernet | ""
    rate: float | None
    active: bool
    state: str         # "4: ACTIVE / 5: LinkUp"
    ref: PortRef

    @property
    def kind(self) -> tuple[str, float | None]:
        """Link layer and rate: ports of one kind are one fabric."""
        return self.layer, self.rate


def node_ports(facts: Facts) -> list[Port]:
    """Every HCA port of one node, in the kernel's order."""
    ports = []
    for hca, hca_facts in (section(facts, "rdma").get("hcas") or {}).items():
        for number, data in (hca_facts.get("ports") or {}).items():
            ref = PortRef(hca, number, data)
            ports.append(Port(ref.name, ref.attr("link_layer"), rate_gbps(ref.attr("rate")),
                              is_active(ref), f"{ref.attr('state')} / {ref.attr('phys_state')}", ref))
    return ports


def kind_text(kind: tuple[str, float | None]) -> str:
    """ "InfiniBand 400 Gb/s"."""
    layer, rate = kind
    return f"{layer or 'unknown link layer'} {gbps(rate)} Gb/s" if rate else (layer or "unknown link layer")


def gbps(rate: float | None) -> str:
    """400.0 -> "400", 2.5 -> "2.5"."""
    return "?" if rate is None else f"{rate:g}"


def main_kind(ports: Sequence[Port]) -> tuple[str, float | None] | None:
    """The kind most ACTIVE ports of a node share (the compute fabric), or None."""
    kinds = Counter(port.kind for port in ports if port.active)
    if not kinds:
        return None
    top = max(kinds.values())
    return next(port.kind for port in ports if port.active and kinds[port.kind] == top)


# --------------------------------------------------------------------------- the derivation

def derive(facts_by_node: Mapping[str, Facts], ssh: Mapping[str, tuple[Any, str]],
           name: str) -> Derivation:
    """The profile for these nodes (the first is the reference node).

    `ssh` is the ssh section's values, each with where it came from (ssh_config).
    """
    nodes = list(facts_by_node)
    out = Derivation()
    out.set("", "name", name, "the file name (change it freely)")
    out.set("", "nodes", _fold(nodes), f"the node{'s' if len(nodes) > 1 else ''} probed")
    for key, (value, origin) in ssh.items():
        out.set("ssh", key, value, origin)
    derive_gpus(out, facts_by_node)
    fabric = derive_network(out, facts_by_node)
    derive_nccl(out, facts_by_node)
    if fabric != "ethernet":
        derive_peermem(out, facts_by_node)
    derive_memlock(out, facts_by_node)
    return out


def _fold(nodes: Sequence[str]) -> str:
    from cluster_kit.hostlist import fold

    return fold(nodes)


def derive_network(out: Derivation, facts_by_node: Mapping[str, Facts]) -> str:
    """fabric, ib_hca, gid_index, ib_rate_gbps and socket_ifname; returns the fabric."""
    nodes = list(facts_by_node)
    ports = {node: node_ports(facts) for node, facts in facts_by_node.items()}
    kinds = vote({node: main_kind(found) for node, found in ports.items()}, nodes[0])
    record_outliers(out, "the compute fabric", kinds,
                    lambda kind: kind_text(kind) if kind else "no ACTIVE RDMA port")
    if kinds.value is None or kinds.value[0] not in LAYER_FABRIC:
        why = _no_rdma_reason(facts_by_node[nodes[0]])
        out.set("network", "fabric", "ethernet", f"{why} {kinds.share(len(nodes))}: NCCL uses TCP sockets")
        derive_socket_ifname(out, facts_by_node)
        return "ethernet"
    fabric = LAYER_FABRIC[kinds.value[0]]
    out.set("network", "fabric", fabric,
            f"link layer {kinds.value[0]} of the ACTIVE ports {kinds.share(len(nodes))} (ports/*/link_layer)")
    chosen = derive_ib_hca(out, ports, kinds.value, facts_by_node[nodes[0]])
    derive_socket_ifname(out, facts_by_node)
    if fabric == "roce":
        derive_gid_index(out, ports, chosen)
    if kinds.value[1]:
        out.set("expect", "ib_rate_gbps", _number(kinds.value[1]),
                f"rate of the ib_hca ports {kinds.share(len(nodes))} (ports/*/rate)")
    return fabric


def _no_rdma_reason(facts: Facts) -> str:
    problem = section_problem(facts, "rdma")
    if problem:
        return f"no RDMA device ({problem})"
    return "no ACTIVE RDMA port (/sys/class/infiniband)"


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def derive_ib_hca(out: Derivation, ports: Mapping[str, list[Port]],
                  kind: tuple[str, float | None], reference: Facts | None = None) -> list[str]:
    """ib_hca: each port ACTIVE with the fabric's kind on most nodes, ordered by the
    reference node's GPU affinity (GPU 0's nearest HCA first) where its probe read the
    PCI topology; others noted."""
    nodes = list(ports)
    good = {node: {p.name for p in node_list if p.active and p.kind == kind} for node, node_list in ports.items()}
    names = list(dict.fromkeys(p.name for node_list in ports.values() for p in node_list))
    chosen = [name for name in names
              if vote({node: name in good[node] for node in nodes}, nodes[0]).value]
    known = reference is not None and bool(nearest_hcas(reference))
    if reference is not None and known:
        chosen = affinity_order(reference, chosen)
    by_gpu = ", in GPU order (each GPU's nearest HCA: same PCIe switch, else NUMA node)" if known else ""
    out.set("network", "ib_hca", chosen,
            f"the {len(chosen)} ACTIVE {kind_text(kind)} port{'s' if len(chosen) != 1 else ''} "
            f"(/sys/class/infiniband/*/ports/*/state, phys_state){by_gpu}")
    _note_left_out(out, ports, chosen, kind)
    _port_outliers(out, ports, chosen, good)
    return chosen


def _note_left_out(out: Derivation, ports: Mapping[str, list[Port]], chosen: list[str],
                   kind: tuple[str, float | None]) -> None:
    """A comment for every port of the reference node that is not in ib_hca."""
    reference = next(iter(ports))
    fabric = f"the {len(chosen)} {kind_text(kind)} port{'s' if len(chosen) != 1 else ''}"
    for port in ports[reference]:
        if port.name in chosen:
            continue
        if not port.active:  # a port without a link reports the lowest rate: its state is the news
            out.note("network", f"{port.name}: {port.state} on {reference}: left out")
        elif port.kind != kind:
            out.note("network", f"{port.name}: {kind_text(port.kind)}, unlike {fabric}: left out")
        else:
            out.note("network", f"{port.name}: ACTIVE on {reference} but not on most nodes: left out")


def _port_outliers(out: Derivation, ports: Mapping[str, list[Port]], chosen: list[str],
                   good: Mapping[str, set[str]]) -> None:
    for node, node_list in ports.items():
        by_name = {p.name: p for p in node_list}
        for name in chosen:
            if name in good[node]:
                continue
            port = by_name.get(name)
            why = "missing" if port is None else (
                port.state if not port.active else kind_text(port.kind))
            out.outliers.append(f"{node}: network.ib_hca port {name} is {why}")


def derive_gid_index(out: Derivation, ports: Mapping[str, list[Port]], chosen: list[str]) -> None:
    """gid_index: the RoCE v2 GID with an IPv4-mapped address, one index for all ports."""
    nodes = list(ports)
    found: dict[str, Hashable] = {}
    detail: dict[str, str] = {}
    for node, node_list in ports.items():
        picks = {p.name: best_roce_gid(p.ref) for p in node_list if p.name in chosen}
        indexes = {pick[0] for pick in picks.values() if pick}
        found[node] = next(iter(indexes)) if len(indexes) == 1 and all(picks.values()) else None
        detail[node] = "; ".join(f"{name}: {pick[0]} ({pick[1]})" if pick else f"{name}: none"
                                 for name, pick in picks.items())
    result = vote(found, nodes[0])
    for node in result.others:
        out.outliers.append(f"{node}: network.gid_index differs ({detail[node]})")
    if result.value is None:
        out.note("network", f"gid_index left out: no single RoCE v2 GID with an IPv4 address "
                 f"on every port ({detail[nodes[0]]}); give the netdevs an IPv4 address")
        return
    example = next(pick for pick in (best_roce_gid(p.ref) for p in ports[result.agree[0]]
                                     if p.name in chosen) if pick)
    out.set("network", "gid_index", int(str(result.value)),
            f"{example[1]} on every ib_hca port {result.share(len(nodes))} (gids/*, gid_attrs/types/*)")


def derive_socket_ifname(out: Derivation, facts_by_node: Mapping[str, Facts]) -> None:
    """socket_ifname: the default route's interface, when the node lists it as up."""
    nodes = list(facts_by_node)
    result = vote({node: section(facts, "route").get("default_interface")
                   for node, facts in facts_by_node.items()}, nodes[0])
    record_outliers(out, "the default route's interface", result, lambda v: v or "none")
    interfaces = section(facts_by_node[result.agree[0]], "net").get("interfaces") or {}
    name = result.value
    if not name:
        out.note("network", "socket_ifname left out: no default route in /proc/net/route")
        return
    if name not in interfaces:
        out.note("network", f"socket_ifname left out: the default route's interface {name} "
                 "is not in /sys/class/net")
        return
    others = [other for other in interfaces if other != name and other.startswith(name)]
    value = f"={name}" if others else name  # NCCL matches prefixes: "eth1" would take eth10 too
    exact = f" (= exact: {', '.join(others)} would match the prefix)" if others else ""
    out.set("network", "socket_ifname", value,
            f"the default route's interface {result.share(len(nodes))} (/proc/net/route){exact}")


def derive_gpus(out: Derivation, facts_by_node: Mapping[str, Facts]) -> None:
    """GPU count, model and driver floor from nvidia-smi."""
    nodes = list(facts_by_node)
    gpus = {node: section(facts, "gpu") for node, facts in facts_by_node.items()}
    ok = vote({node: g.get("status") == "ok" and bool(g.get("gpus")) for node, g in gpus.items()}, nodes[0])
    if not ok.value:
        problem = section_problem(facts_by_node[nodes[0]], "gpu") or "nvidia-smi lists no GPU"
        out.note("expect", f"GPU checks left out: {problem}")
        return
    seen = {node: g for node, g in gpus.items() if node in ok.agree}
    count = vote({node: len(g["gpus"]) for node, g in seen.items()}, ok.agree[0])
    model = vote({node: _gpu_model(g) for node, g in seen.items()}, ok.agree[0])
    driver = vote({node: g.get("driver") for node, g in seen.items()}, ok.agree[0])
    for node in ok.others:
        out.outliers.append(f"{node}: no GPUs ({section_problem(facts_by_node[node], 'gpu') or 'none listed'})")
    for what, result in (("the GPU count", count), ("the GPU model", model), ("the driver", driver)):
        record_outliers(out, what, result)
    total = len(nodes)
    out.set("slurm", "gpus_per_node", count.value, f"GPUs nvidia-smi lists {count.share(total)}")
    out.set("expect", "gpus_per_node", count.value, f"GPUs nvidia-smi lists {count.share(total)}")
    if model.value:
        out.set("expect", "gpu_model", model.value, f"nvidia-smi's GPU name {model.share(total)}")
    if driver.value:
        out.set("expect", "min_driver", str(driver.value),
                f"nvidia-smi's driver version {driver.share(total)}: newer passes, older fails")


def _gpu_model(gpu: Mapping[str, Any]) -> str:
    names = Counter(str(g.get("name") or "") for g in gpu.get("gpus") or [])
    return names.most_common(1)[0][0] if names else ""


def derive_nccl(out: Derivation, facts_by_node: Mapping[str, Facts]) -> None:
    """The NCCL floor: the version of the libnccl a job would load."""
    nodes = list(facts_by_node)
    versions = vote({node: section(facts, "nccl").get("version") if section(facts, "nccl").get("status") == "ok"
                     else None for node, facts in facts_by_node.items()}, nodes[0])
    record_outliers(out, "the NCCL version", versions, lambda v: v or "no loadable libnccl")
    if not versions.value:
        problem = section_problem(facts_by_node[nodes[0]], "nccl") or "no loadable libnccl"
        out.note("expect", f"nccl left out: {problem}")
        return
    where = section(facts_by_node[versions.agree[0]], "nccl")
    out.set("expect", "nccl", f">={versions.value}",
            f"libnccl {versions.value} ({where.get('source')}: {where.get('path')}) {versions.share(len(nodes))}")


def derive_peermem(out: Derivation, facts_by_node: Mapping[str, Facts]) -> None:
    """peermem: whether GPUDirect RDMA's module is loaded on most nodes."""
    nodes = list(facts_by_node)
    loaded = {node: tuple(loaded_peermem(section(facts, "peermem"))) for node, facts in facts_by_node.items()}
    result = vote({node: bool(names) for node, names in loaded.items()}, nodes[0])
    record_outliers(out, "GPUDirect RDMA (nvidia_peermem / nv_peer_mem)", result,
                    lambda v: "loaded" if v else "not loaded")
    if result.value:
        module = loaded[result.agree[0]][0]
        out.set("expect", "peermem", True, f"{module} loaded {result.share(len(nodes))} (/sys/module)")
    else:
        out.set("expect", "peermem", False,
                f"neither nvidia_peermem nor nv_peer_mem loaded {result.share(len(nodes))}: "
                "GPUDirect RDMA is off; `modprobe nvidia_peermem`, then set this to true")


def derive_memlock(out: Derivation, facts_by_node: Mapping[str, Facts]) -> None:
    """memlock: the RLIMIT_MEMLOCK the probe's SSH session got."""
    nodes = list(facts_by_node)
    limits = vote({node: section(facts, "memlock").get("soft_kib") for node, facts in facts_by_node.items()},
                  nodes[0])
    record_outliers(out, "ulimit -l", limits, lambda v: f"{v} KiB" if v and v != "unlimited" else str(v))
    value = limits.value
    if value != "unlimited" and not str(value).isdigit():
        problem = section_problem(facts_by_node[nodes[0]], "memlock") or f"unreadable limit {value!r}"
        out.note("expect", f"memlock left out: {problem}")
        return
    shown = "unlimited" if value == "unlimited" else kib_size(int(str(value)))
    low = "" if value == "unlimited" else "; RDMA wants unlimited (a Slurm job may get another limit)"
    out.set("expect", "memlock", shown, f"ulimit -l of an SSH session {limits.share(len(nodes))}{low}")


def kib_size(kib: int) -> str:
    """8192 -> "8M", 1048576 -> "1G", 100 -> "100K" (a size expect.memlock reads)."""
    for unit, size in (("T", 1024 ** 3), ("G", 1024 ** 2), ("M", 1024)):
        if kib and kib % size == 0:
            return f"{kib // size}{unit}"
    return f"{kib}K"


def profile_name(text: str) -> str:
    """A profile name from a file stem or host name (letters, digits, _ . , + -)."""
    return PROFILE_NAME_RE.sub("-", text).strip("-") or "cluster"


# --------------------------------------------------------------------------- YAML text

def render_profile(out: Derivation, header: Sequence[str]) -> str:
    """The profile as YAML: every value under the comment that says where it came from."""
    lines = [f"# {line}" if line else "#" for line in header]
    data = out.data()
    for key, value in data.items():
        if not isinstance(value, dict):
            lines += [f"# {out.comments[('', key)]}", f"{key}: {scalar(value)}"]
            continue
        lines.append(f"{key}:")
        for sub, item in value.items():
            lines += [f"  # {out.comments[(key, sub)]}", f"  {sub}: {scalar(item)}"]
        lines += [f"  # {note}" for note in out.notes.get(key, [])]
    for where, notes in out.notes.items():
        if where not in data:
            lines += [f"# {where}: {note}" for note in notes]
    return "\n".join(lines) + "\n"


def scalar(value: Any) -> str:
    """A YAML flow value: JSON's spelling is valid YAML and quotes every string."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.+-]*", value) \
            and value.lower() not in ("true", "false", "yes", "no", "on", "off", "null", "y", "n"):
        return value
    if isinstance(value, list):
        return "[" + ", ".join(scalar(item) for item in value) + "]"
    return json.dumps(value)


# --------------------------------------------------------------------------- the ssh section

def ssh_section(endpoint: Any, options: Mapping[str, Any], config_file: str | None,
                host: str) -> dict[str, tuple[Any, str]]:
    """The profile's ssh values, each with where it came from.

    `endpoint` is how `host` was reached (sshconfig.Endpoint), `options` what
    ssh_config says for it, `config_file` the --ssh-config given (None: the
    default ~/.ssh/config, which the profile then needs not name).
    """
    source = f"ssh_config {config_file or '~/.ssh/config'} for {host}"
    out: dict[str, tuple[Any, str]] = {}
    if config_file:
        out["config_file"] = (config_file, "--ssh-config: node names resolve through it (HostName, ...)")
    user_origin = f"User in {source}" if options.get("user") else "the local user (ssh_config names none)"
    out["user"] = (endpoint.user, user_origin)
    if options.get("port") or endpoint.port != 22:
        out["port"] = (endpoint.port, f"Port in {source}")
    if not endpoint.default_identities:
        out["identity_file"] = (endpoint.identity_files[0], f"IdentityFile in {source}")
    if options.get("userknownhostsfile"):
        out["known_hosts"] = (endpoint.user_known_hosts[0], f"UserKnownHostsFile in {source}")
    if endpoint.proxy_jump:
        out["proxy_jump"] = (",".join(str(hop) for hop in endpoint.proxy_jump), f"ProxyJump in {source}")
    return out
