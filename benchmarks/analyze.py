"""`clusterkit analyze` against Holistic Trace Analysis on the same trace files.

    PYTHONPATH=. python3 benchmarks/analyze.py --trace FILE [--ranks 8] [--repeats 3] [--json OUT]
    PYTHONPATH=. python3 benchmarks/analyze.py --dir DIR [--repeats 3]

``--trace`` takes one rank's PyTorch profiler trace (``.json`` or ``.json.gz``) and
writes ``--ranks`` copies of it, each with its own ``distributedInfo.rank``, into a
temporary folder: N ranks x the trace's steps. ``--dir`` uses a folder of traces
as they are. Both sides then analyse that folder, each timed end to end (reading
the files included), the median of ``--repeats`` runs:

* clusterkit: ``analyse_files`` (one process per rank, as ``clusterkit analyze``)
  + ``build_report``: the whole per-step report, with each rank's whole-trace
  overlap (``trace_overlap_pct``);
* HTA: ``TraceAnalysis(trace_dir=...)`` + ``get_comm_comp_overlap()``.

It prints both wall times, their ratio, and each rank's overall comm/comp overlap
from both tools (HTA's ``comp_comm_overlap_pctg``), with the largest difference.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster_kit.analysis.pool import analyse_files
from cluster_kit.analysis.report import build_report
from cluster_kit.analysis.traces import folder_traces


def replicate(trace: Path, ranks: int, folder: Path) -> None:
    """`ranks` copies of one trace, rank i in `trace-rank{i}.json`."""
    raw = trace.read_bytes()
    doc = json.loads(gzip.decompress(raw) if trace.name.endswith(".gz") else raw)
    for rank in range(ranks):
        info = dict(doc.get("distributedInfo") or {}, rank=rank, world_size=ranks)
        (folder / f"trace-rank{rank}.json").write_text(json.dumps({**doc, "distributedInfo": info}))


def run_clusterkit(folder: Path) -> tuple[float, dict[int, float], dict[str, Any]]:
    """What `clusterkit analyze` does: every rank in its own process, then the report."""
    started = time.perf_counter()
    traces, done = analyse_files(folder_traces(folder))
    doc, _ = build_report(traces, done=done)
    overlap = {r["rank"]: r["trace_overlap_pct"] for r in doc["ranks"]}
    return time.perf_counter() - started, overlap, doc


def run_hta(folder: Path) -> tuple[float, dict[int, float]]:
    from hta.trace_analysis import TraceAnalysis

    started = time.perf_counter()
    frame = TraceAnalysis(trace_dir=str(folder)).get_comm_comp_overlap(visualize=False)
    elapsed = time.perf_counter() - started
    return elapsed, {int(r): float(p) for r, p in zip(frame["rank"], frame["comp_comm_overlap_pctg"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="one rank's trace, replicated to --ranks ranks")
    source.add_argument("--dir", type=Path, help="a folder of traces, one per rank")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        if args.trace:
            replicate(args.trace, args.ranks, folder)
        ours = [run_clusterkit(folder) for _ in range(args.repeats)]
        print(f"clusterkit: {' '.join(f'{t:.2f}' for t, _, _ in ours)} s", flush=True)
        theirs = [run_hta(folder) for _ in range(args.repeats)]
    ck_s = statistics.median(t for t, _, _ in ours)
    hta_s = statistics.median(t for t, _ in theirs)
    ck_overlap, hta_overlap, doc = ours[0][1], theirs[0][1], ours[0][2]
    diff = max((abs(ck_overlap[r] - hta_overlap.get(r, float("nan"))) for r in ck_overlap), default=0.0)
    result = {"ranks": len(ck_overlap), "steps_per_rank": doc["steps"], "repeats": args.repeats,
              "clusterkit_s": round(ck_s, 3), "hta_s": round(hta_s, 3), "hta_over_clusterkit": round(hta_s / ck_s, 2),
              "overlap_pct": {"clusterkit": {r: round(v, 2) for r, v in ck_overlap.items()},
                              "hta": {r: round(v, 2) for r, v in hta_overlap.items()}},
              "max_overlap_diff_points": round(diff, 3),
              "comm_ms_per_step_rank0": doc["ranks"][0]["comm_ms"]}
    print(f"{result['ranks']} ranks x {result['steps_per_rank']} steps, median of {args.repeats}: "
          f"clusterkit {ck_s:.2f} s, HTA {hta_s:.2f} s (HTA / clusterkit = {hta_s / ck_s:.2f})")
    for rank in sorted(ck_overlap):
        print(f"rank {rank}: overlap clusterkit {ck_overlap[rank]:.2f} %, HTA {hta_overlap.get(rank, float('nan')):.2f} %")
    print(f"largest overlap difference: {diff:.3f} points")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
