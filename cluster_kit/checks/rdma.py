"""rdma.*: HCAs, ports, link rate/layer, GID index and peermem against the profile.

Which ports are checked:
- `network.ib_hca` set: exactly the listed ports ("mlx5_0:1"; a bare "mlx5_0"
  means all its ports, as in NCCL_IB_HCA). Any problem on them fails: NCCL
  was told to use them.
- `network.ib_hca` unset: every port of every HCA, since NCCL then uses every
  active one. A bad port only warns (NCCL skips it, losing bandwidth) unless no
  port is usable at all, which fails.
`network.fabric: ethernet` skips all of this; with no fabric and no ib_hca only
rdma.peermem runs (when expected).
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    failed,
    passed,
    plural,
    section,
    section_problem,
    settings,
    warned,
)

LINK_LAYER = {"infiniband": "InfiniBand", "roce": "Ethernet"}
RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
PEERMEM_FIX = ("sudo modprobe nvidia_peermem (and list it in /etc/modules-load.d/ so it survives a reboot); "
               "without it NCCL cannot use GPUDirect RDMA and stages every transfer through host memory")


@dataclass(frozen=True)
class PortRef:
    """One HCA port and its facts."""

    hca: str
    port: str
    data: Mapping[str, Any]

    @property
    def name(self) -> str:
        """The NCCL_IB_HCA spelling, "mlx5_0:1"."""
        return f"{self.hca}:{self.port}"

    def attr(self, key: str) -> str:
        """A sysfs attribute's text ("" when unreadable)."""
        return str(self.data.get(key) or "")


@dataclass
class Selection:
    """The ports a profile makes NCCL use, and the listed ones that do not exist."""

    ports: list[PortRef]
    missing: list[str] = field(default_factory=list)
    strict: bool = True          # ib_hca given: problems fail instead of warn
    present: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- selection

def listed_hcas(network: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """network.ib_hca as (hca, port or None); a list or NCCL's comma string, "=" stripped."""
    value = network.get("ib_hca") or []
    items = value.split(",") if isinstance(value, str) else [str(item) for item in value]
    entries = []
    for item in items:
        name, _, port = item.strip().lstrip("=").partition(":")
        if name:
            entries.append((name, port or None))
    return entries


def hca_facts(facts: Facts) -> Mapping[str, Mapping[str, Any]]:
    """{hca: facts} from the probe's rdma section."""
    return section(facts, "rdma").get("hcas") or {}


def all_ports(hcas: Mapping[str, Mapping[str, Any]], hca: str) -> list[PortRef]:
    """Every port of one HCA."""
    return [PortRef(hca, port, data) for port, data in (hcas[hca].get("ports") or {}).items()]


def select_ports(facts: Facts, network: Mapping[str, Any]) -> Selection:
    """The ports to check (see the module docstring) and the missing listed ones."""
    hcas = hca_facts(facts)
    entries = listed_hcas(network)
    if not entries:
        return Selection([ref for hca in hcas for ref in all_ports(hcas, hca)], strict=False, present=list(hcas))
    selection = Selection([], present=list(hcas))
    for hca, port in entries:
        if hca not in hcas:
            selection.missing.append(hca)
        elif port is None:
            selection.ports += all_ports(hcas, hca)
        elif port in (hcas[hca].get("ports") or {}):
            selection.ports.append(PortRef(hca, port, hcas[hca]["ports"][port]))
        else:
            selection.missing.append(f"{hca}:{port}")
    return selection


def state_word(text: str) -> str:
    """ "4: ACTIVE" -> "ACTIVE", "5: LinkUp" -> "LinkUp"."""
    return text.partition(":")[2].strip() or text.strip()


def is_active(ref: PortRef) -> bool:
    """ACTIVE and LinkUp: the only state NCCL can use."""
    return state_word(ref.attr("state")) == "ACTIVE" and state_word(ref.attr("phys_state")) == "LinkUp"


def nccl_ib_hca(refs: list[PortRef]) -> str:
    """The NCCL_IB_HCA value (exact match) that names these ports: "=mlx5_0:1,mlx5_1:1"."""
    return "=" + ",".join(ref.name for ref in refs)


def ib_hca_setting(refs: list[PortRef]) -> str:
    """The profile line that selects these ports, with the NCCL_IB_HCA it renders to."""
    return (f"network.ib_hca: [{', '.join(ref.name for ref in refs)}] "
            f"(the job then gets NCCL_IB_HCA=\"{nccl_ib_hca(refs)}\")")


def use_instead(selection: Selection, bad: list[PortRef], good: list[PortRef]) -> str:
    """The "or drop X from network.ib_hca, leaving network.ib_hca: [...]" part of a fix."""
    if not good:
        return ""
    if selection.strict:
        return f"; or drop {', '.join(ref.name for ref in bad)} from network.ib_hca, leaving {ib_hca_setting(good)}"
    return f"; or list only the working ports: network.ib_hca: [{', '.join(ref.name for ref in good)}]"


def verdict(check_id: str, selection: Selection, usable: list[PortRef], message: str, fix: str) -> Finding:
    """fail when the ports were listed or none is usable; warn otherwise (NCCL skips them)."""
    if selection.strict or not usable:
        return failed(check_id, message, fix)
    return warned(check_id, message, fix)


# ---------------------------------------------------------------- rdma.hca_present

def check_hca_present(facts: Facts, selection: Selection) -> Finding:
    """rdma.hca_present: the listed HCAs (or, unlisted, at least one) exist."""
    problem = section_problem(facts, "rdma")
    if problem is not None:
        return failed("rdma.hca_present", f"no RDMA devices: {problem}",
                      "load the RDMA driver (`modprobe mlx5_ib`) and check the cards (`lspci | grep -i mellanox`); "
                      "for a TCP-only cluster set network.fabric: ethernet")
    if not selection.present:
        return failed("rdma.hca_present", "no RDMA device under /sys/class/infiniband",
                      "load the RDMA driver (`modprobe mlx5_ib`) or set network.fabric: ethernet")
    present = ", ".join(selection.present)
    if not selection.missing:
        return passed("rdma.hca_present", f"{plural(len(selection.present), 'HCA')} present: {present}")
    working = [ref for ref in selection.ports if is_active(ref)]
    if not working:
        working = [ref for hca in hca_facts(facts) for ref in all_ports(hca_facts(facts), hca) if is_active(ref)]
    fix = ("check the card and its driver (`lspci | grep -i mellanox`, `dmesg | grep mlx5`)"
           + (f"; or use what is present: {ib_hca_setting(working)}" if working else ""))
    return failed("rdma.hca_present", f"{', '.join(selection.missing)} of network.ib_hca "
                  f"{'is' if len(selection.missing) == 1 else 'are'} missing (present: {present})", fix)


# ---------------------------------------------------------------- rdma.port_state

def port_state_fix(ref: PortRef) -> str:
    """What to do about one non-ACTIVE port, from its physical state."""
    phys = state_word(ref.attr("phys_state"))
    tools = f"`ibstat {ref.hca} {ref.port}`, `mlxlink -d {ref.hca} -p {ref.port}`"
    if phys == "Polling":
        return f"{ref.name} has no link partner: check the cable and the switch port ({tools})"
    if phys == "Disabled":
        return f"{ref.name} is disabled: enable the port on the HCA or the switch ({tools})"
    if phys == "LinkUp":
        return (f"{ref.name} has a link but no subnet manager activated it: check that opensm/UFM runs "
                f"and sees this port (`sminfo`, {tools})")
    return f"{ref.name} has no stable link: check the cable/transceiver and the switch port ({tools})"


def check_port_state(selection: Selection) -> Finding | None:
    """rdma.port_state: every selected port is ACTIVE / LinkUp."""
    if not selection.ports:
        return None
    bad = [ref for ref in selection.ports if not is_active(ref)]
    good = [ref for ref in selection.ports if is_active(ref)]
    if not bad:
        return passed("rdma.port_state", f"{plural(len(good), 'port')} ACTIVE / LinkUp: "
                      f"{', '.join(ref.name for ref in good)}")
    message = "; ".join(f"{ref.hca} port {ref.port} is {state_word(ref.attr('state')) or 'unreadable'} "
                        f"(phys_state {ref.attr('phys_state') or 'unreadable'})" for ref in bad)
    fix = "; ".join(port_state_fix(ref) for ref in bad) + use_instead(selection, bad, good)
    return verdict("rdma.port_state", selection, good, message, fix)


# ---------------------------------------------------------------- rdma.link_rate

def rate_gbps(text: str) -> float | None:
    """ "400 Gb/sec (4X NDR)" -> 400.0; None when unreadable."""
    match = RATE_RE.match(text)
    return float(match.group(1)) if match else None


def check_link_rate(selection: Selection, minimum: float) -> Finding | None:
    """rdma.link_rate: every ACTIVE selected port runs at >= expect.ib_rate_gbps.

    Ports that are not ACTIVE are rdma.port_state's business (their rate is
    meaningless), so they are left out here.
    """
    active = [ref for ref in selection.ports if is_active(ref)]
    if not active:
        return None
    slow = [ref for ref in active if (rate_gbps(ref.attr("rate")) or 0.0) < minimum]
    fast = [ref for ref in active if ref not in slow]
    shown = f"{minimum:g} Gb/sec"
    if not slow:
        return passed("rdma.link_rate", f"{plural(len(fast), 'port')} at >= {shown}")
    message = "; ".join(f"{ref.hca} port {ref.port} runs at {ref.attr('rate') or 'an unreadable rate'}, "
                        f"below expect.ib_rate_gbps {minimum:g}" for ref in slow)
    fix = ("a link that trained to a lower speed or width points to the cable, transceiver or switch port: "
           + ", ".join(f"`mlxlink -d {ref.hca} -p {ref.port}`" for ref in slow)
           + "; reseat or replace the cable" + use_instead(selection, slow, fast))
    return verdict("rdma.link_rate", selection, fast, message, fix)


# ---------------------------------------------------------------- rdma.link_layer

def check_link_layer(selection: Selection, fabric: str) -> Finding | None:
    """rdma.link_layer: InfiniBand ports for fabric infiniband, Ethernet ports for roce."""
    if not selection.ports:
        return None
    expected = LINK_LAYER[fabric]
    wrong = [ref for ref in selection.ports if ref.attr("link_layer") != expected]
    right = [ref for ref in selection.ports if ref not in wrong]
    if not wrong:
        return passed("rdma.link_layer", f"{plural(len(right), 'port')} on {expected}")
    message = "; ".join(f"{ref.hca} port {ref.port} link layer is {ref.attr('link_layer') or 'unreadable'}, "
                        f"but network.fabric is {fabric}" for ref in wrong)
    other = "roce (with network.gid_index)" if fabric == "infiniband" else "infiniband"
    fix = f"set network.fabric: {other} if that is this cluster's fabric" + use_instead(selection, wrong, right)
    return verdict("rdma.link_layer", selection, right, message, fix)


# ---------------------------------------------------------------- rdma.gid_index

def gid_groups(gid: str) -> list[int]:
    """ "fe80:0000:...:8a12" -> eight 16-bit numbers ([] when malformed)."""
    parts = gid.strip().split(":")
    try:
        numbers = [int(part, 16) for part in parts]
    except ValueError:
        return []
    return numbers if len(numbers) == 8 else []


def gid_address(gid: str) -> tuple[str, str]:
    """(kind, address) of a GID: kind is "zero", "ipv4", "link-local", "global" or "bad"."""
    groups = gid_groups(gid)
    if not groups:
        return "bad", gid
    if not any(groups):
        return "zero", ""
    if not any(groups[:5]) and groups[5] == 0xFFFF:
        return "ipv4", f"{groups[6] >> 8}.{groups[6] & 0xFF}.{groups[7] >> 8}.{groups[7] & 0xFF}"
    address = str(ipaddress.IPv6Address(sum(g << (16 * (7 - i)) for i, g in enumerate(groups))))
    return ("link-local" if groups[0] & 0xFFC0 == 0xFE80 else "global"), address


def best_roce_gid(ref: PortRef) -> tuple[str, str] | None:
    """(index, description) of the port's RoCE v2 GID with an IPv4 (else global IPv6) address."""
    gids = ref.data.get("gids") or {}
    types = ref.data.get("gid_types") or {}
    ndevs = ref.data.get("gid_ndevs") or {}
    for wanted in ("ipv4", "global"):
        for index in sorted(gids, key=int):
            kind, address = gid_address(gids[index])
            if kind == wanted and types.get(index) == "RoCE v2":
                where = f" on {ndevs[index]}" if ndevs.get(index) else ""
                return index, f"RoCE v2, {'IPv4 ' if kind == 'ipv4' else ''}{address}{where}"
    return None


def gid_problem(ref: PortRef, index: str, fabric: str | None) -> str | None:
    """Why GID `index` of this port is unusable for NCCL, or None."""
    gid = (ref.data.get("gids") or {}).get(index)
    if gid is None:
        return f"{ref.hca} port {ref.port} has no GID index {index}"
    kind, _ = gid_address(gid)
    if kind in ("zero", "bad"):
        what = "all zero (no address)" if kind == "zero" else f"malformed ({gid})"
        return f"{ref.hca} port {ref.port} GID {index} is {what}"
    gid_type = (ref.data.get("gid_types") or {}).get(index)
    if fabric == "roce" and gid_type != "RoCE v2":
        return f"{ref.hca} port {ref.port} GID {index} is {gid_type or 'of unknown type'}, not RoCE v2"
    return None


def gid_fix(bad: list[PortRef], fabric: str | None) -> str:
    """Name the index that works (one for all ports when they agree)."""
    if fabric != "roce":
        return "set network.gid_index: 0 (the port GID) / export NCCL_IB_GID_INDEX=0"
    best = {ref.name: best_roce_gid(ref) for ref in bad}
    choices = {choice[0] for choice in best.values() if choice}
    if len(choices) == 1 and all(best.values()):
        index, description = next(choice for choice in best.values() if choice)
        return f"set network.gid_index: {index} ({description}) / export NCCL_IB_GID_INDEX={index}"
    parts = [f"{name}: index {choice[0]} ({choice[1]})" if choice else
             f"{name} has no RoCE v2 GID with an IPv4 or global address: give its netdev an IP address"
             for name, choice in best.items()]
    return "; ".join(parts) + "; network.gid_index is one value for every HCA, so make the GID tables agree"


def check_gid_index(selection: Selection, index: str, fabric: str | None) -> Finding | None:
    """rdma.gid_index: network.gid_index exists on every selected port, is not all-zero, is RoCE v2 (roce)."""
    if not selection.ports:
        return None
    problems = {ref.name: gid_problem(ref, index, fabric) for ref in selection.ports}
    bad = [ref for ref in selection.ports if problems[ref.name]]
    if not bad:
        kind = "RoCE v2" if fabric == "roce" else "set"
        return passed("rdma.gid_index", f"GID {index} is {kind} on {', '.join(ref.name for ref in selection.ports)}")
    return failed("rdma.gid_index", "; ".join(str(problems[ref.name]) for ref in bad), gid_fix(bad, fabric))


# ---------------------------------------------------------------- rdma.peermem

def loaded_peermem(peermem: Mapping[str, Any]) -> list[str]:
    """The GPUDirect RDMA peer-memory modules the probe found loaded."""
    return [name for name in PEERMEM_MODULES if peermem.get(name)]


def check_peermem(facts: Facts) -> Finding:
    """rdma.peermem: nvidia_peermem or nv_peer_mem is loaded."""
    problem = section_problem(facts, "peermem")
    if problem is not None:
        return failed("rdma.peermem", f"cannot tell whether nvidia_peermem is loaded: {problem}", PEERMEM_FIX)
    loaded = loaded_peermem(section(facts, "peermem"))
    if loaded:
        return passed("rdma.peermem", f"{loaded[0]} is loaded")
    return failed("rdma.peermem", "neither nvidia_peermem nor nv_peer_mem is loaded (no GPUDirect RDMA)", PEERMEM_FIX)


# ---------------------------------------------------------------- family

def port_checks_run(network: Mapping[str, Any]) -> bool:
    """Whether the RDMA port checks run: an RDMA fabric (infiniband, roce), or HCAs
    listed in ib_hca on a fabric that is not plain ethernet."""
    fabric = network.get("fabric")
    return fabric != "ethernet" and bool(fabric in LINK_LAYER or listed_hcas(network))


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """The rdma.* checks the profile's network/expect settings ask for."""
    network, expect = settings(profile, "network"), settings(profile, "expect")
    fabric = network.get("fabric")
    if fabric == "ethernet":
        return []
    findings: list[Finding | None] = []
    if fabric in LINK_LAYER or listed_hcas(network):
        selection = select_ports(facts, network)
        findings += [check_hca_present(facts, selection), check_port_state(selection)]
        if expect.get("ib_rate_gbps") is not None:
            findings.append(check_link_rate(selection, float(expect["ib_rate_gbps"])))
        if fabric in LINK_LAYER:
            findings.append(check_link_layer(selection, str(fabric)))
        if network.get("gid_index") is not None:
            findings.append(check_gid_index(selection, str(network["gid_index"]), fabric))
    if expect.get("peermem"):
        findings.append(check_peermem(facts))
    return [finding for finding in findings if finding is not None]
