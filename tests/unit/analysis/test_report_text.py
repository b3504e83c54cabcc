"""The `bench ddp` / `analyze` report written out whole, from documents and rank results made by hand.

`format_report` is read by people: each case below gives a document whose every
figure is chosen, and the whole text expected from it (columns two spaces apart,
padded to the widest cell). `build_report` is given rank results already
computed (``done``, by trace path), so every step time of a sweep is chosen too.
"""
from __future__ import annotations

import pytest

from cluster_kit.analysis import report
from cluster_kit.analysis.breakdown import RankResult, StepTimes
from cluster_kit.analysis.traces import Trace, TraceError

# ---------------------------------------------------------------- format_report

RANK_1 = {"rank": 1, "host": None, "step_ms": {"median": 12.5, "p90": 13.25, "mean": 12.75},
          "compute_ms": 7.0, "comm_ms": 4.5, "exposed_comm_ms": 1.5, "overlap_pct": 66.7, "other_ms": 4.0,
          "steps": 3, "collectives": [
              {"op": "all_reduce", "bytes": 1048576, "count": 2.0, "ms": 1.5, "busbw_gbps": 3.25,
               "sweep_bytes": 1048576, "sweep_busbw_gbps": 9.5, "ddp_bucket": True},
              {"op": "broadcast", "bytes": 4, "count": 0.5, "ms": 0.012, "busbw_gbps": 0.001, "ddp_bucket": False}]}
RANK_0 = {"rank": 0, "host": "n2", "step_ms": {"median": 11.0, "p90": 11.5, "mean": 11.25},
          "compute_ms": 6.0, "comm_ms": 3.0, "exposed_comm_ms": 0.75, "overlap_pct": 75.0, "other_ms": 4.25,
          "steps": 3, "collectives": []}


def test_a_plain_run_without_host_straggler_or_advice() -> None:
    # Rank 1 first: the collectives table shows the first rank of the list, whichever it is.
    doc = {"job_id": None, "world_size": 2, "steps": 3, "device": "cpu", "variant": "as-is",
           "ranks": [RANK_1, RANK_0], "straggler": None, "advice": [], "sweep": None}
    lines = [
        "job -: 2 rank(s), 3 profiled step(s), CPU",
        "",
        "RANK  HOST  STEP_MS  P90_MS  COMPUTE  COMM  EXPOSED  OVERLAP%  OTHER",
        "1     -     12.50    13.25   7.00     4.50  1.50     66.7      4.00",
        "0     n2    11.00    11.50   6.00     3.00  0.75     75.0      4.25",
        "(COMPUTE + EXPOSED + OTHER = the mean step time)",
        "",
        "collectives per step (rank 1; DDP_BUCKET: DDP's gradient bucket, else the job's own call):",
        "OP          BYTES    PER_STEP  MS     BUSBW_GBPS  BENCH_ALLREDUCE_GBPS  DDP_BUCKET",
        "all_reduce  1048576  2         1.500  3.250       9.500                 yes",
        "broadcast   4        0.5       0.012  0.001       -                     no",
        "",
        "straggler: none",
        "",
        "advice: none",
    ]
    assert report.format_report(doc) == "\n".join(lines)


def test_a_straggler_whose_trace_names_no_host_is_its_rank_alone() -> None:
    doc = {"job_id": None, "world_size": 2, "steps": 3, "device": "cpu", "variant": "as-is",
           "ranks": [RANK_1, RANK_0], "advice": [], "sweep": None,
           "straggler": {"rank": 1, "host": None, "compute_ms": 7.0, "median_compute_ms": 6.0}}
    assert "\nstraggler: rank 1 computes 7.00 ms, the others' median 6.00 ms\n" in report.format_report(doc)


SWEEP_FAILED_BASE = [
    {"variant": "bucket_cap_mb=5", "step_ms": 9.0, "ranks": 4, "gain_pct": None, "exit_code": 0},
    {"variant": "static_graph", "step_ms": 9.5, "ranks": 4, "gain_pct": None, "exit_code": 1},
    {"variant": "as-is", "step_ms": None, "ranks": 0, "gain_pct": None, "exit_code": 137,
     "error": "its launch exited with 137; it wrote no traces"},
]


def test_a_sweep_whose_job_as_it_is_failed_with_a_straggler_and_advice() -> None:
    doc = {"job_id": "42", "world_size": 4, "steps": 2, "device": "gpu", "variant": "bucket_cap_mb=5",
           "ranks": [RANK_0], "sweep": SWEEP_FAILED_BASE,
           "sweep_best": {"variant": "bucket_cap_mb=5", "step_ms": 9.0, "gain_pct": None},
           "straggler": {"rank": 3, "host": "g4", "compute_ms": 9.5, "median_compute_ms": 7.25},
           "advice": [
               {"knob": "bucket_cap_mb", "value": 5, "why": "it ran faster", "expected_ms": 9.0, "measured": True},
               {"knob": "straggler", "value": "g4", "why": "rank 3 is slow", "expected_ms": None, "measured": False},
               {"knob": "cuda_graphs", "value": True, "why": "launch-bound", "expected_ms": 3.5, "measured": False},
               {"knob": "nccl", "value": "check", "why": "slow busbw", "expected_ms": 0.0, "measured": False}]}
    lines = [
        "job 42: 4 rank(s), 2 profiled step(s), GPU",
        "",
        "RANK  HOST  STEP_MS  P90_MS  COMPUTE  COMM  EXPOSED  OVERLAP%  OTHER",
        "0     n2    11.00    11.50   6.00     3.00  0.75     75.0      4.25",
        "(COMPUTE + EXPOSED + OTHER = the mean step time)",
        "",
        "collectives (rank 0): none",
        "",
        "straggler: rank 3 (g4) computes 9.50 ms, the others' median 7.25 ms",
        "",
        "VARIANT          STEP_MS  GAIN%",
        "bucket_cap_mb=5  9.00     -",
        "static_graph     9.50     -",
        "as-is            failed   -",
        "best: bucket_cap_mb=5 at 9.00 ms",
        "as-is failed: its launch exited with 137; it wrote no traces",
        "static_graph: its launch exited with 1 after writing its traces",
        "the job as it is has no step time: the tables above show bucket_cap_mb=5",
        "",
        "advice:",
        "- bucket_cap_mb=5: it ran faster (measured step 9.00 ms)",
        "- straggler=g4: rank 3 is slow",
        "- cuda_graphs=True: launch-bound (estimated step 3.50 ms)",
        "- nccl=check: slow busbw",
    ]
    assert report.format_report(doc) == "\n".join(lines)


def test_a_sweep_with_gains_against_the_job_as_it_is() -> None:
    sweep = [{"variant": "bucket_cap_mb=1", "step_ms": 7.0, "ranks": 2, "gain_pct": 12.5},
             {"variant": "as-is", "step_ms": 8.0, "ranks": 2, "gain_pct": 0.0},
             {"variant": "static_graph", "step_ms": 8.5, "ranks": 2, "gain_pct": -6.3}]
    doc = {"job_id": "5", "world_size": 1, "steps": 3, "device": "cpu", "variant": "as-is",
           "ranks": [RANK_0], "sweep": sweep, "straggler": None, "advice": [],
           "sweep_best": {"variant": "bucket_cap_mb=1", "step_ms": 7.0, "gain_pct": 12.5}}
    text = report.format_report(doc)
    lines = [
        "VARIANT          STEP_MS  GAIN%",
        "bucket_cap_mb=1  7.00     +12.5",
        "as-is            8.00     +0.0",
        "static_graph     8.50     -6.3",
        "best: bucket_cap_mb=1 at 7.00 ms (+12.5 % against the job as it is)",
        "",
        "advice: none",
    ]
    assert text.split("straggler: none\n\n")[1] == "\n".join(lines)


@pytest.mark.parametrize("item, text", [
    ({"expected_ms": 6.375, "measured": True}, " (measured step 6.38 ms)"),
    ({"expected_ms": 6.375, "measured": False}, " (estimated step 6.38 ms)"),
    ({"expected_ms": 6.375}, " (estimated step 6.38 ms)"),
    ({"expected_ms": None, "measured": True}, ""),
    ({"expected_ms": 0.0, "measured": True}, ""),
    ({}, ""),
])
def test_expected_text_says_measured_or_estimated(item: dict, text: str) -> None:
    assert report.expected_text(item) == text


# ---------------------------------------------------------------- bench allreduce beside the collectives

def test_nearest_sweep_row_on_a_log_scale_skipping_rows_without_a_size_or_busbw() -> None:
    rows = [{"busbw_gbps": 7.0}, {"bytes": 0, "busbw_gbps": 8.0}, {"bytes": 1024, "busbw_gbps": None},
            {"bytes": 1, "busbw_gbps": 1.0}, {"bytes": 4096, "busbw_gbps": 5.0}, {"bytes": 1 << 20, "busbw_gbps": 9.0}]
    assert report.nearest_sweep_row(rows, 1024) == {"bytes": 4096, "busbw_gbps": 5.0}  # the 1024 row has no busbw
    assert report.nearest_sweep_row(rows, 1) == {"bytes": 1, "busbw_gbps": 1.0}
    assert report.nearest_sweep_row(rows, 3) == {"bytes": 1, "busbw_gbps": 1.0}  # 3/1 < 4096/3
    assert report.nearest_sweep_row(rows, 1 << 30) == {"bytes": 1 << 20, "busbw_gbps": 9.0}
    assert report.nearest_sweep_row(rows, 0) is None  # a collective of no bytes has no row
    assert report.nearest_sweep_row(rows[:3], 1024) is None


def test_bench_allreduce_busbw_is_set_beside_all_reduces_only() -> None:
    ranks = [{"collectives": [{"op": "all_reduce", "bytes": 1000}, {"op": "broadcast", "bytes": 1000},
                              {"op": "all_reduce", "bytes": 0}]},
             {"collectives": [{"op": "all_reduce", "bytes": 3000}]}]
    report.attach_sweep(ranks, [{"bytes": 1024, "busbw_gbps": 2.5}, {"bytes": 4096, "busbw_gbps": 6.0}])
    assert ranks == [{"collectives": [{"op": "all_reduce", "bytes": 1000, "sweep_bytes": 1024, "sweep_busbw_gbps": 2.5},
                                      {"op": "broadcast", "bytes": 1000}, {"op": "all_reduce", "bytes": 0}]},
                     {"collectives": [{"op": "all_reduce", "bytes": 3000, "sweep_bytes": 4096,
                                       "sweep_busbw_gbps": 6.0}]}]


# ---------------------------------------------------------------- rank results given by hand

def trace(variant: str, rank: int, world_size: int = 2, host: str = "a", gpu: bool = False) -> Trace:
    """A rank's trace without events: its results come from ``done``, never from analysing it."""
    return Trace(f"/t/{variant or 'plain'}.trace-rank{rank}@{host}.json", rank, world_size, host, "gloo", variant,
                 [], gpu)


def result(rank: int, host: str, *steps: tuple[float, float, float, float, float]) -> RankResult:
    """Steps as (step, compute, comm, exposed, other) in ms; no collectives."""
    return RankResult(rank, host, 2, [StepTimes(i + 1, *s) for i, s in enumerate(steps)], [])


def steady(rank: int, host: str, step_ms: float, count: int = 2) -> RankResult:
    return result(rank, host, *[(step_ms, step_ms / 2, 0.5, 0.25, step_ms / 2 - 0.25)] * count)


def test_measure_variant_takes_results_already_computed() -> None:
    t0, t1 = trace("x", 0), trace("x", 1)
    r0, r1 = steady(0, "a", 3.0), steady(1, "a", 3.0)
    results, problem = report.measure_variant([t0, t1], {t0.path: r0, t1.path: r1})
    assert problem is None and len(results) == 2 and results[0] is r0 and results[1] is r1


def test_measure_variant_names_the_missing_ranks() -> None:
    # Traces that do not say their world size (1): rank 3 says there were at least 4 ranks.
    t0, t3 = trace("x", 0, world_size=1), trace("x", 3, world_size=1)
    done = {t0.path: steady(0, "a", 3.0), t3.path: steady(3, "a", 3.0)}
    assert report.measure_variant([t3, t0], done) == (
        [], "traces from 2 of 4 ranks (none from rank 1, 2): a rank failed or never reached its profiled steps")
    t2 = trace("x", 2, world_size=4)
    assert report.measure_variant([t2], {t2.path: steady(2, "a", 3.0)}) == (
        [], "traces from 1 of 4 ranks (none from rank 0, 1, 3): a rank failed or never reached its profiled steps")


def test_measure_variant_problems_before_any_analysis() -> None:
    t0 = trace("x", 0, world_size=1)
    done = {t0.path: steady(0, "a", 3.0)}
    assert report.measure_variant([t0], done, "x.trace-rank1@a.json: not JSON") == ([], "x.trace-rank1@a.json: not JSON")
    assert report.measure_variant([], done) == ([], "it wrote no traces")
    again = Trace("/t/other.json", 0, 1, "b", "gloo", "x", [], False)
    assert report.measure_variant([t0, again], done) == (
        [], "/t/other.json: rank 0 again (also in /t/x.trace-rank0@a.json): keep one trace per rank in the folder")


def test_analyse_ranks_in_rank_order_and_one_trace_per_rank() -> None:
    traces = [trace("x", 2, world_size=3), trace("x", 0, world_size=3), trace("x", 1, world_size=3)]
    done = {t.path: steady(t.rank, "a", 3.0) for t in traces}
    assert [r.rank for r in report.analyse_ranks(traces, done)] == [0, 1, 2]
    assert all(r is done[t.path] for r, t in zip(report.analyse_ranks(traces, done), sorted(traces, key=lambda t: t.rank)))
    with pytest.raises(TraceError) as err:
        report.analyse_ranks([*traces, Trace("/t/b.json", 1, 3, "b", "gloo", "x", [], False)], done)
    assert str(err.value) == ("/t/b.json: rank 1 again (also in /t/x.trace-rank1@a.json): "
                              "keep one trace per rank in the folder")


def sweep_of(step_ms: dict[str, tuple[float, float]], world_size: int = 2) -> tuple[list[Trace], dict[str, RankResult]]:
    """Two ranks (hosts a and b) per variant, each rank's steps all of the given time; traces rank 1 first."""
    traces, done = [], {}
    for variant, (ms0, ms1) in step_ms.items():
        for rank, host, ms in ((1, "b", ms1), (0, "a", ms0)):
            t = trace(variant, rank, world_size, host)
            traces.append(t)
            done[t.path] = steady(rank, host, ms)
    return traces, done


def test_a_sweep_document_from_known_step_times() -> None:
    traces, done = sweep_of({"static_graph": (4.0, 3.5), "bucket_cap_mb=1": (2.0, 1.5)}, world_size=1)
    # The job as it is: rank 0 two steps of 3 ms computing 2.5 ms, rank 1 three steps of
    # 2, 2.5, 2.5 ms computing 1 ms (a median of 2.5): its step time is rank 0's 3 ms,
    # and rank 0 (1.5 ms over the other's 1 ms) is a straggler.
    for rank, host in ((1, "b"), (0, "a")):
        traces.append(trace("as-is", rank, 1, host))
    done[traces[-2].path] = result(1, "b", (2.0, 1.0, 1.0, 1.0, 0.0), (2.5, 1.0, 1.0, 1.0, 0.5), (2.5, 1.0, 1.0, 1.0, 0.5))
    done[traces[-1].path] = result(0, "a", (3.0, 2.5, 1.0, 0.5, 0.0), (3.0, 2.5, 1.0, 0.5, 0.0))
    # The job as it is is listed after static_graph: the gains are against it all the same.
    run = report.SweepRun(["static_graph", "as-is", "bucket_cap_mb=1"])
    doc, results = report.build_report(traces, job_id="11", run=run, done=done)
    assert results == [done[traces[-1].path], done[traces[-2].path]]
    assert doc["sweep"] == [
        {"variant": "bucket_cap_mb=1", "step_ms": 2.0, "ranks": 2, "gain_pct": 33.3},  # 100 * 1/3
        {"variant": "as-is", "step_ms": 3.0, "ranks": 2, "gain_pct": 0.0},
        {"variant": "static_graph", "step_ms": 4.0, "ranks": 2, "gain_pct": -33.3},
    ]
    assert doc["sweep_best"] == {"variant": "bucket_cap_mb=1", "step_ms": 2.0, "gain_pct": 33.3}
    # The traces say a world of 1; the job had two ranks.
    assert (doc["job_id"], doc["world_size"], doc["steps"], doc["device"], doc["variant"]) == ("11", 2, 2, "cpu", "as-is")
    assert [(r["rank"], r["host"], r["step_ms"]["median"], r["steps"]) for r in doc["ranks"]] == [
        (0, "a", 3.0, 2), (1, "b", 2.5, 3)]
    assert doc["straggler"] == {"rank": 0, "host": "a", "compute_ms": 2.5, "median_compute_ms": 1.0}
    assert [(a["knob"], a["value"], a["expected_ms"], a["measured"]) for a in doc["advice"]] == [
        ("bucket_cap_mb", 1, 2.0, True), ("straggler", "a", None, False)]
    assert set(doc) == {"job_id", "world_size", "steps", "device", "variant", "ranks", "straggler", "advice",
                        "sweep", "sweep_best"}


def test_a_sweep_row_says_its_launchs_exit_status_and_gains_keep_one_decimal() -> None:
    traces, done = sweep_of({"as-is": (8.0, 7.5), "bucket_cap_mb=1": (7.0, 7.0), "bucket_cap_mb=5": (7.2, 7.1)})
    run = report.SweepRun(["as-is", "bucket_cap_mb=1", "bucket_cap_mb=5", "static_graph"],
                          launches={"as-is": 0, "bucket_cap_mb=1": 0, "bucket_cap_mb=5": 1, "static_graph": 2})
    doc = report.build_report(traces, run=run, done=done)[0]
    assert doc["sweep"] == [
        {"variant": "bucket_cap_mb=1", "step_ms": 7.0, "ranks": 2, "gain_pct": 12.5, "exit_code": 0},
        {"variant": "bucket_cap_mb=5", "step_ms": 7.2, "ranks": 2, "gain_pct": 10.0, "exit_code": 1},
        {"variant": "as-is", "step_ms": 8.0, "ranks": 2, "gain_pct": 0.0, "exit_code": 0},
        {"variant": "static_graph", "step_ms": None, "ranks": 0, "gain_pct": None, "exit_code": 2,
         "error": "its launch exited with 2; it wrote no traces"},
    ]
    assert doc["sweep_best"] == {"variant": "bucket_cap_mb=1", "step_ms": 7.0, "gain_pct": 12.5}


def test_a_step_that_rounds_to_no_time_sorts_first() -> None:
    traces, done = sweep_of({"as-is": (2.0, 2.0), "bucket_cap_mb=1": (0.5, 0.5), "bucket_cap_mb=5": (0.0001, 0.0)})
    doc = report.build_report(traces, run=report.SweepRun(["as-is", "bucket_cap_mb=1", "bucket_cap_mb=5"]),
                              done=done)[0]
    assert [(r["variant"], r["step_ms"]) for r in doc["sweep"]] == [
        ("bucket_cap_mb=5", 0.0), ("bucket_cap_mb=1", 0.5), ("as-is", 2.0)]


def test_without_the_job_as_it_is_the_fastest_variant_is_shown() -> None:
    traces, done = sweep_of({"bucket_cap_mb=5": (6.0, 6.0), "bucket_cap_mb=1": (5.0, 5.0), "static_graph": (9.0, 9.0)})
    run = report.SweepRun(["static_graph", "bucket_cap_mb=5", "as-is", "bucket_cap_mb=1"], launches={"as-is": 1})
    doc, results = report.build_report(traces, run=run, done=done)
    assert doc["variant"] == "bucket_cap_mb=1"
    assert results == [done["/t/bucket_cap_mb=1.trace-rank0@a.json"], done["/t/bucket_cap_mb=1.trace-rank1@b.json"]]
    assert [(r["variant"], r["step_ms"], r["gain_pct"]) for r in doc["sweep"]] == [
        ("bucket_cap_mb=1", 5.0, None), ("bucket_cap_mb=5", 6.0, None), ("static_graph", 9.0, None), ("as-is", None, None)]
    assert doc["sweep_best"] == {"variant": "bucket_cap_mb=1", "step_ms": 5.0, "gain_pct": None}


def test_a_plain_run_has_no_sweep() -> None:
    # Two of four ranks' traces, one of them with GPU kernels: a plain run is not checked for missing ranks.
    traces = [trace("", 1, world_size=4, host="b", gpu=True), trace("", 0, world_size=4)]
    done = {traces[0].path: steady(1, "b", 5.0, count=3), traces[1].path: steady(0, "a", 4.0)}
    doc, results = report.build_report(traces, done=done)
    assert results == [done[traces[1].path], done[traces[0].path]]
    assert (doc["job_id"], doc["world_size"], doc["steps"], doc["device"], doc["variant"]) == (None, 4, 2, "gpu", "as-is")
    assert doc["sweep"] is None and "sweep_best" not in doc and doc["straggler"] is None


def test_a_run_of_one_variant_is_a_sweep_when_the_sweep_says_so() -> None:
    traces, done = sweep_of({"as-is": (3.0, 3.0)})
    doc = report.build_report(traces, run=report.SweepRun(["as-is"]), done=done)[0]
    assert doc["sweep"] == [{"variant": "as-is", "step_ms": 3.0, "ranks": 2, "gain_pct": 0.0}]
    assert doc["sweep_best"] == {"variant": "as-is", "step_ms": 3.0, "gain_pct": 0.0}
    # Traces of several variants without the sweep's record: a sweep of the variants found.
    traces, done = sweep_of({"bucket_cap_mb=1": (2.0, 2.0), "as-is": (4.0, 4.0)})
    doc = report.build_report(traces, done=done)[0]
    assert doc["sweep"] == [{"variant": "bucket_cap_mb=1", "step_ms": 2.0, "ranks": 2, "gain_pct": 50.0},
                            {"variant": "as-is", "step_ms": 4.0, "ranks": 2, "gain_pct": 0.0}]


def test_no_step_time_in_any_variant_is_one_error_naming_each() -> None:
    run = report.SweepRun(["as-is", "static_graph"], launches={"as-is": 0},
                          unreadable={"as-is": "as-is.trace-rank0@a.json: not JSON"})
    with pytest.raises(TraceError) as err:
        report.build_report([trace("as-is", 0, 1)], run=run, done={})
    assert str(err.value) == ("no variant of the sweep has a step time: as-is: its launch exited 0 but "
                              "as-is.trace-rank0@a.json: not JSON; static_graph: never launched: the job ended "
                              "before its turn (its time limit?)")
