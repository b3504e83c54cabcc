"""The preflight report for a terminal: nodes grouped by identical outcome,
hostlists folded, so a thousand healthy nodes print as one line.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cluster_kit.checks.findings import SEVERITY, STATUS_ORDER, with_fix
from cluster_kit.hostlist import fold
from cluster_kit.text import format_table, nodes_by

Problems = tuple[tuple[str, str, str, str], ...]


def _problem_key(entry: dict[str, Any]) -> tuple[str, Problems]:
    problems = tuple((c["id"], c["status"], c["message"], c.get("fix") or "")
                     for c in entry["checks"] if c["status"] != "pass")
    return (entry["status"], problems)


def group_outcomes(entries: Sequence[dict[str, Any]]) -> list[tuple[str, str, Problems, int]]:
    """(status, folded nodes, problems, checks passed) per group of identical outcome."""
    groups = nodes_by((_problem_key(entry), entry["node"]) for entry in entries)
    passed: dict[tuple[str, Problems], int] = {}
    for entry in entries:
        passed.setdefault(_problem_key(entry), sum(c["status"] == "pass" for c in entry["checks"]))
    ordered = sorted(groups, key=lambda k: (SEVERITY[k[0]], groups[k][0]))
    return [(k[0], fold(groups[k]), k[1], passed[k]) for k in ordered]


def preflight_rows(entries: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Table rows: one per problem of each group, one per healthy group."""
    rows = []
    for status, nodes, problems, passed in group_outcomes(entries):
        if not problems:
            rows.append([status, nodes, "-", f"all {passed} checks passed"])
        for check_id, check_status, message, fix in problems:
            rows.append([check_status, nodes, check_id, with_fix(message, fix)])
    return rows


def summary_line(summary: dict[str, int]) -> str:
    """`N pass, N warn, N fail, N unreachable`."""
    return ", ".join(f"{summary[k]} {k}" for k in STATUS_ORDER)


def preflight_table(report: dict[str, Any]) -> str:
    """The preflight report for a terminal."""
    table = format_table(["STATUS", "NODES", "CHECK", "MESSAGE"], preflight_rows(report["nodes"]))
    return f"{table}\n\nprofile {report['profile']}: {summary_line(report['summary'])}"
