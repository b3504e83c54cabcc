"""Which nodes a job can get, and how `submit` routes around the failing ones.

Pure: plain data in (node names, sinfo rows, a preflight report), plain data
out. `submit` preflights only the job's candidate nodes and, while enough
healthy ones remain, sends the failing ones to `#SBATCH --exclude` instead of
refusing the job.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster_kit.hostlist import fold
from cluster_kit.slurm.builders import NodeRow

# Node states (sinfo %T, lower case) in which Slurm gives a node to no new job.
_UNUSABLE_WORDS = ("down", "drain", "fail", "future", "inval", "unknown")
ROUTED_STATUSES = frozenset({"fail", "unreachable"})


def node_usable(row: NodeRow) -> bool:
    """Slurm could start a new job on the node: not down, drained, failing or
    not responding (`idle*`)."""
    state = row.state.lower()
    return not state.endswith("*") and not any(word in state for word in _UNUSABLE_WORDS)


@dataclass(frozen=True)
class Candidates:
    """The nodes to preflight, and why each other node of the pool was left out."""

    nodes: list[str]
    left_out: dict[str, str] = field(default_factory=dict)
    required: bool = False  # from slurm.nodelist: Slurm allocates every one of them


def candidate_nodes(pool: Sequence[str], rows: Sequence[NodeRow] | None,
                    nodelist: Sequence[str] = (), exclude: Sequence[str] = ()) -> Candidates:
    """The nodes Slurm could give the job.

    `pool` is the profile's nodes (else the partition's), `rows` the partition's
    sinfo rows (None: states unknown, every pool node counts), `nodelist` the
    job's `slurm.nodelist` (replaces the pool: Slurm gives the job all of them)
    and `exclude` its `slurm.exclude`.
    """
    states = None if rows is None else {row.node: row for row in rows}
    nodes: list[str] = []
    left_out: dict[str, str] = {}
    excluded = set(exclude)
    for node in dict.fromkeys(nodelist or pool):
        row = None if states is None else states.get(node)
        if node in excluded:
            left_out[node] = "in slurm.exclude"
        elif states is not None and row is None:
            left_out[node] = "not in the partition (sinfo)"
        elif row is not None and not node_usable(row):
            left_out[node] = f"Slurm state {row.state}" + (f" ({row.reason})" if row.reason else "")
        else:
            nodes.append(node)
    return Candidates(nodes, left_out, required=bool(nodelist))


@dataclass(frozen=True)
class Route:
    """What `submit` does after the preflight of the candidates."""

    excluded: dict[str, list[str]]  # failing node -> its failing check ids
    exclude: list[str]              # the job's own excludes plus the failing nodes
    healthy: int
    refusal: str | None             # why nothing is submitted; None: submit

    @property
    def exclude_expr(self) -> str | None:
        """The folded hostlist for `#SBATCH --exclude`, None when empty."""
        return fold(self.exclude) if self.exclude else None


def failing_nodes(report: Mapping[str, Any]) -> dict[str, list[str]]:
    """Failing or unreachable nodes of a preflight report -> their failing check ids."""
    out: dict[str, list[str]] = {}
    for entry in report.get("nodes", []):
        if entry.get("status") in ROUTED_STATUSES:
            ids = [c["id"] for c in entry.get("checks", []) if c.get("status") in ROUTED_STATUSES]
            out[entry["node"]] = ids or [str(entry.get("status"))]
    return out


def plan_route(candidates: Candidates, report: Mapping[str, Any], nodes_needed: int,
               strict: bool = False, job_exclude: Sequence[str] = ()) -> Route:
    """Route around the failing candidates while `nodes_needed` healthy ones remain.

    Refused when `strict` and any candidate fails, when a failing node is one
    `slurm.nodelist` requires, or when too few healthy candidates remain. A job
    asking more nodes than there are candidates, with none failing, is left to
    Slurm (it queues, or says it can never start).
    """
    failing = failing_nodes(report)
    healthy = len([n for n in candidates.nodes if n not in failing])
    exclude = list(dict.fromkeys([*job_exclude, *failing]))
    refusal = None
    if failing:
        named = describe(failing)
        if strict:
            refusal = f"--strict: failing node(s) {named}"
        elif candidates.required:
            refusal = f"slurm.nodelist names failing node(s) {named}"
        elif healthy < nodes_needed:
            refusal = (f"only {healthy} healthy node(s) of {len(candidates.nodes)} for a "
                       f"{nodes_needed}-node job; failing: {named}")
    return Route(failing, exclude, healthy, refusal)


def describe(failing: Mapping[str, Sequence[str]]) -> str:
    """`n2 (rdma.port_state), n7 (ssh.reachable)`."""
    return ", ".join(f"{node} ({', '.join(ids)})" for node, ids in failing.items())


def refusal_fix(route: Route, candidates: Candidates) -> str:
    """How to get the job submitted anyway: exclude, fix or drain the nodes."""
    nodes = fold(list(route.excluded))
    if candidates.required:
        return f"remove {nodes} from slurm.nodelist, or fix them (clusterkit preflight --nodes {nodes})"
    if route.refusal and route.refusal.startswith("--strict"):
        return (f"drop --strict to submit with --exclude={nodes}, or fix them "
                f"(clusterkit preflight --nodes {nodes})")
    fewer = f"ask for at most {route.healthy} node(s), " if route.healthy else ""
    return (f"{fewer}fix the failing nodes (clusterkit preflight --nodes {nodes}), "
            "or submit with --no-preflight")
