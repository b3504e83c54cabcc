"""Read an all-reduce sweep out of a job log and judge it (pure; no torch).

``allreduce_sweep.py`` prints ``CLUSTERKIT_ALLREDUCE {json}`` lines on rank 0;
the job log mixes them with everything else the job printed (srun's ``--label``
prefixes too). :func:`parse_sweep_log` picks the result rows out, and
:func:`summarise` turns them into a table, a JSON document and a verdict.

Large-message bus bandwidth, the figure compared with a profile's
``expect.allreduce_busbw_gbps``: the highest busbw among messages of at least
``LARGE_MESSAGE_BYTES`` (256 MiB). Bandwidth only levels off at large sizes, and
the peak there is what nccl-tests users quote and compare. A sweep that stopped
below 256 MiB uses its largest message instead, and says so in ``basis``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

MARKER = "CLUSTERKIT_ALLREDUCE "
LARGE_MESSAGE_BYTES = 256 << 20

Row = dict[str, Any]


class SweepLogError(ValueError):
    """A marker line that is not the JSON the sweep writes."""


def marker_payloads(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text after the marker) of every marker line, in log order."""
    for number, line in enumerate(text.splitlines(), start=1):
        start = line.find(MARKER)
        if start >= 0:
            yield number, line[start + len(MARKER) :]


def parse_sweep_log(text: str) -> list[Row]:
    """The result rows (``kind == "result"``) of every marker line, in log order."""
    rows = []
    for number, payload in marker_payloads(text):
        try:
            record = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise SweepLogError(
                f"line {number}: marker line is not JSON: {exc}"
            ) from exc
        if isinstance(record, dict) and record.get("kind") == "result":
            rows.append(record)
    return rows


def parse_sweep_meta(text: str) -> dict[str, Any]:
    """The sweep's ``kind == "meta"`` record (versions, device), or {} if absent."""
    for _number, payload in marker_payloads(text):
        try:
            record = json.loads(payload)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("kind") == "meta":
            return record
    return {}


def large_message_rows(
    rows: list[Row], threshold: int = LARGE_MESSAGE_BYTES
) -> tuple[list[Row], str]:
    """The rows the large-message figure is taken from, and a note of the basis."""
    large = [r for r in rows if r["bytes"] >= threshold]
    if large:
        return large, f"max busbw over sizes >= {format_size(threshold)}"
    largest = max(rows, key=lambda r: r["bytes"])
    return [largest], (
        f"largest size measured ({format_size(largest['bytes'])}); "
        f"no size reached {format_size(threshold)}"
    )


def format_size(nbytes: int) -> str:
    """1024-based size with its unit: 8 B, 64 KiB, 4 GiB."""
    value = nbytes
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:g} {unit}"
        value //= 1024
    return f"{nbytes} B"


def format_table(rows: list[Row]) -> str:
    """A fixed-width table: size, time, algbw, busbw, check."""
    head = f"{'size':>10} {'time_us':>12} {'algbw GB/s':>11} {'busbw GB/s':>11}  check"
    lines = [head]
    for r in rows:
        lines.append(
            f"{format_size(r['bytes']):>10} {r['time_us']:>12.2f} "
            f"{r['algbw_gbps']:>11.2f} {r['busbw_gbps']:>11.2f}  {r['check']}"
        )
    return "\n".join(lines)


def _notes(rows: list[Row], expect: float | None, large_busbw: float) -> list[str]:
    notes = []
    bad = [r["bytes"] for r in rows if r.get("check") != "ok"]
    if bad:
        notes.append(
            f"wrong all-reduce result at {', '.join(format_size(b) for b in bad)}"
        )
    if rows and rows[0].get("world_size") == 1:
        notes.append("world size 1: nothing crosses a link, busbw is 0 by definition")
    if expect is not None and large_busbw < expect:
        notes.append(
            f"large-message busbw {large_busbw:.2f} GB/s is below the expected {expect:g} GB/s"
        )
    return notes


def summarise(
    rows: list[Row], expect_busbw_gbps: float | None
) -> tuple[str, dict[str, Any], bool]:
    """(table text, JSON document, passed) for a sweep's result rows.

    Passed means: at least one row, every all-reduce result was right, and (when
    an expectation is given) the large-message busbw reaches it.
    """
    if not rows:
        doc = {
            "rows": [],
            "passed": False,
            "notes": ["no CLUSTERKIT_ALLREDUCE result lines in the log"],
        }
        return "no all-reduce results found", doc, False
    basis_rows, basis = large_message_rows(rows)
    large_busbw = max(r["busbw_gbps"] for r in basis_rows)
    checks_ok = all(r.get("check") == "ok" for r in rows)
    notes = _notes(rows, expect_busbw_gbps, large_busbw)
    passed = checks_ok and (
        expect_busbw_gbps is None or large_busbw >= expect_busbw_gbps
    )
    doc = {
        "world_size": rows[0].get("world_size"),
        "backend": rows[0].get("backend"),
        "rows": rows,
        "large_message_busbw_gbps": large_busbw,
        "basis": basis,
        "peak_algbw_gbps": max(r["algbw_gbps"] for r in rows),
        "expect_busbw_gbps": expect_busbw_gbps,
        "checks_ok": checks_ok,
        "passed": passed,
        "notes": notes,
    }
    verdict = "PASS" if passed else "FAIL"
    summary = f"large-message busbw: {large_busbw:.2f} GB/s ({basis}) -> {verdict}"
    text = "\n".join([format_table(rows), summary, *notes])
    return text, doc, passed


def format_find_slow(found: Any, job_ids: list[str]) -> tuple[str, dict[str, Any]]:
    """(table text, JSON document) of a --find-slow narrowing: each run's nodes and busbw."""
    runs = [{"run": number, "step": run.step, "nodes": list(run.nodes), "busbw_gbps": run.busbw_gbps,
             "slow": run.slow, "job_id": job_id}
            for number, (run, job_id) in enumerate(zip(found.runs, job_ids), start=1)]
    lines = [f"{'run':>3}  {'step':<5} {'busbw GB/s':>10}  {'':4}  nodes"]
    for run in runs:
        busbw = "failed" if run["busbw_gbps"] is None else f"{run['busbw_gbps']:.2f}"
        lines.append(f"{run['run']:>3}  {run['step']:<5} {busbw:>10}  {'SLOW' if run['slow'] else '':4}  "
                     f"{','.join(run['nodes'])}")
    lines.append(found.verdict)
    return "\n".join(lines), {"runs": runs, "culprits": list(found.culprits), "verdict": found.verdict}
