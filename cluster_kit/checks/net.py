"""net.socket_ifname: the interface(s) NCCL_SOCKET_IFNAME selects exist and are up.

NCCL's syntax: a comma-separated list of name prefixes ("eth" matches eth0,
eth1); a leading "^" excludes the listed prefixes instead; a leading "=" makes
the names exact ("=eth0" matches eth0 only). "^=docker0" combines both.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    failed,
    passed,
    section,
    section_problem,
    settings,
    warned,
)


@dataclass(frozen=True)
class IfnameSpec:
    """A parsed NCCL_SOCKET_IFNAME value."""

    names: tuple[str, ...]
    exclude: bool = False
    exact: bool = False

    def matches(self, interface: str) -> bool:
        """Whether NCCL would consider this interface."""
        hit = any(interface == name if self.exact else interface.startswith(name) for name in self.names)
        return hit != self.exclude


def parse_ifname(value: Any) -> IfnameSpec:
    """ "^docker,lo" / "=eth0" / "eth" (or a YAML list of names) -> IfnameSpec."""
    text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    text = text.strip()
    exclude = text.startswith("^")
    text = text.lstrip("^")
    exact = text.startswith("=")
    names = tuple(name.strip() for name in text.lstrip("=").split(",") if name.strip())
    return IfnameSpec(names, exclude, exact)


def is_up(interface: Mapping[str, Any]) -> bool:
    """operstate up, or "unknown" with carrier (loopback and some virtual devices)."""
    state = interface.get("operstate")
    return state == "up" or (state == "unknown" and interface.get("carrier") == "1")


def describe(name: str, interface: Mapping[str, Any]) -> str:
    """ "eth1 (operstate down)"."""
    return f"{name} (operstate {interface.get('operstate') or 'unreadable'})"


def check_socket_ifname(facts: Facts, value: Any) -> Finding:
    """net.socket_ifname: something matches network.socket_ifname and it is up."""
    problem = section_problem(facts, "net")
    if problem is not None:
        return failed("net.socket_ifname", f"cannot list network interfaces: {problem}",
                      "check that /sys/class/net is readable on the node")
    interfaces: Mapping[str, Mapping[str, Any]] = section(facts, "net").get("interfaces") or {}
    spec = parse_ifname(value)
    matching = [name for name in interfaces if spec.matches(name)]
    up = [name for name in matching if is_up(interfaces[name])]
    down = [name for name in matching if name not in up]
    usable = ", ".join(name for name in interfaces if is_up(interfaces[name]) and name != "lo") or "none"
    if not matching:
        return failed("net.socket_ifname", f"network.socket_ifname {value!r} matches no interface "
                      f"(interfaces: {', '.join(interfaces) or 'none'})",
                      f"set network.socket_ifname to an interface that is up: {usable}")
    if not up:
        return failed("net.socket_ifname", f"network.socket_ifname {value!r} matches only interfaces that are down: "
                      + ", ".join(describe(name, interfaces[name]) for name in down),
                      f"bring it up (`ip link set {down[0]} up`, check the cable) or use an interface that is up: {usable}")
    if up == ["lo"]:
        return warned("net.socket_ifname", f"network.socket_ifname {value!r} selects only the loopback interface lo",
                      f"other nodes cannot reach lo: use an interface that is up: {usable}")
    if down:
        return warned("net.socket_ifname", f"{', '.join(up)} up; {', '.join(describe(n, interfaces[n]) for n in down)} "
                      f"also matches network.socket_ifname {value!r} and NCCL may pick it",
                      f"name the interface exactly: network.socket_ifname: ={up[0]}")
    return passed("net.socket_ifname", f"{', '.join(up)} up (network.socket_ifname {value!r})")


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """net.socket_ifname when network.socket_ifname is set."""
    value = settings(profile, "network").get("socket_ifname")
    return [check_socket_ifname(facts, value)] if value else []
