"""Which Slurm node a host name is (pure: stdlib only, Python 3.8+).

Ranks name their node with ``SLURMD_NODENAME`` (Slurm's name for it), and only a
Slurm name can be excluded from the next attempt. A host name from elsewhere (a rank
started without Slurm's environment, an older trainer, a tool's own file) is matched
against the allocation's nodes as `scontrol show node --oneliner` prints them:

1. a node's NodeName, exactly;
2. its NodeHostName, or the same host in short and long form (``gpu001`` and
   ``gpu001.cluster.local``; host names compare without case);
3. its NodeAddr (a name or an address), the same way;
4. an address the host name resolves to (resolved by the caller) that is a NodeAddr.

The first rule that finds exactly one node decides. A host that matches several
nodes (all nodes of a one-machine cluster are ``localhost``) or none stays unknown:
it never reaches sbatch.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from cluster_kit.slurm.builders import SlurmNode


def slurm_name(host: str, nodes: Sequence[SlurmNode], addresses: Iterable[str] = ()) -> str | None:
    """The Slurm name of the node `host` is, among `nodes`; None when not exactly one."""
    if not host:
        return None
    resolved = set(addresses)
    rules: tuple[Callable[[SlurmNode], bool], ...] = (
        lambda node: node.name == host,
        lambda node: _same_host(host, node.host_name),
        lambda node: _same_host(host, node.address),
        lambda node: node.address in resolved,
    )
    for rule in rules:
        matches = {node.name for node in nodes if rule(node)}
        if len(matches) == 1:
            return matches.pop()
    return None


def slurm_names(hosts: Iterable[str], nodes: Sequence[SlurmNode],
                resolved: Mapping[str, Sequence[str]] | None = None) -> dict[str, str]:
    """``{host: Slurm name}`` for the hosts that are one of `nodes` (unknown ones left out).

    `resolved`: the addresses each host name resolves to, where the caller looked.
    """
    found = {}
    for host in hosts:
        name = slurm_name(host, nodes, (resolved or {}).get(host, ()))
        if name is not None:
            found[host] = name
    return found


def _same_host(host: str, other: str) -> bool:
    """The same host name, ignoring case and a domain one of them leaves out."""
    if not other:
        return False
    a, b = host.lower().rstrip("."), other.lower().rstrip(".")
    if a == b:
        return True
    short_a, short_b = a.split(".", 1)[0], b.split(".", 1)[0]
    return (short_a == b or short_b == a) and not _is_address(a) and not _is_address(b)


def _is_address(text: str) -> bool:
    """An IPv4 or IPv6 address, whose dots or colons are no domain."""
    return ":" in text or text.replace(".", "").isdigit()
