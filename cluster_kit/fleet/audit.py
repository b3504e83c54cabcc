"""Fleet audit: drift between nodes, changes since a baseline, drain plans.

Pure: probe facts and the preflight report come in as data, the audit document
(SPEC "Audit JSON", extended) and scontrol argv lists go out. Nothing here runs
a process, opens a connection or writes a file.

Drift rules:
- a fact drifts when the nodes that were probed do not all report the same value;
- a node lacking a fact that another node has counts as the value "absent";
- facts that differ per node by nature (hostname, GUIDs, MACs, GPU UUIDs, ...)
  never drift; the `per_node` predicate names them;
- the majority is the value held by the most nodes. Ties go to a reported value
  over "absent", then to the value of the first node in natural node order
  (`gpu2` before `gpu10`), so the same facts always give the same answer.
"""
from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cluster_kit.errors import InputError
from cluster_kit.fleet.facts import flatten as flatten_facts
from cluster_kit.fleet.facts import is_per_node
from cluster_kit.hostlist import NodeSet, fold, natural_key
from cluster_kit.slurm.builders import build_scontrol_update_nodes
from cluster_kit.text import nodes_by

ABSENT = "absent"
# A node added or removed since the baseline is one change on this pseudo-fact.
NODE_FACT = "node"
PRESENT = "present"
UNREACHABLE = "unreachable"
BASELINE_FORMAT = "clusterkit-audit-baseline"
BASELINE_VERSION = 1
# Only nodes whose Slurm reason starts with this were drained by clusterkit.
DRAIN_REASON_PREFIX = "clusterkit:"
MAX_REASON_IDS = 3
PROBLEM_STATUSES = ("fail", "unreachable")

FlatFacts = dict[str, str]
PerNode = Callable[[str], bool]
Flatten = Callable[[dict[str, Any]], FlatFacts]

_REASON_UNSAFE = re.compile(r"[^A-Za-z0-9_.,:+ -]")


# ---------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=65536)
def node_key(name: str) -> tuple[Any, ...]:
    """Natural sort key: `gpu2` before `gpu10`, then by text so the order is total."""
    return natural_key(name)


def sort_nodes(nodes: Iterable[str]) -> list[str]:
    """Node names in natural order, duplicates removed."""
    return sorted(set(nodes), key=node_key)


def fold_nodes(nodes: Iterable[str]) -> str:
    """One folded hostlist of the nodes, in natural order (fold merges only neighbours)."""
    return str(NodeSet.of(nodes).sorted())


# ---------------------------------------------------------------- drift


def _values_by_fact(flat_facts_by_node: Mapping[str, Mapping[str, str]],
                    per_node: PerNode) -> dict[str, dict[str, str]]:
    """{fact: {node: value}} over every node, "absent" where a node lacks the fact."""
    names = {name for facts in flat_facts_by_node.values() for name in facts}
    nodes = sort_nodes(flat_facts_by_node)
    return {
        name: {node: str(flat_facts_by_node[node].get(name, ABSENT)) for node in nodes}
        for name in sorted(names) if not per_node(name)
    }


def _majority(values: Mapping[str, str]) -> str:
    """The value most nodes hold; ties: a reported value over "absent", then first node."""
    counts: dict[str, int] = {}
    first_seen: dict[str, int] = {}
    for position, value in enumerate(values.values()):
        counts[value] = counts.get(value, 0) + 1
        first_seen.setdefault(value, position)
    return min(counts, key=lambda v: (-counts[v], v == ABSENT, first_seen[v]))


def drift_entry(fact: str, values: Mapping[str, str]) -> dict[str, Any] | None:
    """The SPEC drift entry of one fact ({node: value} in node order), None if uniform."""
    if len(set(values.values())) < 2:
        return None
    majority = _majority(values)
    return {
        "fact": fact,
        "majority": majority,
        "majority_nodes": fold([n for n, v in values.items() if v == majority]),
        "outliers": {n: v for n, v in values.items() if v != majority},
    }


def compute_drift(flat_facts_by_node: Mapping[str, Mapping[str, str]],
                  per_node: PerNode | None = None) -> list[dict[str, Any]]:
    """Facts whose value differs between nodes, sorted by fact name (SPEC "drift").

    `per_node(fact)` is true for facts that differ per node by nature; they are
    left out. Outliers are listed in natural node order.
    """
    predicate = per_node or is_per_node
    entries = (drift_entry(fact, values)
               for fact, values in _values_by_fact(flat_facts_by_node, predicate).items())
    return [entry for entry in entries if entry is not None]


# ---------------------------------------------------------------- Slurm state


def _field(record: Any, *names: str) -> str:
    """The first of the fields set on a mapping or an object (slurm.NodeRow)."""
    for name in names:
        value = record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)
        if value:
            return str(value)
    return ""


def _slurm_record(record: Any) -> dict[str, str]:
    return {"state": _field(record, "state", "State"), "reason": _field(record, "reason", "Reason")}


def slurm_index(slurm_nodes: Any) -> dict[str, dict[str, str]]:
    """{node: {"state", "reason"}} from sinfo/scontrol parser output.

    Accepts a mapping {node: record}, or a list of records (dicts or
    slurm.NodeRow) naming their node in `node`, `name` or `NodeName`, or
    several nodes as a hostlist in `nodes`.
    """
    if not slurm_nodes:
        return {}
    if isinstance(slurm_nodes, Mapping):
        return {str(n): _slurm_record(r) for n, r in slurm_nodes.items()}
    index: dict[str, dict[str, str]] = {}
    for record in slurm_nodes:
        name = _field(record, "node", "name", "NodeName")
        for node in [name] if name else NodeSet(_field(record, "nodes")):
            index[node] = _slurm_record(record)
    return index


def is_drained(record: Mapping[str, str]) -> bool:
    """Drained or draining, in sinfo (`drng`, `drained*`) or scontrol (`IDLE+DRAIN`) spelling."""
    state = record.get("state", "").lower()
    return "drain" in state or state.startswith("drng")


def drained_by_clusterkit(record: Mapping[str, str]) -> bool:
    """Drained with a reason clusterkit wrote (so clusterkit may undrain it)."""
    return is_drained(record) and record.get("reason", "").startswith(DRAIN_REASON_PREFIX)


# ---------------------------------------------------------------- the audit


def _flat_facts(facts_by_node: Mapping[str, dict[str, Any]],
                flatten: Flatten | None) -> dict[str, FlatFacts]:
    to_flat = flatten or flatten_facts
    return {node: to_flat(facts_by_node[node]) for node in sort_nodes(facts_by_node)}


def _entries(preflight_report: Mapping[str, Any]) -> list[dict[str, Any]]:
    entries = preflight_report.get("nodes") or []
    return sorted(entries, key=lambda e: node_key(e["node"]))


def audit_summary(entries: Sequence[Mapping[str, Any]], drift: Sequence[Mapping[str, Any]],
                  changes: Sequence[Mapping[str, Any]] | None) -> dict[str, int]:
    """Counts for people and dashboards (an extension of the SPEC shape)."""
    statuses = [e["status"] for e in entries]
    drifting = {node for d in drift for node in d["outliers"]}
    return {
        "nodes": len(entries),
        "reachable": sum(s != UNREACHABLE for s in statuses),
        "unreachable": statuses.count(UNREACHABLE),
        "pass": statuses.count("pass"),
        "warn": statuses.count("warn"),
        "fail": statuses.count("fail"),
        "drifting_facts": len(drift),
        "drifting_nodes": len(drifting),
        "changes": len(changes or []),
    }


def build_audit(profile_name: str | None, preflight_report: Mapping[str, Any],
                facts_by_node: Mapping[str, dict[str, Any]], baseline: Mapping[str, Any] | None = None,
                slurm_nodes: Any = None, *, per_node: PerNode | None = None,
                flatten: Flatten | None = None) -> dict[str, Any]:
    """The audit document: SPEC "Audit JSON" plus `summary`, `facts` and `slurm`
    (Slurm's state and reason of the audited nodes).

    `facts_by_node` are the probe facts run_preflight returned (nested; flattened
    here with facts.flatten). `changes` is present only with a baseline.
    """
    entries = _entries(preflight_report)
    flat = _flat_facts(facts_by_node, flatten)
    unreachable = sort_nodes(e["node"] for e in entries if e["status"] == UNREACHABLE)
    drift = compute_drift(flat, per_node)
    audit: dict[str, Any] = {
        "profile": profile_name,
        "nodes": sort_nodes(e["node"] for e in entries if e["status"] != UNREACHABLE),
        "unreachable": unreachable,
        "drift": drift,
        "checks": entries,
    }
    changes = None
    if baseline is not None:
        changes = diff_baseline(baseline, flat, unreachable=unreachable)
        audit["changes"] = changes
        audit["baseline"] = {k: baseline.get(k) for k in ("created", "profile")}
    audit["summary"] = audit_summary(entries, drift, changes)
    # Only the audited nodes: the partition's other drains are not this report's business.
    probed = {e["node"] for e in entries}
    audit["slurm"] = {node: record for node, record in slurm_index(slurm_nodes).items() if node in probed}
    audit["facts"] = flat
    return audit


# ---------------------------------------------------------------- baseline


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def save_baseline(audit_or_facts: Mapping[str, Any], profile: str | None = None,
                  created: str | None = None) -> dict[str, Any]:
    """A versioned baseline document (write it as JSON) from an audit or {node: flat facts}.

    Per-node-by-nature facts are kept: a changed GPU UUID or GUID means swapped hardware.
    """
    is_audit = "facts" in audit_or_facts and "drift" in audit_or_facts
    facts = audit_or_facts["facts"] if is_audit else audit_or_facts
    return {
        "format": BASELINE_FORMAT,
        "version": BASELINE_VERSION,
        "created": created or _utc_now(),
        "profile": profile if profile is not None else (audit_or_facts.get("profile") if is_audit else None),
        "nodes": {node: {k: str(v) for k, v in sorted(facts[node].items())} for node in sort_nodes(facts)},
    }


def check_baseline(document: Any, source: str = "baseline") -> dict[str, Any]:
    """The parsed baseline JSON if it is one this version can read, else InputError."""
    fix = "write a new one with `clusterkit audit --save-baseline FILE`"
    if not isinstance(document, dict) or document.get("format") != BASELINE_FORMAT:
        raise InputError(f"{source}: not a clusterkit audit baseline", fix=fix)
    if document.get("version") != BASELINE_VERSION:
        raise InputError(f"{source}: baseline version {document.get('version')!r} is not "
                         f"supported (this clusterkit reads version {BASELINE_VERSION})", fix=fix)
    if not isinstance(document.get("nodes"), dict):
        raise InputError(f"{source}: the baseline has no `nodes` map", fix=fix)
    for node, facts in document["nodes"].items():
        if not isinstance(facts, dict) or not all(isinstance(v, str) for v in facts.values()):
            raise InputError(f"{source}: node {node!r} of the baseline is not a map of fact names "
                             "to text values", fix=fix)
    return document


def baseline_profile_warning(baseline: Mapping[str, Any], profile: str | None, source: str) -> str | None:
    """A warning when the baseline was saved for another profile (its changes may be
    the other fleet's differences, not this fleet's drift)."""
    saved = baseline.get("profile")
    if not saved or not profile or saved == profile:
        return None
    return (f"{source} was saved for profile {saved!r}, not {profile!r}: its changes compare two "
            f"profiles; pass a baseline saved with --profile {profile}")


COUNTER_FACT = re.compile(r"rdma\.[^.]+\.[^.]+\.counters\.[a-z_]+")


def counter_growth(fact: str, before: str, after: str) -> int | None:
    """How much an HCA error counter grew since the baseline (negative: it was cleared), else None."""
    if not COUNTER_FACT.fullmatch(fact) or not (before.isdigit() and after.isdigit()):
        return None
    return int(after) - int(before)


def _change(node: str, fact: str, before: str, after: str) -> dict[str, Any]:
    change: dict[str, Any] = {"node": node, "fact": fact, "before": before, "after": after}
    growth = counter_growth(fact, before, after)
    if growth is not None:
        change["growth"] = growth
    return change


def _node_changes(node: str, before: Mapping[str, str], after: Mapping[str, str]) -> list[dict[str, Any]]:
    return [
        _change(node, fact, str(before.get(fact, ABSENT)), str(after.get(fact, ABSENT)))
        for fact in sorted(set(before) | set(after))
        if before.get(fact, ABSENT) != after.get(fact, ABSENT)
    ]


def diff_baseline(baseline: Mapping[str, Any], flat_facts_by_node: Mapping[str, Mapping[str, str]],
                  unreachable: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Changes since the baseline: {"node", "fact", "before", "after"}, node then fact order.

    An HCA error counter's change also has "growth" (after - before, an int):
    a link that flapped overnight shows as `link_downed` growth.

    A fact added or removed has "absent" on the missing side. A node added or
    removed is one change on the pseudo-fact "node" ("absent" <-> "present");
    a baseline node that is unreachable now has after "unreachable" instead,
    since its facts are unknown rather than gone.
    """
    before_nodes: Mapping[str, Mapping[str, str]] = baseline.get("nodes") or {}
    down = set(unreachable)
    changes: list[dict[str, Any]] = []
    for node in sort_nodes(set(before_nodes) | set(flat_facts_by_node)):
        if node not in flat_facts_by_node:
            changes.append(_change(node, NODE_FACT, PRESENT, UNREACHABLE if node in down else ABSENT))
        elif node not in before_nodes:
            changes.append(_change(node, NODE_FACT, ABSENT, PRESENT))
        else:
            changes.extend(_node_changes(node, before_nodes[node], flat_facts_by_node[node]))
    return changes


def _change_line(fact: str, before: str, after: str, nodes: str) -> str:
    if fact == NODE_FACT and before == ABSENT:
        return f"node added since the baseline: {nodes}"
    if fact == NODE_FACT:
        return f"node {after} (in the baseline): {nodes}"
    growth = counter_growth(fact, before, after)
    shown = f" ({growth:+d})" if growth is not None else ""
    return f"{fact} {before} -> {after}{shown} on {nodes}"


def summarize_changes(changes: Iterable[Mapping[str, str]]) -> list[str]:
    """One line per identical change with the folded nodes, sorted by fact:
    `gpu.driver 535.104.05 -> 550.54.15 on gpu[001-012]`."""
    groups = nodes_by(((c["fact"], c["before"], c["after"]), c["node"]) for c in changes)
    return [_change_line(*key, fold_nodes(groups[key])) for key in sorted(groups)]


# ---------------------------------------------------------------- drain / undrain


def drain_reason(check_ids: Iterable[str]) -> str:
    """`clusterkit: gpu.driver,rdma.port_state`: short, one line, safe inside Reason="..."."""
    ids = sorted({_REASON_UNSAFE.sub("_", i) for i in check_ids})
    shown = ",".join(ids[:MAX_REASON_IDS])
    more = f" +{len(ids) - MAX_REASON_IDS} more" if len(ids) > MAX_REASON_IDS else ""
    return f"{DRAIN_REASON_PREFIX} {shown}{more}"


def _failing_ids(entry: Mapping[str, Any]) -> list[str]:
    return [c["id"] for c in entry.get("checks", []) if c.get("status") in PROBLEM_STATUSES]


def _keeps_current_drain(record: Mapping[str, str] | None, reason: str) -> bool:
    """Leave a node alone when an admin drained it, or clusterkit did for the same reason."""
    if not record or not is_drained(record):
        return False
    return not drained_by_clusterkit(record) or record.get("reason") == reason


def drain_plan(audit: Mapping[str, Any], include_unreachable: bool = False) -> list[tuple[str, str]]:
    """(node, reason) for each node whose checks fail, in node order.

    Unreachable nodes are left to Slurm's own health handling unless
    `include_unreachable`. A node already drained by someone else keeps its reason.
    """
    slurm = audit.get("slurm") or {}
    statuses = ("fail", UNREACHABLE) if include_unreachable else ("fail",)
    plan = []
    for entry in audit.get("checks", []):
        if entry["status"] not in statuses:
            continue
        reason = drain_reason(_failing_ids(entry) or [entry["status"]])
        if not _keeps_current_drain(slurm.get(entry["node"]), reason):
            plan.append((entry["node"], reason))
    return sorted(plan, key=lambda item: node_key(item[0]))


def undrain_plan(audit: Mapping[str, Any], slurm_nodes: Any = None) -> list[str]:
    """Nodes to undrain: drained or draining by clusterkit (reason "clusterkit:...") and passing now.

    A node an admin drained with any other reason is never returned, nor a node
    this audit did not probe.
    """
    slurm = slurm_index(slurm_nodes) if slurm_nodes is not None else audit.get("slurm") or {}
    passing = {e["node"] for e in audit.get("checks", []) if e["status"] in ("pass", "warn")}
    return sort_nodes(n for n in passing if n in slurm and drained_by_clusterkit(slurm[n]))


def build_drain_commands(plan: Iterable[tuple[str, str]]) -> list[list[str]]:
    """One scontrol argv per distinct reason, its nodes folded into one hostlist."""
    by_reason = nodes_by((reason, node) for node, reason in plan)
    return [build_scontrol_update_nodes(fold_nodes(by_reason[r]), "DRAIN", r) for r in sorted(by_reason)]


def build_undrain_commands(nodes: Sequence[str]) -> list[list[str]]:
    """The scontrol argv that undrains the nodes (UNDRAIN keeps a DOWN node down), or none."""
    return [build_scontrol_update_nodes(fold_nodes(nodes), "UNDRAIN")] if nodes else []
