"""The `bench ddp` / `analyze` report: one JSON document, and a table for people."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cluster_kit.analysis import advice
from cluster_kit.analysis.breakdown import RankResult, analyse_rank
from cluster_kit.analysis.traces import Trace, TraceError, by_variant

BASE_VARIANTS = ("as-is", "")


def analyse_ranks(traces: list[Trace], done: Mapping[str, RankResult] | None = None) -> list[RankResult]:
    """Every rank's breakdown, by rank (`done`: those already analysed, by path).

    A TraceError when two files claim one rank.
    """
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank in seen:
            raise TraceError(f"{t.path}: rank {t.rank} again (also in {seen[t.rank]}): "
                             "keep one trace per rank in the folder")
        seen[t.rank] = t.path
    done = done or {}
    return [done[t.path] if t.path in done else analyse_rank(t) for t in sorted(traces, key=lambda t: t.rank)]


def job_step_ms(ranks: list[dict[str, Any]]) -> float:
    """The job's step time: the slowest rank's median (every rank waits for it)."""
    return max(r["step_ms"]["median"] for r in ranks)


def nearest_sweep_row(rows: list[dict[str, Any]], nbytes: int) -> dict[str, Any] | None:
    """The `bench allreduce` row closest in size (on a log scale) to `nbytes`."""
    sized = [r for r in rows if r.get("bytes", 0) > 0 and r.get("busbw_gbps") is not None]
    if nbytes <= 0 or not sized:
        return None
    return min(sized, key=lambda r: abs(math.log2(r["bytes"] / nbytes)))


def attach_sweep(ranks: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Set `bench allreduce`'s busbw beside each all-reduce of the same size."""
    for rank in ranks:
        for c in rank["collectives"]:
            row = nearest_sweep_row(rows, c["bytes"]) if c["op"] == "all_reduce" else None
            if row is not None:
                c["sweep_bytes"] = row["bytes"]
                c["sweep_busbw_gbps"] = row["busbw_gbps"]


def sweep_table(groups: dict[str, list[Trace]], done: Mapping[str, RankResult]) -> list[dict[str, Any]]:
    """Each variant's step time and its gain over the job as it is."""
    rows: list[dict[str, Any]] = []
    for variant, traces in groups.items():
        ranks = [r.as_json() for r in analyse_ranks(traces, done)]
        rows.append({"variant": variant or "as-is", "step_ms": round(job_step_ms(ranks), 3),
                     "ranks": len(ranks)})
    base = next((r["step_ms"] for r in rows if r["variant"] == "as-is"), None)
    for row in rows:
        row["gain_pct"] = round(100 * (base - row["step_ms"]) / base, 1) if base else 0.0
    return sorted(rows, key=lambda r: r["step_ms"])


def build_report(traces: list[Trace], job_id: str | None = None,
                 allreduce_rows: list[dict[str, Any]] | None = None,
                 expected_variants: list[str] | None = None,
                 done: Mapping[str, RankResult] | None = None) -> tuple[dict[str, Any], list[RankResult]]:
    """The report document, and the rank results behind it (for the HTML timeline).

    `done` holds results already computed (by trace path), e.g. by `analyse_files`.
    """
    groups = by_variant(traces)
    base = next((v for v in BASE_VARIANTS if v in groups), next(iter(groups)))
    done = dict(done or {})
    for group in groups.values():  # analyse_ranks returns them sorted by rank
        for trace, result in zip(sorted(group, key=lambda t: t.rank), analyse_ranks(group, done)):
            done[trace.path] = result
    results = analyse_ranks(groups[base], done)
    ranks = [r.as_json() for r in results]
    if allreduce_rows:
        attach_sweep(ranks, allreduce_rows)
    straggler = advice.find_straggler(ranks)
    sweep = sweep_table(groups, done) if len(groups) > 1 or expected_variants else None
    if sweep is not None and expected_variants:
        measured = {r["variant"] for r in sweep}
        sweep += [{"variant": v, "step_ms": None, "ranks": 0, "gain_pct": None}
                  for v in expected_variants if v not in measured]
    gpu = any(t.has_gpu for t in groups[base])
    doc: dict[str, Any] = {
        "job_id": job_id, "world_size": max([t.world_size for t in groups[base]] + [len(ranks)]),
        "steps": min(r["steps"] for r in ranks), "device": "gpu" if gpu else "cpu",
        "ranks": ranks, "straggler": straggler,
        "advice": advice.advise(ranks, straggler, gpu, sweep),
        "sweep": sweep,
    }
    if sweep:
        best = next((r for r in sweep if r["step_ms"] is not None), None)
        doc["sweep_best"] = best and {"variant": best["variant"], "step_ms": best["step_ms"],
                                      "gain_pct": best["gain_pct"]}
    return doc, results


def format_report(doc: dict[str, Any]) -> str:
    """The report as tables: per rank, collectives, straggler, advice, sweep."""
    from cluster_kit.report.text import format_table

    head = (f"job {doc['job_id'] or '-'}: {doc['world_size']} rank(s), {doc['steps']} profiled "
            f"step(s), {doc['device'].upper()}")
    rows = [[r["rank"], r["host"] or "-", f"{r['step_ms']['median']:.2f}", f"{r['step_ms']['p90']:.2f}",
             f"{r['compute_ms']:.2f}", f"{r['comm_ms']:.2f}", f"{r['exposed_comm_ms']:.2f}",
             f"{r['overlap_pct']:.1f}", f"{r['other_ms']:.2f}"] for r in doc["ranks"]]
    parts = [head, "", format_table(["RANK", "HOST", "STEP_MS", "P90_MS", "COMPUTE", "COMM", "EXPOSED",
                                     "OVERLAP%", "OTHER"], rows),
             "(COMPUTE + EXPOSED + OTHER = the mean step time)"]
    parts += ["", _collectives_table(doc["ranks"])]
    s = doc["straggler"]
    parts += ["", f"straggler: rank {s['rank']} ({s['host']}) computes {s['compute_ms']:.2f} ms, "
                  f"the others' median {s['median_compute_ms']:.2f} ms" if s else "straggler: none"]
    if doc.get("sweep"):
        parts += ["", format_table(["VARIANT", "STEP_MS", "GAIN%"], [
            [v["variant"], "failed" if v["step_ms"] is None else f"{v['step_ms']:.2f}",
             "-" if v["gain_pct"] is None else f"{v['gain_pct']:+.1f}"] for v in doc["sweep"]])]
        best = doc.get("sweep_best")
        if best:
            parts.append(f"best: {best['variant']} at {best['step_ms']:.2f} ms ({best['gain_pct']:+.1f} % "
                         "against the job as it is)")
    parts += ["", "advice:" if doc["advice"] else "advice: none"]
    parts += [f"- {a['knob']}={a['value']}: {a['why']}" +
              (f" (expected step {a['expected_ms']:.2f} ms)" if a.get("expected_ms") else "")
              for a in doc["advice"]]
    return "\n".join(parts)


def _collectives_table(ranks: list[dict[str, Any]]) -> str:
    """Rank 0's collectives (every rank of DDP runs the same ones), busbw beside the sweep's."""
    from cluster_kit.report.text import format_table

    rank = ranks[0]
    rows = [[c["op"], c["bytes"], f"{c['count']:g}", f"{c['ms']:.3f}", f"{c['busbw_gbps']:.3f}",
             f"{c['sweep_busbw_gbps']:.3f}" if "sweep_busbw_gbps" in c else "-"]
            for c in rank["collectives"]]
    if not rows:
        return f"collectives (rank {rank['rank']}): none"
    return (f"collectives per step (rank {rank['rank']}):\n" +
            format_table(["OP", "BYTES", "PER_STEP", "MS", "BUSBW_GBPS", "BENCH_ALLREDUCE_GBPS"], rows))
