"""The `bench ddp` / `analyze` report: one JSON document, and a table for people."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster_kit.analysis import advice
from cluster_kit.analysis.breakdown import RankResult, analyse_rank
from cluster_kit.analysis.traces import Trace, TraceError, by_variant

BASE = advice.BASE_VARIANT  # the job as it is: "as-is" in a sweep, unnamed in a plain run


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
    return float(max(r["step_ms"]["median"] for r in ranks))


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


@dataclass(frozen=True)
class SweepRun:
    """What `bench ddp --sweep` knows of its launches besides their traces.

    ``variants``: the variants the job was to run, in order; ``launches``: each
    launch's exit status as the job script recorded it (empty when unknown);
    ``unreadable``: variant -> why one of its trace files could not be read.
    """

    variants: list[str]
    launches: Mapping[str, int] = field(default_factory=dict)
    unreadable: Mapping[str, str] = field(default_factory=dict)


def measure_variant(traces: list[Trace], done: Mapping[str, RankResult],
                    unreadable: str | None = None) -> tuple[list[RankResult], str | None]:
    """A variant's rank results, or why its traces give no step time (then no results)."""
    if unreadable:
        return [], unreadable
    if not traces:
        return [], "it wrote no traces"
    try:
        results = analyse_ranks(traces, done)
    except TraceError as exc:
        return [], str(exc)
    world = max(max(t.world_size for t in traces), max(t.rank for t in traces) + 1)
    missing = sorted(set(range(world)) - {t.rank for t in traces})
    if missing:
        return [], (f"traces from {world - len(missing)} of {world} ranks (none from rank "
                    f"{', '.join(map(str, missing))}): a rank failed or never reached its profiled steps")
    return results, None


def failure_reason(variant: str, problem: str, run: SweepRun) -> str:
    """Why a variant has no step time: its traces' problem, with what its launch did."""
    if run.launches and variant not in run.launches:
        return "never launched: the job ended before its turn (its time limit?)"
    code = run.launches.get(variant)
    if code:
        return f"its launch exited with {code}; {problem}"
    if code == 0:
        return f"its launch exited 0 but {problem}"
    return problem


def sweep_table(groups: Mapping[str, list[Trace]], done: Mapping[str, RankResult],
                run: SweepRun) -> tuple[list[dict[str, Any]], dict[str, list[RankResult]]]:
    """Each variant's step time and its gain over the job as it is, fastest first, failed ones last.

    Also the rank results of every variant that has a step time. A failed row
    has ``step_ms`` None and an ``error`` saying why.
    """
    rows: list[dict[str, Any]] = []
    measured: dict[str, list[RankResult]] = {}
    for variant in dict.fromkeys(list(run.variants) + list(groups)):
        results, problem = measure_variant(groups.get(variant, []), done, run.unreadable.get(variant))
        row: dict[str, Any] = {"variant": variant, "step_ms": None, "ranks": len(results), "gain_pct": None}
        if run.launches:
            row["exit_code"] = run.launches.get(variant)
        if problem is None:
            measured[variant] = results
            row["step_ms"] = round(job_step_ms([r.as_json() for r in results]), 3)
        else:
            row["error"] = failure_reason(variant, problem, run)
        rows.append(row)
    base = next((r["step_ms"] for r in rows if r["variant"] == BASE and r["step_ms"]), None)
    for row in rows:
        if base and row["step_ms"] is not None:
            row["gain_pct"] = round(100 * (base - row["step_ms"]) / base, 1)
    return sorted(rows, key=lambda r: (r["step_ms"] is None, r["step_ms"] or 0.0)), measured


def build_report(traces: list[Trace], job_id: str | None = None,
                 allreduce_rows: list[dict[str, Any]] | None = None,
                 run: SweepRun | None = None,
                 done: Mapping[str, RankResult] | None = None) -> tuple[dict[str, Any], list[RankResult]]:
    """The report document, and the rank results behind it (for the HTML timeline).

    `run`: the sweep's launches (None without ``--sweep``; traces of several
    variants are a sweep all the same). `done` holds results already computed
    (by trace path), e.g. by `analyse_files`. A TraceError when no variant has
    a step time.
    """
    groups = {(k or BASE): v for k, v in by_variant(traces).items()}
    done = dict(done or {})
    if run is None and len(groups) == 1:
        variant, results, sweep = next(iter(groups)), analyse_ranks(next(iter(groups.values())), done), None
    else:
        sweep, measured = sweep_table(groups, done, run or SweepRun(list(groups)))
        if not measured:
            raise TraceError("no variant of the sweep has a step time: " +
                             "; ".join(f"{r['variant']}: {r['error']}" for r in sweep))
        variant = BASE if BASE in measured else next(r["variant"] for r in sweep if r["variant"] in measured)
        results = measured[variant]
    return _document(results, groups[variant], variant, job_id, allreduce_rows, sweep), results


def _document(results: list[RankResult], traces: list[Trace], variant: str, job_id: str | None,
              allreduce_rows: list[dict[str, Any]] | None, sweep: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The JSON document of the ranks of one variant (the job as it is, when it ran), and the sweep."""
    ranks = [r.as_json() for r in results]
    if allreduce_rows:
        attach_sweep(ranks, allreduce_rows)
    straggler = advice.find_straggler(ranks)
    gpu = any(t.has_gpu for t in traces)
    doc: dict[str, Any] = {
        "job_id": job_id, "world_size": max([t.world_size for t in traces] + [len(ranks)]),
        "steps": min(r["steps"] for r in ranks), "device": "gpu" if gpu else "cpu",
        "variant": variant, "ranks": ranks, "straggler": straggler,
        "advice": advice.advise(ranks, straggler, gpu, sweep),
        "sweep": sweep,
    }
    if sweep:
        best = next((r for r in sweep if r["step_ms"] is not None), None)
        doc["sweep_best"] = best and {"variant": best["variant"], "step_ms": best["step_ms"],
                                      "gain_pct": best["gain_pct"]}
    return doc


def format_report(doc: dict[str, Any]) -> str:
    """The report as tables: per rank, collectives, straggler, advice, sweep."""
    from cluster_kit.text import format_table

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
    parts += ["", f"straggler: {advice.rank_on_host(s)} computes {s['compute_ms']:.2f} ms, "
                  f"the others' median {s['median_compute_ms']:.2f} ms" if s else "straggler: none"]
    if doc.get("sweep"):
        parts += ["", _sweep_lines(doc)]
    parts += ["", "advice:" if doc["advice"] else "advice: none"]
    parts += [f"- {a['knob']}={a['value']}: {a['why']}" + expected_text(a) for a in doc["advice"]]
    return "\n".join(parts)


def _sweep_lines(doc: dict[str, Any]) -> str:
    """The variants' table, the best one, and why each failed variant has no step time."""
    from cluster_kit.text import format_table

    rows = [[v["variant"], "failed" if v["step_ms"] is None else f"{v['step_ms']:.2f}",
             "-" if v["gain_pct"] is None else f"{v['gain_pct']:+.1f}"] for v in doc["sweep"]]
    lines = [format_table(["VARIANT", "STEP_MS", "GAIN%"], rows)]
    best = doc.get("sweep_best")
    if best:
        gain = "" if best["gain_pct"] is None else f" ({best['gain_pct']:+.1f} % against the job as it is)"
        lines.append(f"best: {best['variant']} at {best['step_ms']:.2f} ms{gain}")
    lines += [f"{v['variant']} failed: {v['error']}" for v in doc["sweep"] if v.get("error")]
    lines += [f"{v['variant']}: its launch exited with {v['exit_code']} after writing its traces"
              for v in doc["sweep"] if v.get("exit_code") and not v.get("error")]
    if doc.get("variant") != BASE:
        lines.append(f"the job as it is has no step time: the tables above show {doc['variant']}")
    return "\n".join(lines)


def expected_text(item: dict[str, Any]) -> str:
    """`` (measured step 6.38 ms)`` or `` (estimated step ...)``: which one it is, said."""
    if not item.get("expected_ms"):
        return ""
    return f" ({'measured' if item.get('measured') else 'estimated'} step {item['expected_ms']:.2f} ms)"


def _collectives_table(ranks: list[dict[str, Any]]) -> str:
    """Rank 0's collectives (every rank of DDP runs the same ones), busbw beside the sweep's."""
    from cluster_kit.text import format_table

    rank = ranks[0]
    rows = [[c["op"], c["bytes"], f"{c['count']:g}", f"{c['ms']:.3f}", f"{c['busbw_gbps']:.3f}",
             f"{c['sweep_busbw_gbps']:.3f}" if "sweep_busbw_gbps" in c else "-",
             "yes" if c.get("ddp_bucket") else "no"]
            for c in rank["collectives"]]
    if not rows:
        return f"collectives (rank {rank['rank']}): none"
    return (f"collectives per step (rank {rank['rank']}; DDP_BUCKET: DDP's gradient bucket, "
            "else the job's own call):\n" +
            format_table(["OP", "BYTES", "PER_STEP", "MS", "BUSBW_GBPS", "BENCH_ALLREDUCE_GBPS", "DDP_BUCKET"], rows))
