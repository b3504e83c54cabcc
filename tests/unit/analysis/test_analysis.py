"""cluster_kit.analysis on real traces: Gloo on CPU (4 ranks, a straggler) and one H200."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cluster_kit.analysis import advice, intervals, report
from cluster_kit.analysis.breakdown import analyse_rank, overall_overlap_pct, percentile
from cluster_kit.analysis.steps import step_windows
from cluster_kit.analysis.traces import TraceError, load_folder, load_trace, parse_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"
GLOO = DATA / "gloo-straggler"
EAGER = DATA / "h200-eager"
GRAPHED = DATA / "h200-graphed"
MIB = 1 << 20


def ddp_buckets(param_numels: list[int], cap_bytes: int, elem: int = 4) -> list[int]:
    """DDP's bucket sizes in bytes: parameters in reverse order, a bucket closes at >= cap."""
    buckets, current = [], 0
    for numel in reversed(param_numels):
        current += numel * elem
        if current >= cap_bytes:
            buckets.append(current)
            current = 0
    return buckets + ([current] if current else [])


def mlp_params(inputs: int, width: int, depth: int) -> list[int]:
    """weight, bias numels of Linear(inputs, width), (depth-1) x Linear(width, width), Linear(width, 1)."""
    sizes = [(inputs, width)] + [(width, width)] * (depth - 1) + [(width, 1)]
    return [n for i, o in sizes for n in (i * o, o)]


# ---------------------------------------------------------------- intervals

def test_union_merges_overlapping_and_touching_spans() -> None:
    assert intervals.union([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]) == [(0, 4), (5, 7)]


def test_subtract_and_intersect() -> None:
    a = [(0.0, 10.0), (20.0, 30.0)]
    b = [(2.0, 4.0), (8.0, 22.0), (25.0, 26.0)]
    assert intervals.subtract(a, b) == [(0, 2), (4, 8), (22, 25), (26, 30)]
    assert intervals.intersect(a, b) == [(2, 4), (8, 10), (20, 22), (25, 26)]
    assert intervals.total(intervals.subtract(a, b)) + intervals.total(intervals.intersect(a, b)) == 20


def test_clip_keeps_the_parts_inside_the_window() -> None:
    spans = [(0.0, 2.0), (3.0, 5.0), (6.0, 9.0), (10.0, 11.0)]
    assert intervals.clip(spans, 1.0, 7.0) == [(1, 2), (3, 5), (6, 7)]
    assert intervals.clip(spans, 5.0, 6.0) == []
    assert intervals.clip(spans, 4.0, 4.5) == [(4, 4.5)]
    assert intervals.clip(spans, 11.0, 20.0) == [] and intervals.clip(spans, 3.0, 3.0) == []
    assert intervals.clip(spans, -5.0, 100.0) == spans


def test_percentile_is_nearest_rank() -> None:
    assert percentile([float(i) for i in range(1, 11)], 90) == 9.0
    assert percentile([3.0], 90) == 3.0


# ---------------------------------------------------------------- Gloo, 4 ranks

@pytest.fixture(scope="module")
def gloo_doc() -> dict:
    return report.build_report(load_folder(GLOO), job_id="7")[0]


def test_gloo_ranks_hosts_and_variant() -> None:
    traces = load_folder(GLOO)
    assert [(t.rank, t.world_size, t.backend, t.variant) for t in traces] == [
        (r, 4, "gloo", "bucket_cap_mb=1") for r in range(4)]
    assert {t.host for t in traces} == {"vm"}


def test_gloo_breakdown_has_compute_and_communication_in_every_step(gloo_doc: dict) -> None:
    for trace in load_folder(GLOO):
        result = analyse_rank(trace)
        assert len(result.steps) == 3
        for step in result.steps:
            assert step.comm_ms > 0 and step.compute_ms > 0
    for rank in gloo_doc["ranks"]:
        assert rank["step_ms"]["median"] <= rank["step_ms"]["p90"]
        assert 0 < rank["overlap_pct"] < 100


# ---------------------------------------------------------------- a trace made by hand

def cpu_op(name: str, start_ms: float, end_ms: float, tid: int = 1) -> dict:
    """A complete ("X") event as the profiler writes it; times in ms here, us in the trace."""
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid,
            "ts": start_ms * 1e3, "dur": (end_ms - start_ms) * 1e3, "args": {}}


def handmade_trace() -> dict:
    """Two steps of one Gloo rank whose figures are known from the drawing below (ms).

    step 1 [1, 11):   compute 1-5 and 4.5-6 (5 ms),  gloo 5-8 (3 ms, 1 ms under compute),
                      nothing 8-11 (3 ms)
    step 2 [11, 20):  compute 11-13 and 18-21 (cut at 20: 4 ms),  gloo 14-18.5 (4.5 ms,
                      0.5 ms under compute),  nothing 13-14 (1 ms)
    A gloo call on another thread (the collective's worker), as Gloo records them.
    """
    events = [
        {**cpu_op("ProfilerStep#1", 1, 11), "cat": "user_annotation"},
        {**cpu_op("ProfilerStep#2", 11, 20), "cat": "user_annotation"},
        cpu_op("aten::mm", 1, 5), cpu_op("aten::add_", 4.5, 6),
        cpu_op("gloo:all_reduce", 5, 8, tid=2),
        cpu_op("aten::mm", 11, 13), cpu_op("aten::mm", 18, 21),
        cpu_op("gloo:all_reduce", 14, 18.5, tid=2),
        cpu_op("c10d::allreduce_", 4.9, 5.0),  # a launch: not compute
    ]
    return {"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 2, "backend": "gloo"}}


def gpu_event(name: str, cat: str, start_ms: float, end_ms: float, correlation: int, tid: int = 7) -> dict:
    """A GPU kernel (cat kernel, stream tid 7) or its CUDA runtime launch (cat cuda_runtime, tid 1)."""
    return {**cpu_op(name, start_ms, end_ms, tid=tid), "cat": cat, "args": {"correlation": correlation}}


def handmade_gpu_trace() -> dict:
    """One step of one NCCL rank on a GPU, figures known from the drawing (ms).

    CPU: ProfilerStep#1 0-5, the nccl:all_reduce call 2-3 inside it.
    GPU: compute kernel 4-6 (launched at 1), NCCL kernel 5-8 (launched at 2.5 from
    within the nccl:all_reduce call), copy 8.5-9 (launched at 4).
    The step ends when its last GPU work does (9): 9 ms; compute 2; communication 3,
    1 of it under compute, so 2 exposed; nothing runs 0-4 and 8-8.5, and the copy is
    neither: other 9 - 2 - 2 = 5. Two kernels were launched.
    """
    events = [
        {**cpu_op("ProfilerStep#1", 0, 5), "cat": "user_annotation"},
        {**cpu_op("nccl:all_reduce", 2, 3), "cat": "user_annotation"},
        gpu_event("cudaLaunchKernel", "cuda_runtime", 1, 1.1, 1, tid=1),
        gpu_event("cudaLaunchKernel", "cuda_runtime", 2.5, 2.6, 2, tid=1),
        gpu_event("cudaMemcpyAsync", "cuda_runtime", 4, 4.1, 3, tid=1),
        gpu_event("void gemm_kernel<float>", "kernel", 4, 6, 1),
        gpu_event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 5, 8, 2),
        gpu_event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 8.5, 9, 3),
    ]
    return {"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl"}}


def test_a_handmade_gpu_trace_breaks_down_as_drawn() -> None:
    trace = parse_trace(json.dumps(handmade_gpu_trace()), "trace-rank0.json")
    assert (trace.has_gpu, trace.variant, trace.host) == (True, "", "")
    [window] = step_windows(trace)
    assert (window.number, window.start, window.end) == (1, 0.0, 9000.0)
    result = analyse_rank(trace)
    [step] = result.steps
    figures = (step.step_ms, step.compute_ms, step.comm_ms, step.exposed_comm_ms, step.other_ms)
    assert figures == pytest.approx((9.0, 2.0, 3.0, 2.0, 5.0))
    rank = result.as_json()
    assert (rank["overlap_pct"], rank["kernels_per_step"], rank["graph_launches_per_step"]) == (33.3, 2.0, 0.0)
    # one call per step, its time the NCCL kernel's 3 ms, not launched from a backward pass
    assert [(c["op"], c["count"], c["ms"], c["ddp_bucket"]) for c in rank["collectives"]] == [
        ("all_reduce", 1.0, 3.0, False)]


def test_a_handmade_trace_breaks_down_as_drawn() -> None:
    trace = parse_trace(json.dumps(handmade_trace()), "as-is.trace-rank0@vm.json")
    result = analyse_rank(trace)
    figures = [(s.number, s.step_ms, s.compute_ms, s.comm_ms, s.exposed_comm_ms, s.other_ms) for s in result.steps]
    assert figures == [pytest.approx((1, 10.0, 5.0, 3.0, 2.0, 3.0)), pytest.approx((2, 9.0, 4.0, 4.5, 4.0, 1.0))]
    assert [(kind, round(a, 6), round(b, 6)) for kind, a, b in result.steps[1].segments] == [
        ("compute", 0.0, 2.0), ("exposed_comm", 3.0, 7.0), ("compute", 7.0, 9.0)]
    rank = result.as_json()
    assert rank["step_ms"] == {"median": 9.5, "p90": 10.0, "mean": 9.5}
    assert (rank["compute_ms"], rank["comm_ms"], rank["exposed_comm_ms"], rank["other_ms"]) == (4.5, 3.75, 3.0, 2.0)
    assert rank["overlap_pct"] == 20.0  # 0.75 of 3.75 ms under compute
    assert overall_overlap_pct(trace) == pytest.approx(100 * 1.5 / 7.5)


def test_gloo_all_reduces_are_ddps_buckets(gloo_doc: dict) -> None:
    # bucket_cap_mb=1 on Linear 64->512, 3x 512->512, 512->1: four buckets per step.
    expected = sorted(ddp_buckets(mlp_params(64, 512, 4), 1 * MIB), reverse=True)
    assert len(expected) == 4
    for rank in gloo_doc["ranks"]:
        per_step = sorted((c["bytes"] for c in rank["collectives"] for _ in range(int(c["count"]))), reverse=True)
        assert per_step == expected, rank["collectives"]
        assert {c["op"] for c in rank["collectives"]} == {"all_reduce"}
        assert all(c["busbw_gbps"] > 0 and c["ms"] > 0 for c in rank["collectives"])
        assert math.isclose(advice.gradient_bytes(rank), 4 * sum(mlp_params(64, 512, 4)))


def test_gloo_straggler_is_the_planted_rank(gloo_doc: dict) -> None:
    straggler = gloo_doc["straggler"]
    assert straggler is not None and (straggler["rank"], straggler["host"]) == (2, "vm")
    others = sorted(r["compute_ms"] for r in gloo_doc["ranks"] if r["rank"] != 2)
    assert straggler["median_compute_ms"] == pytest.approx(others[1], abs=0.001)
    assert straggler["compute_ms"] > 1.1 * straggler["median_compute_ms"]
    assert gloo_doc["advice"][0]["knob"] == "straggler" and "rank 2" in gloo_doc["advice"][0]["why"]


def test_report_json_has_the_spec_keys(gloo_doc: dict) -> None:
    assert {"job_id", "world_size", "steps", "ranks", "straggler", "advice", "sweep"} <= set(gloo_doc)
    assert (gloo_doc["job_id"], gloo_doc["world_size"], gloo_doc["steps"]) == ("7", 4, 3)
    rank = gloo_doc["ranks"][0]
    assert {"rank", "host", "step_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "overlap_pct",
            "other_ms", "collectives"} <= set(rank)
    assert {"median", "p90"} <= set(rank["step_ms"])
    assert set(rank["collectives"][0]) >= {"op", "bytes", "count", "ms", "busbw_gbps"}
    assert set(gloo_doc["straggler"]) == {"rank", "host", "compute_ms", "median_compute_ms"}
    for item in gloo_doc["advice"]:
        assert set(item) == {"knob", "value", "why", "expected_ms", "measured"}
    json.dumps(gloo_doc)


def test_bench_allreduce_rows_are_set_beside_the_same_sizes(gloo_doc: dict) -> None:
    rows = [{"bytes": 8 << i, "busbw_gbps": float(i)} for i in range(24)]
    doc = report.build_report(load_folder(GLOO), allreduce_rows=rows)[0]
    for c in doc["ranks"][0]["collectives"]:
        assert c["sweep_bytes"] in (1 << 20, 1 << 17)  # nearest power of two to 1.0 MiB / 130 KiB
        assert c["sweep_busbw_gbps"] == rows[[r["bytes"] for r in rows].index(c["sweep_bytes"])]["busbw_gbps"]
    assert any(a["knob"] == "nccl" for a in doc["advice"])  # far below the (made up) sweep


def test_sweep_ranks_variants_and_names_the_best() -> None:
    base = load_folder(GLOO)
    faster = load_folder(GLOO)
    for t in base:
        t.variant = "as-is"
    for t in faster:  # the same job with every event at half the time
        t.variant, t.path = "bucket_cap_mb=100", t.path.replace("bucket_cap_mb=1.", "bucket_cap_mb=100.")
        t.events = [e._replace(ts=e.ts / 2, dur=e.dur / 2) for e in t.events]
    run = report.SweepRun(["as-is", "bucket_cap_mb=100", "static_graph"])
    doc = report.build_report(base + faster, run=run)[0]
    assert [v["variant"] for v in doc["sweep"]] == ["bucket_cap_mb=100", "as-is", "static_graph"]
    assert doc["sweep"][0]["gain_pct"] == pytest.approx(50, abs=0.2)
    assert doc["sweep"][2]["step_ms"] is None and doc["sweep"][2]["error"] == "it wrote no traces"
    assert doc["sweep_best"]["variant"] == "bucket_cap_mb=100"
    assert doc["advice"][0]["knob"] == "bucket_cap_mb" and doc["advice"][0]["value"] == 100
    assert doc["advice"][0]["measured"] and doc["advice"][0]["expected_ms"] == doc["sweep"][0]["step_ms"]
    assert "best: bucket_cap_mb=100" in report.format_report(doc)


# ---------------------------------------------------------------- H200, eager vs graphed

def test_h200_eager_step_is_launch_bound() -> None:
    doc = report.build_report(load_folder(EAGER))[0]
    rank = doc["ranks"][0]
    assert (doc["device"], doc["world_size"], doc["steps"]) == ("gpu", 1, 4)
    assert rank["other_ms"] > 0.8 * rank["step_ms"]["mean"]  # the GPU waits for launches
    assert rank["kernels_per_step"] > 50 and rank["graph_launches_per_step"] == 0
    graphs = [a for a in doc["advice"] if a["knob"] == "cuda_graphs"]
    assert graphs and graphs[0]["expected_ms"] < rank["step_ms"]["mean"]
    # Default buckets: the first is capped at 1 MiB, the rest in the second.
    expected = sorted(ddp_buckets(mlp_params(64, 256, 8), 1 * MIB)[:1] + [
        4 * sum(mlp_params(64, 256, 8)) - ddp_buckets(mlp_params(64, 256, 8), 1 * MIB)[0]], reverse=True)
    assert sorted((c["bytes"] for c in rank["collectives"]), reverse=True) == expected
    assert all(c["count"] == 1 for c in rank["collectives"])


def test_h200_graphed_step_has_the_launch_gaps_gone() -> None:
    eager = report.build_report(load_folder(EAGER))[0]["ranks"][0]
    doc = report.build_report(load_folder(GRAPHED))[0]
    graphed = doc["ranks"][0]
    assert graphed["graph_launches_per_step"] == 1
    assert graphed["other_ms"] < eager["other_ms"] / 5
    assert graphed["step_ms"]["median"] < eager["step_ms"]["median"] / 4
    assert graphed["compute_ms"] == pytest.approx(eager["compute_ms"], rel=0.5)  # the same kernels
    assert not any(a["knob"] == "cuda_graphs" for a in doc["advice"])


def test_gpu_step_windows_cover_their_kernels_and_never_overlap() -> None:
    trace = next(iter(load_folder(EAGER)))
    windows = step_windows(trace)
    assert [w.number for w in windows] == sorted(w.number for w in windows) and len(windows) == 4
    for before, after in zip(windows, windows[1:]):  # noqa: RUF007 - itertools.pairwise needs 3.10
        assert before.end <= after.start
    kernels = [e for e in trace.events if e.cat == "kernel"]
    inside = [k for k in kernels if any(w.start <= k.ts and k.end <= w.end for w in windows)]
    assert len(inside) >= 0.9 * len(kernels)


def test_overall_overlap_of_one_cpu_rank() -> None:
    trace = load_trace(next(GLOO.iterdir()))
    assert 0 < overall_overlap_pct(trace) < 100


# ---------------------------------------------------------------- errors

def test_not_a_trace_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"^x\.json: no traceEvents list"):
        parse_trace('{"a": 1}', "x.json")
    with pytest.raises(TraceError, match=r"^y\.json: not JSON"):
        parse_trace("{", "y.json")
    (tmp_path / "trace-rank0.json").write_text('{"traceEvents": []}')
    with pytest.raises(TraceError, match="no ProfilerStep#N spans"):
        report.build_report(load_folder(tmp_path))
    with pytest.raises(TraceError, match="no PyTorch profiler traces"):
        load_folder(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else tmp_path)


def test_two_files_of_one_rank_are_refused(tmp_path: Path) -> None:
    for name in ("a.json.gz", "b.json.gz"):
        (tmp_path / name).write_bytes((EAGER / "trace-rank0.json.gz").read_bytes())
    with pytest.raises(TraceError, match="rank 0 again"):
        report.build_report(load_folder(tmp_path))
