"""Which nodes a job can get, and how `submit` routes around the failing ones.

Pure: plain data in (node names, sinfo rows, a preflight report), plain data
out. `submit` preflights only the job's candidate nodes and, while enough
healthy ones remain, sends the failing ones to `#SBATCH --exclude` instead of
refusing the job.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster_kit.hostlist import NodeSet, fold
from cluster_kit.slurm.builders import NodeRow

# Node states (sinfo %T, lower case) in which Slurm gives a node to no new job.
_UNUSABLE_WORDS = ("down", "drain", "fail", "future", "inval", "unknown")
ROUTED_STATUSES = frozenset({"fail", "unreachable"})


def node_usable(row: NodeRow) -> bool:
    """Slurm could start a new job on the node: not down, drained, failing or
    not responding (`idle*`)."""
    state = row.state.lower()
    return not state.endswith("*") and not any(word in state for word in _UNUSABLE_WORDS)


# The pseudo check ids under which `submit --json` lists nodes it excluded unchecked.
UNCHECKED_STATE = "slurm.state"         # Slurm could not give the node when submit looked
UNCHECKED_POOL = "profile.nodes"        # in the partition, not in the profile's nodes


@dataclass(frozen=True)
class Candidates:
    """The nodes to preflight, and why each other node of the pool was left out."""

    nodes: list[str]
    left_out: dict[str, str] = field(default_factory=dict)
    required: bool = False  # from slurm.nodelist: Slurm allocates every one of them
    # Nodes Slurm could still give the job that submit does not check (drained,
    # not responding, outside the profile's nodes): never to receive it unchecked.
    unchecked: dict[str, str] = field(default_factory=dict)  # node -> UNCHECKED_* id


def candidate_nodes(pool: Iterable[str], rows: Sequence[NodeRow] | None,
                    nodelist: Iterable[str] = (), exclude: Iterable[str] = ()) -> Candidates:
    """The nodes Slurm could give the job.

    `pool` is the profile's nodes (else the partition's), `rows` the partition's
    sinfo rows (None: states unknown, every pool node counts), `nodelist` the
    job's `slurm.nodelist` (replaces the pool: Slurm gives the job all of them)
    and `exclude` its `slurm.exclude`.
    """
    states = None if rows is None else {row.node: row for row in rows}
    nodes: list[str] = []
    left_out: dict[str, str] = {}
    unchecked: dict[str, str] = {}
    excluded = NodeSet.of(exclude)
    required = NodeSet.of(nodelist)
    wanted = required or NodeSet.of(pool)
    for node in wanted:
        row = None if states is None else states.get(node)
        if node in excluded:
            left_out[node] = "in slurm.exclude"
        elif states is not None and row is None:
            left_out[node] = "not in the partition (sinfo)"
        elif row is not None and not node_usable(row):
            left_out[node] = f"Slurm state {row.state}" + (f" ({row.reason})" if row.reason else "")
            unchecked[node] = UNCHECKED_STATE
        else:
            nodes.append(node)
    for node in NodeSet.of(states or ()) - wanted - excluded:
        left_out[node] = "in the partition, not in the profile's nodes"
        unchecked[node] = UNCHECKED_POOL
    return Candidates(nodes, left_out, required=bool(required), unchecked=unchecked)


@dataclass(frozen=True)
class Route:
    """What `submit` does after the preflight of the candidates."""

    excluded: dict[str, list[str]]  # failing or unchecked node -> its failing check ids
    exclude: list[str]              # the job's own excludes plus the excluded nodes
    healthy: int
    refusal: str | None             # why nothing is submitted; None: submit
    unchecked: dict[str, str] = field(default_factory=dict)  # excluded unchecked node -> why

    @property
    def exclude_expr(self) -> str | None:
        """The folded hostlist for `#SBATCH --exclude`, None when empty."""
        return str(NodeSet.of(self.exclude)) if self.exclude else None


def failing_nodes(report: Mapping[str, Any]) -> dict[str, list[str]]:
    """Failing or unreachable nodes of a preflight report -> their failing check ids."""
    out: dict[str, list[str]] = {}
    for entry in report.get("nodes", []):
        if entry.get("status") in ROUTED_STATUSES:
            ids = [c["id"] for c in entry.get("checks", []) if c.get("status") in ROUTED_STATUSES]
            out[entry["node"]] = ids or [str(entry.get("status"))]
    return out


def plan_route(candidates: Candidates, report: Mapping[str, Any], nodes_needed: int,
               strict: bool = False, job_exclude: Iterable[str] = ()) -> Route:
    """Route around the failing candidates while `nodes_needed` healthy ones remain.

    Refused when `strict` and any candidate fails, when a failing node is one
    `slurm.nodelist` requires, or when too few healthy candidates remain. A job
    asking more nodes than there are candidates, with none failing, is left to
    Slurm (it queues, or says it can never start).
    """
    failing = failing_nodes(report)
    healthy = len(NodeSet.of(candidates.nodes) - NodeSet.of(failing))
    unchecked = {node: [why] for node, why in candidates.unchecked.items()}
    exclude = list(NodeSet.of(job_exclude) | NodeSet.of(failing) | NodeSet.of(unchecked))
    refusal = None
    if failing:
        named = describe(failing)
        if strict:
            refusal = f"--strict: failing node(s) {named}"
        elif candidates.required:
            refusal = f"slurm.nodelist names failing node(s) {named}"
    if refusal is None and (failing or unchecked) and healthy < nodes_needed:
        refusal = (f"only {healthy} healthy node(s) of {len(candidates.nodes)} for a {nodes_needed}-node job"
                   + (f"; failing: {describe(failing)}" if failing else "")
                   + (f"; not checked: {describe_unchecked(candidates)}" if unchecked else ""))
    left_out = {node: candidates.left_out[node] for node in unchecked}
    return Route({**failing, **unchecked}, exclude, healthy, refusal, left_out)


def describe_unchecked(candidates: Candidates) -> str:
    """`n2 (Slurm state idle*), n[3-9] (in the partition, not in the profile's nodes)`."""
    by_reason: dict[str, list[str]] = {}
    for node in candidates.unchecked:
        by_reason.setdefault(candidates.left_out[node], []).append(node)
    return ", ".join(f"{fold(nodes)} ({why})" for why, nodes in by_reason.items())


def describe(failing: Mapping[str, Sequence[str]]) -> str:
    """`n2 (rdma.port_state), n7 (ssh.reachable)`."""
    return ", ".join(f"{node} ({', '.join(ids)})" for node, ids in failing.items())


def refusal_fix(route: Route, candidates: Candidates) -> str:
    """How to get the job submitted anyway: exclude, fix or drain the nodes."""
    nodes = NodeSet.of(route.excluded)
    unchecked = NodeSet.of(route.unchecked)
    if unchecked and not nodes - unchecked:
        waiting = NodeSet.of(n for n in unchecked if candidates.unchecked.get(n) == UNCHECKED_STATE)
        outside = unchecked - waiting
        steps = [f"wait until Slurm can use {waiting} again (sinfo -n {waiting}) and submit again"
                 ] if waiting else []
        steps += [f"add {outside} to the profile's nodes"] if outside else []
        return ", ".join(steps) + f", ask for at most {route.healthy} node(s), or submit with --no-preflight"
    if candidates.required:
        return f"remove {nodes} from slurm.nodelist, or fix them (clusterkit preflight --nodes {nodes})"
    if route.refusal and route.refusal.startswith("--strict"):
        return (f"drop --strict to submit with --exclude={nodes}, or fix them "
                f"(clusterkit preflight --nodes {nodes})")
    fewer = f"ask for at most {route.healthy} node(s), " if route.healthy else ""
    return (f"{fewer}fix the failing nodes (clusterkit preflight --nodes {nodes}), "
            "or submit with --no-preflight")
