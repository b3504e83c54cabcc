"""The report as one self-contained HTML page: tables and a per-rank step timeline.

No script and nothing fetched: the timeline is inline SVG, one bar per rank for
its median step, coloured compute / exposed communication / other.
"""
from __future__ import annotations

import html
import json
from typing import Any

from cluster_kit.analysis.breakdown import RankResult, StepTimes
from cluster_kit.analysis.report import expected_text

COLOURS = {"compute": "#3a7bd5", "exposed_comm": "#e4572e", "other": "#d9d9d9"}
LABELS = {"compute": "compute", "exposed_comm": "exposed communication", "other": "other"}
BAR_W, BAR_H, LABEL_W = 900, 18, 110

STYLE = """body{font:14px system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:8px 0 16px}th,td{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}.key span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}
svg text{font:12px system-ui,sans-serif}"""


def median_step(result: RankResult) -> StepTimes:
    ordered = sorted(result.steps, key=lambda s: s.step_ms)
    return ordered[(len(ordered) - 1) // 2]


def timeline_svg(results: list[RankResult]) -> str:
    """One bar per rank: its median step's compute and exposed comm, the rest other."""
    longest = max(median_step(r).step_ms for r in results) or 1.0
    scale = BAR_W / longest
    rows = []
    for i, result in enumerate(results):
        step = median_step(result)
        y = i * (BAR_H + 6)
        rows.append(f'<g data-rank="{result.rank}"><text x="0" y="{y + 13}">rank {result.rank}</text>'
                    f'<rect x="{LABEL_W}" y="{y}" width="{step.step_ms * scale:.2f}" height="{BAR_H}" '
                    f'fill="{COLOURS["other"]}"><title>step {step.number}: {step.step_ms:.3f} ms</title></rect>')
        for kind, start, end in step.segments:
            rows.append(f'<rect class="{kind}" x="{LABEL_W + start * scale:.2f}" y="{y}" '
                        f'width="{max((end - start) * scale, 0.3):.2f}" height="{BAR_H}" fill="{COLOURS[kind]}"/>')
        rows.append("</g>")
    height = len(results) * (BAR_H + 6) + 20
    axis = (f'<text x="{LABEL_W}" y="{height - 4}">0 ms</text>'
            f'<text x="{LABEL_W + BAR_W}" y="{height - 4}" text-anchor="end">{longest:.2f} ms</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + BAR_W + 10}" height="{height}" '
            f'role="img" aria-label="median step per rank">{"".join(rows)}{axis}</svg>')


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(doc: dict[str, Any], results: list[RankResult]) -> str:
    """The whole page; the JSON document is embedded for tools (inert, not executed)."""
    ranks = [[r["rank"], r["host"], r["step_ms"]["median"], r["step_ms"]["p90"], r["compute_ms"], r["comm_ms"],
              r["exposed_comm_ms"], r["overlap_pct"], r["other_ms"]] for r in doc["ranks"]]
    colls = [[c["op"], c["bytes"], c["count"], c["ms"], c["busbw_gbps"], c.get("sweep_busbw_gbps", "-"),
              "yes" if c.get("ddp_bucket") else "no"] for c in doc["ranks"][0]["collectives"]]
    s = doc["straggler"]
    parts = [f"<h1>Where a step's time goes: job {html.escape(str(doc['job_id'] or '-'))}</h1>",
             f"<p>{doc['world_size']} rank(s), {doc['steps']} profiled step(s), {doc['device'].upper()}</p>",
             "<h2>Median step per rank</h2>",
             '<p class="key">' + "".join(f'<span style="background:{COLOURS[k]}"></span>{LABELS[k]}'
                                         for k in COLOURS) + "</p>",
             timeline_svg(results), "<h2>Ranks (ms)</h2>",
             _table(["rank", "host", "step median", "step p90", "compute", "comm", "exposed comm",
                     "overlap %", "other"], ranks),
             f"<h2>Collectives per step (rank {doc['ranks'][0]['rank']})</h2>",
             _table(["op", "bytes", "per step", "ms", "busbw GB/s", "bench allreduce GB/s", "DDP bucket"], colls),
             "<h2>Straggler</h2>",
             _straggler(s)]
    if doc.get("sweep"):
        parts += ["<h2>Variants</h2>", _table(["variant", "step ms", "gain %", "why it failed"], [
            [v["variant"], v["step_ms"] if v["step_ms"] is not None else "failed",
             v["gain_pct"] if v["gain_pct"] is not None else "-", v.get("error") or ""] for v in doc["sweep"]])]
    parts += ["<h2>Advice</h2>", "<ul>" + "".join(
        f"<li><b>{html.escape(str(a['knob']))}={html.escape(str(a['value']))}</b>: {html.escape(a['why'])}"
        f"{html.escape(expected_text(a))}</li>" for a in doc["advice"]) + "</ul>" if doc["advice"] else "<p>none</p>"]
    data = json.dumps(doc).replace("</", "<\\/")
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>clusterkit: step time of job {html.escape(str(doc['job_id'] or '-'))}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}"
            f'<script type="application/json" id="report">{data}</script></body></html>')


def _straggler(s: dict[str, Any] | None) -> str:
    if not s:
        return '<p id="straggler">none</p>'
    text = (f"rank {s['rank']} ({s['host']}) computes {s['compute_ms']:.2f} ms per step, "
            f"the others' median {s['median_compute_ms']:.2f} ms")
    return f'<p id="straggler">{html.escape(text)}</p>'
