"""Reports for people: nodes grouped by identical outcome, hostlists folded.

A thousand healthy nodes print as one line; each distinct problem prints once
with the folded list of nodes that share it.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from cluster_kit.checks.findings import STATUS_ORDER, with_fix
from cluster_kit.hostlist import fold

Key = TypeVar("Key")

# Sort position of a status in reports: the worst first.
SEVERITY = {status: position for position, status in enumerate(reversed(STATUS_ORDER))}
# C0 controls, DEL and C1 controls: what could end a line or start a terminal escape.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(value: Any) -> str:
    """The value with control characters shown as `\\xNN` (no terminal escapes get through)."""
    return CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = []
    for cells in [list(headers)] + rows:
        padded = [c.ljust(w) for c, w in zip(cells[:-1], widths)] + [cells[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def nodes_by(pairs: Iterable[tuple[Key, str]]) -> dict[Key, list[str]]:
    """{key: nodes} from (key, node) pairs: the nodes that share a value, outcome or reason."""
    groups: dict[Key, list[str]] = {}
    for key, node in pairs:
        groups.setdefault(key, []).append(node)
    return groups


def _problem_key(entry: dict[str, Any]) -> tuple:
    problems = tuple((c["id"], c["status"], c["message"], c.get("fix") or "")
                     for c in entry["checks"] if c["status"] != "pass")
    return (entry["status"], problems)


def group_outcomes(entries: Sequence[dict[str, Any]]) -> list[tuple[str, str, tuple, int]]:
    """(status, folded nodes, problems, checks passed) per group of identical outcome."""
    groups = nodes_by((_problem_key(entry), entry["node"]) for entry in entries)
    passed: dict[tuple, int] = {}
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
