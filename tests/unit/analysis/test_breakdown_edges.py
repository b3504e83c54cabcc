"""The step breakdown at its edges, on traces drawn by hand: every expected figure
is worked out from the drawing in the docstring, not from the code.

Edges: spans that touch (a collective ending where compute starts, an event at
the very start or end of the steps), a step that compute and communication fill
completely, a launch at the moment its step's CPU span ends, and the defaults
for keys a trace leaves out.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.analysis import intervals
from cluster_kit.analysis.breakdown import (
    RankResult,
    StepTimes,
    analyse_rank,
    overall_overlap_pct,
    percentile,
    split_step,
)
from cluster_kit.analysis.steps import Step, step_number, step_windows
from cluster_kit.analysis.traces import (
    Event,
    Trace,
    TraceError,
    folder_traces,
    load_trace,
    parse_trace,
    trace_files,
    variant_of,
)

COPY = "torch.distributed.ddp.reducer::copy_bucket_to_grad"
BACKWARD = "autograd::engine::evaluate_function: MmBackward0"


def op(name: str, start_ms: float, end_ms: float, cat: str = "cpu_op", tid: int = 1, **args: Any) -> dict:
    """A complete ("X") event; times in ms here, us in the trace."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid,
            "ts": start_ms * 1e3, "dur": (end_ms - start_ms) * 1e3, "args": args}


def step(number: int, start_ms: float, end_ms: float) -> dict:
    return op(f"ProfilerStep#{number}", start_ms, end_ms, cat="user_annotation")


def gloo_call(start_ms: float, end_ms: float, numel: int) -> list[dict]:
    """A Gloo all-reduce of `numel` floats: its launch on thread 1 at its start, its run on Gloo's thread 2."""
    return [op("c10d::allreduce_", start_ms, start_ms + 0.05, **{"Input Dims": [[[numel]]]}),
            op("gloo:all_reduce", start_ms, end_ms, cat="user_annotation", tid=2,
               **{"Input Dims": [[numel]], "Input type": ["float"]})]


def bucket_call(launch_ms: float, start_ms: float, end_ms: float) -> list[dict]:
    """DDP's bucket all-reduce of 256 floats (1 KiB): launched at launch_ms inside a backward function."""
    return [op("c10d::allreduce_", launch_ms, launch_ms + 0.1, **{"Input Dims": [[[256]]]}),
            op("gloo:all_reduce", start_ms, end_ms, cat="user_annotation", tid=2,
               **{"Input Dims": [[256]], "Input type": ["float"]})]


def parsed(events: list[dict], path: str = "trace-rank0.json", **doc: Any) -> Trace:
    return parse_trace(json.dumps({"traceEvents": events, **doc}), path)


# ---------------------------------------------------------------- intervals at touching spans

def test_spans_that_only_touch_share_no_time() -> None:
    assert intervals.intersect([(0.0, 2.0)], [(2.0, 4.0)]) == []
    assert intervals.intersect([(0.0, 2.0), (5.0, 6.0)], [(2.0, 5.0)]) == []


def test_subtract_leaves_no_empty_piece_where_spans_touch() -> None:
    # b starts where a starts, b ends where a ends: the rest only, no (0, 0) or (4, 4)
    assert intervals.subtract([(0.0, 4.0)], [(0.0, 2.0)]) == [(2.0, 4.0)]
    assert intervals.subtract([(0.0, 4.0)], [(2.0, 4.0)]) == [(0.0, 2.0)]
    assert intervals.subtract([(0.0, 4.0)], [(0.0, 1.0), (3.0, 4.0)]) == [(1.0, 3.0)]
    # every span of b over before a starts
    assert intervals.subtract([(5.0, 6.0)], [(0.0, 1.0), (2.0, 3.0)]) == [(5.0, 6.0)]
    assert intervals.subtract([(5.0, 6.0)], []) == [(5.0, 6.0)]


def test_clip_drops_a_span_with_no_length() -> None:
    assert intervals.clip([(1.0, 1.0), (2.0, 3.0)], 0.0, 5.0) == [(2.0, 3.0)]


def test_percentile_takes_the_nearest_rank() -> None:
    # p90 of 19 values: rank ceil(0.9 * 19) = ceil(17.1) = 18, the 18th smallest
    assert percentile([float(v) for v in range(19, 0, -1)], 90) == 18.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.0  # rank ceil(2) = 2
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0


# ---------------------------------------------------------------- one step split

def test_a_step_that_compute_and_exposed_communication_fill_has_no_other_time() -> None:
    """[0, 10) ms: compute 0-2 and 4-10, an all-reduce 0-6; exposed only 2-4."""
    times = split_step(Step(1, 0.0, 10_000.0), [(0.0, 2_000.0), (4_000.0, 10_000.0)], [(0.0, 6_000.0)])
    assert times == StepTimes(1, 10.0, 8.0, 6.0, 2.0, 0.0, (
        ("compute", 0.0, 2.0), ("exposed_comm", 2.0, 4.0), ("compute", 4.0, 10.0)))


def test_communication_ending_where_compute_ends_leaves_no_empty_segment() -> None:
    """[0, 10) ms: compute 0-1 and 3-6, an all-reduce 0-6 (exposed 1-3): other 6-10."""
    times = split_step(Step(2, 0.0, 10_000.0), [(0.0, 1_000.0), (3_000.0, 6_000.0)], [(0.0, 6_000.0)])
    assert times == StepTimes(2, 10.0, 4.0, 6.0, 2.0, 4.0, (
        ("compute", 0.0, 1.0), ("exposed_comm", 1.0, 3.0), ("compute", 3.0, 6.0)))


# ---------------------------------------------------------------- a rank's figures

def figures(step_ms: float, comm_ms: float, exposed_ms: float, number: int = 1) -> StepTimes:
    return StepTimes(number, step_ms, 1.23456, comm_ms, exposed_ms, step_ms - 1.23456 - exposed_ms)


def test_a_ranks_json_rounds_to_the_microsecond_and_takes_p90_by_rank() -> None:
    """Ten steps of 1..10 ms: median 5.5, p90 the 9th smallest (9), mean 5.5.

    Each step: compute 1.23456 ms (1.235 at 3 places), communication 0.5 ms of
    which 0.25 exposed: half of it overlapped.
    """
    steps = [figures(float(ms), 0.5, 0.25, number=ms) for ms in range(10, 0, -1)]
    rank = RankResult(3, "nodeA", 4, steps, [], extra={"bucket_copy_ms": 0.1234567}).as_json()
    assert rank == {
        "rank": 3, "host": "nodeA", "step_ms": {"median": 5.5, "p90": 9.0, "mean": 5.5},
        "compute_ms": 1.235, "comm_ms": 0.5, "exposed_comm_ms": 0.25, "overlap_pct": 50.0,
        "other_ms": 4.015, "steps": 10, "collectives": [], "bucket_copy_ms": 0.123}


def test_a_rank_with_no_communication_overlaps_nothing() -> None:
    rank = RankResult(0, "", 1, [figures(2.0, 0.0, 0.0)], []).as_json()
    assert (rank["comm_ms"], rank["overlap_pct"]) == (0.0, 0.0)


# ---------------------------------------------------------------- a Gloo rank drawn by hand

def gloo_rank() -> dict:
    """Two steps of rank 3 of 4 (ms); thread 1 runs the model, thread 2 is Gloo's.

    step 1 [0, 10):  bucket copy 0-0.4 (compute, at the very start); the job's own
                     all-reduce of 1 float 0-0.5 (0.1 exposed); backward 2-4 launches
                     a bucket all-reduce at 3 that runs 4-6 (2 ms, all exposed).
    step 2 [10, 20): backward 12-14 launches a bucket all-reduce at 13 that runs
                     14-17; mm 15-18 and a bucket copy 18-18.6 cover 15-17, so 1 exposed.
    At 20, the very end: a bucket copy 20-21 and the job's all-reduce of 2 floats
    20-20.5: after the steps, so in neither the copies nor the calls.
    """
    events = [
        step(1, 0, 10), step(2, 10, 20),
        op(COPY, 0, 0.4), *gloo_call(0, 0.5, 1),
        op(BACKWARD, 2, 4), *bucket_call(3, 4, 6),
        op(BACKWARD, 12, 14), *bucket_call(13, 14, 17), op("aten::mm", 15, 18), op(COPY, 18, 18.6),
        op(COPY, 20, 21), *gloo_call(20, 20.5, 2),
    ]
    return {"traceEvents": events, "distributedInfo": {"rank": 3, "world_size": 4, "backend": "gloo"}}


def test_a_gloo_rank_counts_what_starts_at_the_first_step_and_not_at_the_end() -> None:
    trace = parse_trace(json.dumps(gloo_rank()), "as-is.trace-rank3@nodeA.json")
    result = analyse_rank(trace)
    assert (result.rank, result.host, result.world_size) == (3, "nodeA", 4)
    # compute: step 1 0.4 + 2; step 2 2 + 3.6. comm: 0.5 + 2; 3. exposed: 0.1 + 2; 1.
    assert [(s.number, s.step_ms, s.compute_ms, s.comm_ms, s.exposed_comm_ms, s.other_ms) for s in result.steps] == [
        pytest.approx((1, 10.0, 2.4, 2.5, 2.1, 5.5)), pytest.approx((2, 10.0, 5.6, 3.0, 1.0, 3.4))]
    # the two buckets once a step (median of 2 and 3 ms), the job's call at 0 in every other step
    assert [(c["op"], c["bytes"], c["count"], c["ms"], c["ddp_bucket"]) for c in result.collectives] == [
        ("all_reduce", 1024, 1.0, 2.5, True), ("all_reduce", 4, 0.5, 0.5, False)]
    # copies (0.4 + 0.6) / 2 steps; buckets exposed (2 + 1) / 2 steps;
    # over the whole trace 2.9 of 6 ms of communication under compute (0-0.4, 15-17, 20-20.5)
    assert result.extra == pytest.approx(
        {"bucket_copy_ms": 0.5, "exposed_bucket_ms": 1.5, "trace_overlap_pct": 100 * 2.9 / 6})
    rank = result.as_json()
    assert (rank["bucket_copy_ms"], rank["exposed_bucket_ms"], rank["trace_overlap_pct"]) == (0.5, 1.5, 48.333)
    assert "kernels_per_step" not in rank  # no GPU


def test_a_trace_without_steps_says_how_to_record_them() -> None:
    trace = parsed([op("aten::mm", 0, 1)], "x.json")
    with pytest.raises(TraceError) as err:
        analyse_rank(trace)
    assert str(err.value) == ("x.json: no ProfilerStep#N spans: record it with torch.profiler's schedule "
                              "and prof.step() (cluster_kit.ddp.StepProfiler does)")


def test_overlap_of_under_a_microsecond_of_communication() -> None:
    # an all-reduce of 0.5 us inside a 2 ms mm: all of it overlapped
    trace = parsed([op("aten::mm", 0, 2), op("gloo:all_reduce", 1, 1.0005, cat="user_annotation", tid=2)])
    assert overall_overlap_pct(trace) == 100.0
    assert overall_overlap_pct(parsed([op("aten::mm", 0, 2)])) == 0.0


# ---------------------------------------------------------------- a GPU rank drawn by hand

def launch(name: str, at_ms: float, correlation: int) -> dict:
    return op(name, at_ms, at_ms + 0.05, cat="cuda_runtime", correlation=correlation)


def kernel(name: str, start_ms: float, end_ms: float, correlation: int | None = None) -> dict:
    args = {} if correlation is None else {"correlation": correlation}
    return op(name, start_ms, end_ms, cat="kernel", tid=7, **args)


def gpu_rank() -> dict:
    """Two steps on a GPU (ms): CPU spans ProfilerStep#1 1-4, ProfilerStep#2 5-10.

    The kernels, in the order the trace lists them:
    - a kernel 1-1.5 whose launch the trace lacks;
    - a launch at 4, the moment step 1's CPU span ends, of a kernel 4.5-5.5:
      step 1 ends at 5.5, and step 2 starts there;
    - a graph launch at 1 (the first step's start) of a kernel 2-3.5, inside step 1;
    - a launch at 9 of a kernel 9.5-12: step 2 ends at 12;
    - at 12, the very end: a kernel with no launch (and a graph launch of nothing);
    - a warm-up kernel 0.6-15 launched at 0.5, before the first step: in no step.
    Kernels starting in [1, 12): 1, 2, 4.5 and 9.5, two a step; graph launches: 1, half a step.
    """
    events = [
        step(1, 1, 4), step(2, 5, 10),
        kernel("unlaunched", 1, 1.5), kernel("gemm", 4.5, 5.5, correlation=3),
        kernel("gemm", 2, 3.5, correlation=1), kernel("gemm", 9.5, 12, correlation=2),
        kernel("unlaunched", 12, 12.5), kernel("warmup", 0.6, 15, correlation=4),
        launch("cudaLaunchKernel", 0.5, 4), launch("cudaGraphLaunch", 1, 1),
        launch("cudaLaunchKernel", 4, 3), launch("cudaLaunchKernel", 9, 2), launch("cudaGraphLaunch", 12, 5),
    ]
    return {"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl"}}


def test_gpu_steps_end_with_the_kernels_they_launched() -> None:
    trace = parsed(gpu_rank()["traceEvents"])
    assert [(w.number, w.start, w.end) for w in step_windows(trace)] == [(1, 1000.0, 5500.0), (2, 5500.0, 12000.0)]


def test_gpu_kernels_and_graph_launches_per_step_count_from_the_first_step_to_the_end() -> None:
    result = analyse_rank(parse_trace(json.dumps(gpu_rank()), "trace-rank0.json"))
    assert result.extra == {"bucket_copy_ms": 0.0, "kernels_per_step": 2.0, "graph_launches_per_step": 0.5,
                            "trace_overlap_pct": 0.0, "exposed_bucket_ms": 0.0}


def test_steps_are_taken_in_time_order_not_by_name() -> None:
    trace = parsed([step(10, 10, 20), step(9, 0, 10)])
    assert [(w.number, w.start, w.end) for w in step_windows(trace)] == [(9, 0.0, 10000.0), (10, 10000.0, 20000.0)]


def event(name: str) -> Event:
    return Event(name, "user_annotation", 0.0, 1.0, 1, {})


def test_a_step_number_is_what_follows_the_last_hash() -> None:
    assert step_number(event("ProfilerStep#12")) == 12
    assert step_number(event("ProfilerStep#a#5")) == 5
    assert step_number(event("ProfilerStep#warmup")) == -1
    assert step_number(event("ProfilerStep#")) == -1


# ---------------------------------------------------------------- reading a trace

def test_keys_a_trace_leaves_out_have_their_defaults() -> None:
    doc = {"traceEvents": [
        {"ph": "X", "ts": 1000, "dur": 500, "name": "aten::mm", "cat": "cpu_op", "tid": 7, "args": {"a": 1}},
        {"ph": "X", "ts": 2000},  # no name, cat, dur, tid or args
        {"ph": "i", "ts": 3000, "name": "an instant", "cat": "cpu_op"},  # not a complete event
        {"ph": "X", "name": "no time"},
        "not an event",
    ], "host_name": "nodeB"}
    trace = parse_trace(json.dumps(doc), "x.json")
    assert trace == Trace("x.json", 0, 1, "nodeB", "", "", [
        Event("aten::mm", "cpu_op", 1000.0, 500.0, 7, {"a": 1}), Event("", "", 2000.0, 0.0, None, {})], False)


def test_rank_and_host_come_from_the_file_name_when_the_trace_has_none() -> None:
    trace = parse_trace(json.dumps({"traceEvents": [], "host_name": "nodeB"}), "run/v1.trace-rank3@nodeA.json")
    assert (trace.rank, trace.world_size, trace.host, trace.backend, trace.variant) == (3, 1, "nodeA", "", "v1")


def test_the_traces_own_rank_comes_before_the_file_names() -> None:
    info = {"rank": 5, "world_size": 8, "backend": "nccl"}
    trace = parse_trace(json.dumps({"traceEvents": [], "distributedInfo": info}), "trace-rank3.json")
    assert (trace.rank, trace.world_size, trace.host, trace.backend) == (5, 8, "", "nccl")
    trace = parse_trace(json.dumps({"traceEvents": [], "distributedInfo": info}), "x.json")
    assert trace.rank == 5


def test_the_variant_is_the_file_names_prefix() -> None:
    assert variant_of("x.json") == ""
    assert variant_of("trace-rank0.json") == ""
    assert variant_of("out/a.b.trace-rank1@h.json.gz") == "a.b"


def test_a_trace_with_no_path_is_named_trace() -> None:
    assert parse_trace('{"traceEvents": []}').path == "<trace>"
    with pytest.raises(TraceError) as err:
        parse_trace("")
    assert str(err.value) == "<trace>: not JSON (Expecting value: line 1 column 1 (char 0))"


def test_a_description_without_events_keeps_everything_else() -> None:
    trace = Trace("a.json", 2, 4, "nodeA", "gloo", "v1", [event("ProfilerStep#1")], True)
    assert trace.without_events() == Trace("a.json", 2, 4, "nodeA", "gloo", "v1", [], True)


def test_trace_files_are_the_json_files_of_the_folder_itself(tmp_path: Path) -> None:
    for name in ("b.json.gz", "a.json", "notes.txt", "c.json.bak"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub.json").mkdir()
    (tmp_path / "sub.json" / "trace-rank0.json").write_text("")
    assert trace_files(tmp_path) == [tmp_path / "a.json", tmp_path / "b.json.gz"]
    assert folder_traces(tmp_path) == [tmp_path / "a.json", tmp_path / "b.json.gz"]


def test_folders_and_files_that_cannot_be_read_are_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as err:
        folder_traces(tmp_path / "none")
    assert str(err.value) == f"{tmp_path / 'none'}: no such folder"
    with pytest.raises(TraceError) as err:
        folder_traces(tmp_path)
    assert str(err.value) == f"{tmp_path}: no PyTorch profiler traces (*.json, *.json.gz) in it"
    missing = tmp_path / "trace-rank0.json"
    with pytest.raises(TraceError) as err:
        load_trace(missing)
    assert str(err.value) == f"{missing}: cannot read: [Errno 2] No such file or directory: '{missing}'"
    cut = tmp_path / "trace-rank1.json.gz"
    cut.write_bytes(gzip.compress(b'{"traceEvents": []}')[:-8])
    with pytest.raises(TraceError) as err:
        load_trace(cut)
    assert str(err.value) == f"{cut}: cannot read: Compressed file ended before the end-of-stream marker was reached"
