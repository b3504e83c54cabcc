"""DDP's buckets told from the job's own collectives, and advice that agrees with the sweep.

On real traces of examples/train_ddp_profiled.py --all-reduce-loss (the loss
all-reduced every step, as trainers do for logging): a 2-rank Gloo sweep on CPU
and one H200 rank, eager and graphed (tests/data/traces/README.md).
"""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from cluster_kit.analysis import advice, report
from cluster_kit.analysis.traces import Trace, TraceError, load_folder, parse_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"
SWEEP = DATA / "gloo-sweep-loss"
EAGER_LOSS = DATA / "h200-eager-loss"
GRAPHED_LOSS = DATA / "h200-graphed-loss"
MIB = 1 << 20
VARIANTS = ["as-is", "bucket_cap_mb=1", "bucket_cap_mb=5", "gradient_as_bucket_view"]


def mlp_params(inputs: int, width: int, depth: int) -> list[int]:
    """weight, bias numels of Linear(inputs, width), (depth-1) x Linear(width, width), Linear(width, 1)."""
    sizes = [(inputs, width)] + [(width, width)] * (depth - 1) + [(width, 1)]
    return [n for i, o in sizes for n in (i * o, o)]


def ddp_buckets(param_numels: list[int], cap_bytes: int, first_cap: int | None = None) -> list[int]:
    """DDP's bucket sizes in bytes, largest first: parameters in reverse order, a bucket closes at >= its cap."""
    buckets, current = [], 0
    for numel in reversed(param_numels):
        current += 4 * numel
        if current >= (first_cap if first_cap and not buckets else cap_bytes):
            buckets.append(current)
            current = 0
    return sorted(buckets + ([current] if current else []), reverse=True)


def per_step(rank: dict, bucket: bool) -> list[int]:
    return sorted((c["bytes"] for c in rank["collectives"] if c["ddp_bucket"] is bucket
                   for _ in range(round(c["count"]))), reverse=True)


def variant(name: str) -> list[Trace]:
    return [t for t in load_folder(SWEEP) if t.variant == name]


# ---------------------------------------------------------------- whose all-reduce

@pytest.mark.parametrize("name, cap, first_cap", [
    ("as-is", 25 * MIB, 1 * MIB),  # DDP's default: the first bucket capped at 1 MiB
    ("bucket_cap_mb=1", 1 * MIB, None),
    ("bucket_cap_mb=5", 5 * MIB, None),
    ("gradient_as_bucket_view", 25 * MIB, 1 * MIB),
])
def test_the_loss_all_reduce_is_the_jobs_own_not_a_bucket(name: str, cap: int, first_cap: int | None) -> None:
    params = mlp_params(64, 512, 4)
    doc = report.build_report(variant(name))[0]
    for rank in doc["ranks"]:
        assert per_step(rank, bucket=True) == ddp_buckets(params, cap, first_cap), rank["collectives"]
        assert per_step(rank, bucket=False) == [4]  # the loss, a 0-dim float, once a step
        assert advice.gradient_bytes(rank) == 4 * sum(params)
        assert advice.buckets_per_step(rank) == len(ddp_buckets(params, cap, first_cap))


def test_nccl_loss_all_reduce_is_not_a_bucket_eager_or_graphed() -> None:
    params = mlp_params(64, 256, 8)
    eager = report.build_report(load_folder(EAGER_LOSS))[0]["ranks"][0]
    assert per_step(eager, bucket=True) == ddp_buckets(params, 25 * MIB, 1 * MIB)
    assert per_step(eager, bucket=False) == [4]
    # Replayed from a CUDA graph, one rank's all-reduces put nothing on the GPU: the
    # loss, all-reduced outside the graph, is the only call left, and not a bucket.
    graphed = report.build_report(load_folder(GRAPHED_LOSS))[0]["ranks"][0]
    assert graphed["graph_launches_per_step"] == 1
    assert per_step(graphed, bucket=True) == [] and per_step(graphed, bucket=False) == [4]


def test_exposed_bucket_time_leaves_the_jobs_own_calls_out() -> None:
    for rank in report.build_report(variant("as-is"))[0]["ranks"]:
        assert 0 < rank["exposed_bucket_ms"] <= rank["exposed_comm_ms"]


# ---------------------------------------------------------------- advice against the sweep

def estimated(name: str) -> dict[str, dict]:
    """The advice from one variant's traces alone (no sweep), by knob."""
    return {a["knob"]: a for a in report.build_report(variant(name))[0]["advice"]}


def assert_agrees_with_sweep(doc: dict) -> None:
    """Every advice on a swept knob is a measured row that beat the job as it is, at its measured time."""
    rows = {r["variant"]: r for r in doc["sweep"]}
    base = rows["as-is"]["step_ms"]
    swept = advice.swept_knobs(doc["sweep"])
    for item in doc["advice"]:
        if item["knob"] not in swept:
            assert not item["measured"]
            continue
        assert item["measured"], item
        row = next(r for r in doc["sweep"] if advice.variant_knob(r["variant"]) == (item["knob"], item["value"]))
        assert row["step_ms"] is not None and row["step_ms"] < base
        assert item["expected_ms"] == row["step_ms"]


def test_advice_of_the_recorded_sweep_agrees_with_its_rows() -> None:
    doc = report.build_report(load_folder(SWEEP), run=report.SweepRun(VARIANTS))[0]
    assert_agrees_with_sweep(doc)
    rows = {r["variant"]: r["step_ms"] for r in doc["sweep"]}
    # The job as it is alone estimates gradient_as_bucket_view would help; the sweep
    # measured it slower, so the report with the sweep does not advise it.
    assert "gradient_as_bucket_view" in estimated("as-is")
    assert rows["gradient_as_bucket_view"] > rows["as-is"]
    assert "gradient_as_bucket_view" not in {a["knob"] for a in doc["advice"]}
    best = min((v for v in VARIANTS if v != "as-is"), key=lambda v: rows[v])
    assert doc["advice"][0]["knob"] + "=" + str(doc["advice"][0]["value"]) == best
    assert f"(measured step {rows[best]:.2f} ms)" in report.format_report(doc)


def timed(traces: list[Trace], name: str, factor: float) -> list[Trace]:
    """The same ranks' events stretched by `factor`, named as another variant."""
    return [Trace(t.path.replace("as-is.", f"{name}."), t.rank, t.world_size, t.host, t.backend, name,
                  [e._replace(ts=e.ts * factor, dur=e.dur * factor) for e in t.events], t.has_gpu)
            for t in traces]


@pytest.mark.parametrize("factor", [2.0, 1.01, 0.99, 0.5])
def test_a_bucket_size_is_advised_only_when_measured_faster(factor: float) -> None:
    """The user's case: the trace's estimate says bucket_cap_mb=1, the sweep measured it."""
    assert estimated("as-is")["bucket_cap_mb"]["value"] == 1
    base = variant("as-is")
    doc = report.build_report(base + timed(base, "bucket_cap_mb=1", factor),
                              run=report.SweepRun(["as-is", "bucket_cap_mb=1"]))[0]
    assert_agrees_with_sweep(doc)
    advised = [a for a in doc["advice"] if a["knob"] == "bucket_cap_mb"]
    row = next(r for r in doc["sweep"] if r["variant"] == "bucket_cap_mb=1")
    if factor > 1 - advice.MEASURED_MIN_GAIN_PCT / 100:  # slower, or within the noise: no bucket_cap_mb advice
        assert advised == [], advised
        assert "bucket_cap_mb=1:" not in report.format_report(doc).split("advice:")[1]
    else:
        assert [(a["value"], a["expected_ms"], a["measured"]) for a in advised] == [(1, row["step_ms"], True)]


def test_estimates_of_knobs_the_sweep_did_not_try_stay() -> None:
    base = variant("as-is")
    doc = report.build_report(base + timed(base, "static_graph", 2.0),
                              run=report.SweepRun(["as-is", "static_graph"]))[0]
    knobs = {a["knob"]: a for a in doc["advice"]}
    assert not knobs["bucket_cap_mb"]["measured"] and not knobs["gradient_as_bucket_view"]["measured"]
    assert "static_graph" not in knobs
    assert "(estimated step" in report.format_report(doc)


# ---------------------------------------------------------------- failed variants say why

def write_variant_files(tmp_path: Path, name: str, ranks: tuple[int, ...] = (0, 1)) -> None:
    for rank in ranks:
        source = SWEEP / f"{name}.trace-rank{rank}@vm.json.gz"
        shutil.copy(source, tmp_path / source.name)


def test_each_failed_variant_says_why(tmp_path: Path) -> None:
    write_variant_files(tmp_path, "as-is")
    write_variant_files(tmp_path, "bucket_cap_mb=1", ranks=(0,))  # rank 1 wrote nothing
    write_variant_files(tmp_path, "bucket_cap_mb=5")  # wrote its traces, then failed
    # A trainer that never called prof.step() under this variant: a trace without steps.
    text = gzip.decompress((SWEEP / "gradient_as_bucket_view.trace-rank0@vm.json.gz").read_bytes()).decode()
    stepless = parse_trace(text.replace("ProfilerStep#", "Step#"), str(tmp_path / "static_graph.trace-rank0@vm.json"))
    stepless.variant = "static_graph"
    run = report.SweepRun(
        ["as-is", "bucket_cap_mb=1", "bucket_cap_mb=5", "gradient_as_bucket_view", "static_graph", "cuda_graphs=on",
         "bucket_cap_mb=100"],
        launches={"as-is": 0, "bucket_cap_mb=1": 137, "bucket_cap_mb=5": 1, "gradient_as_bucket_view": 0,
                  "static_graph": 0, "cuda_graphs=on": 1},
        unreadable={"gradient_as_bucket_view": "gradient_as_bucket_view.trace-rank1@vm.json: not JSON (cut short)"})
    doc = report.build_report(load_folder(tmp_path) + [stepless], job_id="9", run=run)[0]
    rows = {r["variant"]: r for r in doc["sweep"]}
    assert rows["as-is"]["step_ms"] and rows["bucket_cap_mb=5"]["step_ms"]  # measured, though it exited 1
    assert rows["bucket_cap_mb=5"]["exit_code"] == 1 and "error" not in rows["bucket_cap_mb=5"]
    assert rows["bucket_cap_mb=1"]["error"] == (
        "its launch exited with 137; traces from 1 of 2 ranks (none from rank 1): a rank failed or never "
        "reached its profiled steps")
    assert rows["gradient_as_bucket_view"]["error"] == (
        "its launch exited 0 but gradient_as_bucket_view.trace-rank1@vm.json: not JSON (cut short)")
    assert rows["static_graph"]["error"].startswith("its launch exited 0 but ")
    assert "no ProfilerStep#N spans" in rows["static_graph"]["error"]
    assert rows["cuda_graphs=on"]["error"] == "its launch exited with 1; it wrote no traces"
    assert rows["bucket_cap_mb=100"]["error"] == "never launched: the job ended before its turn (its time limit?)"
    failed = [r["variant"] for r in doc["sweep"] if r["step_ms"] is None]
    assert doc["sweep"][-len(failed):] == [rows[v] for v in failed]  # failed rows last, none lost
    assert all(rows[v]["gain_pct"] is None and rows[v]["ranks"] == 0 for v in failed)
    text = report.format_report(doc)
    for name in failed:
        assert f"{name} failed: {rows[name]['error']}" in text
    assert "bucket_cap_mb=5: its launch exited with 1 after writing its traces" in text
    assert_agrees_with_sweep(doc)
    assert not {"static_graph", "cuda_graphs"} & {a["knob"] for a in doc["advice"]}


def test_without_the_job_as_it_is_there_is_nothing_to_measure_against(tmp_path: Path) -> None:
    write_variant_files(tmp_path, "bucket_cap_mb=1")
    write_variant_files(tmp_path, "bucket_cap_mb=5")
    run = report.SweepRun(["as-is", "bucket_cap_mb=1", "bucket_cap_mb=5"], launches={"as-is": 1})
    doc = report.build_report(load_folder(tmp_path), run=run)[0]
    assert doc["variant"] == doc["sweep"][0]["variant"] != "as-is"  # the fastest measured one is shown
    assert all(r["gain_pct"] is None for r in doc["sweep"])
    assert not any(a["measured"] for a in doc["advice"])
    assert not {"bucket_cap_mb"} & {a["knob"] for a in doc["advice"]}
    assert "the job as it is has no step time" in report.format_report(doc)


def test_a_sweep_with_no_step_time_at_all_is_one_error() -> None:
    run = report.SweepRun(["as-is", "static_graph"], launches={"as-is": 1, "static_graph": 1})
    partial = [t for t in variant("as-is") if t.rank == 0]
    with pytest.raises(TraceError, match=r"^no variant of the sweep has a step time: as-is: its launch exited "
                                         r"with 1; traces from 1 of 2 ranks .*; static_graph: its launch exited "
                                         r"with 1; it wrote no traces$"):
        report.build_report(partial, run=run)
