"""The report as one self-contained HTML page: tables and a per-rank step timeline.

No script and nothing fetched: the timeline is inline SVG, one bar per rank for
its median step, coloured compute / exposed communication / other. The page is
`templates/step_time.html.j2`, rendered as the audit's is (`report/html.py`,
autoescape on); this module works out what it shows.
"""
from __future__ import annotations

from typing import Any

from cluster_kit.analysis.breakdown import RankResult, StepTimes
from cluster_kit.analysis.report import expected_text
from cluster_kit.report.html import render_page

HTML_TEMPLATE = "step_time.html.j2"
COLOURS = {"compute": "#3a7bd5", "exposed_comm": "#e4572e", "other": "#d9d9d9"}
LABELS = {"compute": "compute", "exposed_comm": "exposed communication", "other": "other"}
BAR_W, BAR_H, LABEL_W = 900, 18, 110


def median_step(result: RankResult) -> StepTimes:
    ordered = sorted(result.steps, key=lambda s: s.step_ms)
    return ordered[(len(ordered) - 1) // 2]


def timeline(results: list[RankResult]) -> dict[str, Any]:
    """The SVG's geometry: one bar per rank, its median step's compute and exposed comm, the rest other."""
    longest = max(median_step(r).step_ms for r in results) or 1.0
    scale = BAR_W / longest
    bars = []
    for i, result in enumerate(results):
        step = median_step(result)
        y = i * (BAR_H + 6)
        bars.append({"rank": result.rank, "y": y, "text_y": y + 13, "width": f"{step.step_ms * scale:.2f}",
                     "title": f"step {step.number}: {step.step_ms:.3f} ms",
                     "segments": [{"kind": kind, "x": f"{LABEL_W + start * scale:.2f}",
                                   "width": f"{max((end - start) * scale, 0.3):.2f}"}
                                  for kind, start, end in step.segments]})
    height = len(results) * (BAR_H + 6) + 20
    return {"bars": bars, "width": LABEL_W + BAR_W + 10, "height": height, "axis_y": height - 4,
            "axis_end": LABEL_W + BAR_W, "longest": f"{longest:.2f}", "label_w": LABEL_W, "bar_h": BAR_H}


def html_context(doc: dict[str, Any], results: list[RankResult]) -> dict[str, Any]:
    """What step_time.html.j2 sees: the report's tables as rows of cells, the timeline, the advice."""
    ranks = [[r["rank"], r["host"], r["step_ms"]["median"], r["step_ms"]["p90"], r["compute_ms"], r["comm_ms"],
              r["exposed_comm_ms"], r["overlap_pct"], r["other_ms"]] for r in doc["ranks"]]
    colls = [[c["op"], c["bytes"], c["count"], c["ms"], c["busbw_gbps"], c.get("sweep_busbw_gbps", "-"),
              "yes" if c.get("ddp_bucket") else "no"] for c in doc["ranks"][0]["collectives"]]
    sweep = [[v["variant"], v["step_ms"] if v["step_ms"] is not None else "failed",
              v["gain_pct"] if v["gain_pct"] is not None else "-", v.get("error") or ""]
             for v in doc.get("sweep") or []]
    advice = [{"knob": a["knob"], "value": a["value"], "why": a["why"], "expected": expected_text(a)}
              for a in doc["advice"]]
    return {"doc": doc, "job": str(doc["job_id"] or "-"), "world_size": doc["world_size"], "steps": doc["steps"],
            "device": doc["device"].upper(), "colours": COLOURS, "labels": LABELS, "timeline": timeline(results),
            "ranks": ranks, "first_rank": doc["ranks"][0]["rank"], "collectives": colls,
            "straggler": straggler_text(doc["straggler"]), "sweep": sweep, "advice": advice}


def straggler_text(s: dict[str, Any] | None) -> str | None:
    if not s:
        return None
    return (f"rank {s['rank']} ({s['host']}) computes {s['compute_ms']:.2f} ms per step, "
            f"the others' median {s['median_compute_ms']:.2f} ms")


def render_html(doc: dict[str, Any], results: list[RankResult]) -> str:
    """The whole page; the JSON document is embedded for tools (inert, not executed)."""
    return render_page(HTML_TEMPLATE, html_context(doc, results))
