"""Audit reports for people: a terminal table, Markdown and one self-contained HTML file.

Every value in an audit came from a remote machine and is treated as untrusted:
the table replaces control characters (no terminal escape sequences get
through), Markdown escapes its own syntax and HTML, and the HTML template is
rendered with autoescape on; the node x fact grid travels as JSON that the
page's script puts into the DOM as text only.

Nodes that share an outcome are folded into one hostlist, so a thousand nodes
print as a few lines.
"""
from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cluster_kit.checks.findings import SEVERITY, with_fix
from cluster_kit.fleet.audit import (
    ABSENT,
    fold_nodes,
    is_drained,
    node_key,
    summarize_changes,
)
from cluster_kit.report.html import render_page
from cluster_kit.text import format_table, nodes_by, printable

HTML_TEMPLATE = "audit.html.j2"
FORMATS = ("table", "json", "markdown", "html")
# Facts a failing check is about: their grid columns are shown by default.
CHECK_FACTS: dict[str, tuple[str, ...]] = {
    "gpu.count": ("gpu.count",),
    "gpu.model": ("gpu.model",),
    "gpu.driver": ("gpu.driver",),
    "nccl.library": ("nccl.*",),
    "rdma.hca_present": ("rdma.hcas",),
    "rdma.port_state": ("rdma.*.*.state", "rdma.*.*.phys_state"),
    "rdma.link_rate": ("rdma.*.*.rate",),
    "rdma.link_layer": ("rdma.*.*.link_layer",),
    "rdma.gid_index": ("rdma.*.*.gid.*.type",),
    "rdma.peermem": ("rdma.peermem",),
    "net.socket_ifname": ("net.*.operstate",),
    "sys.memlock": ("sys.memlock",),
}
SUMMARY_KEYS = ("nodes", "reachable", "unreachable", "fail", "drifting_facts", "changes")
SUMMARY_LABELS = {"fail": "failing", "drifting_facts": "drifting facts"}

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|#~])")


# ---------------------------------------------------------------- shared grouping


def outlier_groups(outliers: Mapping[str, str]) -> list[tuple[str, str]]:
    """(value, folded nodes) per distinct outlier value, the most common first."""
    groups = nodes_by((value, node) for node, value in outliers.items())
    ordered = sorted(groups, key=lambda v: (-len(groups[v]), v))
    return [(value, fold_nodes(groups[value])) for value in ordered]


def _finding_key(check: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (check["status"], check["id"], check.get("message", ""), check.get("fix") or "")


def problem_groups(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Non-passing checks grouped by identical finding, worst first, nodes folded."""
    groups = nodes_by((_finding_key(check), entry["node"])
                      for entry in entries for check in entry.get("checks", []) if check.get("status") != "pass")
    ordered = sorted(groups, key=lambda k: (SEVERITY.get(k[0], 9), k[1], k[2]))
    return [{"status": k[0], "id": k[1], "message": k[2], "fix": k[3], "nodes": fold_nodes(groups[k])}
            for k in ordered]


def drained_groups(slurm: Mapping[str, Mapping[str, str]]) -> list[dict[str, str]]:
    """Nodes Slurm has drained or is draining, grouped by state and reason."""
    groups = nodes_by(((record.get("state", ""), record.get("reason", "")), node)
                      for node, record in slurm.items() if is_drained(record))
    return [{"state": k[0], "reason": k[1], "nodes": fold_nodes(groups[k])} for k in sorted(groups)]


def summary_counts(audit: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(key, label, count) of the headline numbers, in display order."""
    summary = audit.get("summary") or {}
    return [(key, SUMMARY_LABELS.get(key, key), int(summary.get(key, 0))) for key in SUMMARY_KEYS]


def summary_line(audit: Mapping[str, Any]) -> str:
    """`profile prod: 1000 nodes, 998 reachable, 2 unreachable, 3 failing, ...`."""
    counts = ", ".join(f"{count} {label}" for _, label, count in summary_counts(audit))
    return f"profile {printable(audit.get('profile') or '-')}: {counts}"


# ---------------------------------------------------------------- table


def _drift_table(audit: Mapping[str, Any]) -> str:
    rows = []
    for entry in audit.get("drift", []):
        outliers = "; ".join(f"{printable(v)} on {n}" for v, n in outlier_groups(entry["outliers"]))
        rows.append([entry["fact"], f"{printable(entry['majority'])} on {entry['majority_nodes']}", outliers])
    if not rows:
        return "DRIFT: none, every probed node reports the same facts"
    return "DRIFT\n" + format_table(["FACT", "MAJORITY", "OUTLIERS"], rows)


def _problem_table(audit: Mapping[str, Any]) -> str:
    rows = [[g["status"], g["nodes"], g["id"], printable(with_fix(g["message"], g["fix"]))]
            for g in problem_groups(audit.get("checks", []))]
    if not rows:
        return "CHECKS: every reachable node passed"
    return "CHECKS\n" + format_table(["STATUS", "NODES", "CHECK", "MESSAGE"], rows)


def _changes_text(audit: Mapping[str, Any]) -> str | None:
    if "changes" not in audit:
        return None
    since = (audit.get("baseline") or {}).get("created") or "the baseline"
    lines = summarize_changes(audit["changes"])
    if not lines:
        return f"CHANGES since {printable(since)}: none"
    return f"CHANGES since {printable(since)}\n" + "\n".join(printable(line) for line in lines)


def _drained_table(audit: Mapping[str, Any]) -> str | None:
    rows = [[g["state"], g["nodes"], printable(g["reason"])] for g in drained_groups(audit.get("slurm") or {})]
    if not rows:
        return None
    return "DRAINED IN SLURM\n" + format_table(["STATE", "NODES", "REASON"], rows)


def render_table(audit: Mapping[str, Any]) -> str:
    """The audit for a terminal: drift, failing checks, changes, Slurm drains, a summary line."""
    parts = [_drift_table(audit), _problem_table(audit), _changes_text(audit), _drained_table(audit)]
    return "\n\n".join(p for p in parts if p) + "\n\n" + summary_line(audit) + "\n"


def render_json(audit: Mapping[str, Any]) -> str:
    """The audit as one JSON document (SPEC "Audit JSON" plus extensions)."""
    return json.dumps(audit, separators=(",", ":")) + "\n"


# ---------------------------------------------------------------- Markdown


def md(value: Any) -> str:
    """Text safe in a Markdown table cell: one line, Markdown syntax and HTML escaped."""
    # No tag can start without `<`, so `>` stays readable (`535 -> 550`).
    text = printable(value).replace("&", "&amp;").replace("<", "&lt;")
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(md(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_sections(audit: Mapping[str, Any]) -> Iterable[str]:
    drift = [[e["fact"], e["majority"], e["majority_nodes"],
              "; ".join(f"{v} on {n}" for v, n in outlier_groups(e["outliers"]))] for e in audit.get("drift", [])]
    yield "## Drift\n\n" + (_md_table(["Fact", "Majority", "Nodes", "Outliers"], drift) if drift else "None.")
    problems = [[g["status"], g["nodes"], g["id"], g["message"], g["fix"]]
                for g in problem_groups(audit.get("checks", []))]
    yield "## Checks\n\n" + (_md_table(["Status", "Nodes", "Check", "Message", "Fix"], problems)
                             if problems else "Every reachable node passed.")
    if "changes" in audit:
        lines = summarize_changes(audit["changes"])
        yield "## Changes since the baseline\n\n" + ("\n".join(f"- {md(line)}" for line in lines) or "None.")
    drained = [[g["state"], g["nodes"], g["reason"]] for g in drained_groups(audit.get("slurm") or {})]
    if drained:
        yield "## Drained in Slurm\n\n" + _md_table(["State", "Nodes", "Reason"], drained)


def render_markdown(audit: Mapping[str, Any]) -> str:
    """The audit as Markdown: summary table, drift, checks, changes, Slurm drains."""
    summary = _md_table([label for _, label, _ in summary_counts(audit)],
                        [[str(count) for _, _, count in summary_counts(audit)]])
    title = f"# clusterkit audit: {md(audit.get('profile') or '-')}\n\n{summary}"
    return "\n\n".join([title, *_md_sections(audit)]) + "\n"


# ---------------------------------------------------------------- HTML


def _related(name: str, pattern: str, messages: Sequence[str]) -> bool:
    """Whether fact `name` is about a failing check: per-HCA patterns need the HCA in its message."""
    if not fnmatch.fnmatchcase(name, pattern):
        return False
    if "*" not in pattern:
        return True
    hca = name.split(".")[1]
    return any(re.search(rf"\b{re.escape(hca)}\b", message) for message in messages)


def failing_facts(audit: Mapping[str, Any], names: Iterable[str]) -> set[str]:
    """Fact names that some node's failing check is about (see CHECK_FACTS)."""
    messages: dict[str, list[str]] = {}
    for entry in audit.get("checks", []):
        for check in entry.get("checks", []):
            if check.get("status") in ("fail", "warn"):
                messages.setdefault(check["id"], []).append(str(check.get("message", "")))
    return {name for name in names for check_id, texts in messages.items()
            if any(_related(name, p, texts) for p in CHECK_FACTS.get(check_id, ()))}


def _grid_column(name: str, nodes: Sequence[str], facts: Mapping[str, Mapping[str, str]],
                 drift: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One fact column, dictionary-encoded: distinct values plus one index per node (-1: no facts)."""
    values: dict[str, int] = {}
    cells = []
    for node in nodes:
        if node not in facts:
            cells.append(-1)
            continue
        cells.append(values.setdefault(str(facts[node].get(name, ABSENT)), len(values)))
    entry = drift.get(name)
    major = values.get(entry["majority"], -1) if entry else -1
    return {"name": name, "drift": entry is not None, "major": major, "values": list(values), "cells": cells}


def grid_data(audit: Mapping[str, Any]) -> dict[str, Any]:
    """The node x fact grid the page's script draws (compact: values are stored once per column)."""
    entries = sorted(audit.get("checks", []), key=lambda e: node_key(e["node"]))
    nodes = [e["node"] for e in entries]
    facts: Mapping[str, Mapping[str, str]] = audit.get("facts") or {}
    names = sorted({name for node_facts in facts.values() for name in node_facts})
    drift = {d["fact"]: d for d in audit.get("drift", [])}
    shown = set(drift) | failing_facts(audit, names)
    columns = [_grid_column(name, nodes, facts, drift) for name in names]
    for column in columns:
        column["shown"] = column["name"] in shown
    return {
        "nodes": nodes,
        "status": [e["status"] for e in entries],
        "problems": [" ".join(sorted({c["id"] for c in e.get("checks", []) if c.get("status") != "pass"}))
                     for e in entries],
        "columns": columns,
    }


def html_context(audit: Mapping[str, Any]) -> dict[str, Any]:
    """What audit.html.j2 sees."""
    drift = [{**e, "groups": outlier_groups(e["outliers"])} for e in audit.get("drift", [])]
    return {
        "profile": audit.get("profile") or "-",
        "summary": summary_counts(audit),
        "drift": drift,
        "problems": problem_groups(audit.get("checks", [])),
        "has_changes": "changes" in audit,
        "changes": summarize_changes(audit.get("changes") or []),
        "baseline": audit.get("baseline") or {},
        "drained": drained_groups(audit.get("slurm") or {}),
        "grid": grid_data(audit),
    }


def render_html(audit: Mapping[str, Any]) -> str:
    """One self-contained HTML page: inline CSS and script, no network fetch of any kind."""
    return render_page(HTML_TEMPLATE, html_context(audit))


def render(audit: Mapping[str, Any], fmt: str) -> str:
    """The audit in one of FORMATS (`audit --format`)."""
    renderers = {"table": render_table, "json": render_json, "markdown": render_markdown, "html": render_html}
    if fmt not in renderers:
        raise ValueError(f"unknown audit format {fmt!r}: use one of {', '.join(FORMATS)}")
    return renderers[fmt](audit)
