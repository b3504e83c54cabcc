"""`clusterkit bench ddp` on the dev cluster's real Slurm: 2 nodes x 2 Gloo ranks on CPU.

One rank (3, on n2) is planted to compute 40 ms more per step, and the trainer
all-reduces its loss every step (its own collective, not one of DDP's buckets). The
sweep runs the job as it is, with `bucket_cap_mb=1` and with `static_graph`, one
launch after the other in one job; under `static_graph` the trainer exits 3 at
once, a launch that fails. The trainer resumes from CLUSTERKIT_CHECKPOINT_DIR, as a
job that keeps training does: each launch must get a fresh one of its own.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from jobcli import REPO, clusterkit, write_yaml

pytestmark = pytest.mark.integration

MIB = 1 << 20
WIDTH, DEPTH = 512, 4


def param_numels() -> list[int]:
    """examples/train_ddp_profiled.py's model: Linear 64->W, (D-1) x W->W, W->1."""
    sizes = [(64, WIDTH)] + [(WIDTH, WIDTH)] * (DEPTH - 1) + [(WIDTH, 1)]
    return [n for i, o in sizes for n in (i * o, o)]


def ddp_buckets(cap_bytes: int, first_cap: int | None = None) -> list[int]:
    """DDP's buckets in bytes: parameters in reverse order, a bucket closes once >= its cap."""
    buckets, current = [], 0
    for numel in reversed(param_numels()):
        current += 4 * numel
        if current >= (first_cap if first_cap and not buckets else cap_bytes):
            buckets.append(current)
            current = 0
    return sorted(buckets + ([current] if current else []), reverse=True)


def per_step_sizes(rank: dict[str, Any], bucket: bool = True) -> list[int]:
    """DDP's bucket sizes per step (with `bucket` False: the job's own calls)."""
    return sorted((c["bytes"] for c in rank["collectives"] if c["ddp_bucket"] is bucket
                   for _ in range(round(c["count"]))), reverse=True)


# The example trainer, except that under static_graph it fails before training.
FAILING_UNDER_STATIC_GRAPH = f"""\
import os, runpy, sys
if os.environ.get("CLUSTERKIT_DDP_VARIANT") == "static_graph":
    sys.exit(3)
sys.path.insert(0, {str(REPO / "examples")!r})
runpy.run_path({str(REPO / "examples" / "train_ddp_profiled.py")!r}, run_name="__main__")
"""


def test_bench_ddp_names_the_straggler_and_ranks_variants(dev_cluster: Any, tmp_path: Path) -> None:
    trainer = tmp_path / "trainer.py"
    trainer.write_text(FAILING_UNDER_STATIC_GRAPH)
    own_checkpoints = tmp_path / "ckpt"  # where the job keeps its real checkpoints
    own_checkpoints.mkdir()
    job = yaml.safe_load((REPO / "examples" / "cpu-ddp.yaml").read_text())
    job.update(name="ck-stepdiag", script=str(trainer), output=f"{tmp_path}/%x-%j.out",
               args=["--steps", "12", "--width", str(WIDTH), "--depth", str(DEPTH),
                     "--slow-rank", "3", "--slow-ms", "40", "--all-reduce-loss"])
    job["env"] = {**job["env"], "CLUSTERKIT_CHECKPOINT_DIR": str(own_checkpoints)}
    job_file = write_yaml(tmp_path / "stepdiag.yaml", job)
    done = clusterkit(dev_cluster, "bench", "ddp", str(job_file), "--steps", "4", "--sweep",
                      "--variant", "bucket_cap_mb=1", "--variant", "static_graph", "--json", timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert re.fullmatch(r"\d+", doc["job_id"]) and (doc["world_size"], doc["steps"]) == (4, 4)
    ranks = doc["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["host"] for r in ranks] == ["n1", "n1", "n2", "n2"]
    # How a step splits is checked on a hand-drawn trace (tests/unit/analysis); here,
    # that each rank computes and communicates, and the planted 40 ms (below).
    for rank in ranks:
        assert rank["compute_ms"] > 0 and rank["comm_ms"] > 0, rank
        # The job as it is: DDP's default buckets (the first one capped at 1 MiB),
        # and the loss the trainer all-reduces, which is not one of them.
        assert per_step_sizes(rank) == ddp_buckets(25 * MIB, first_cap=MIB), rank["collectives"]
        assert per_step_sizes(rank, bucket=False) == [4]
    straggler = doc["straggler"]
    assert straggler is not None and (straggler["rank"], straggler["host"]) == (3, "n2"), doc
    assert straggler["compute_ms"] - straggler["median_compute_ms"] > 20
    rows = {v["variant"]: v for v in doc["sweep"]}
    assert sorted(rows) == ["as-is", "bucket_cap_mb=1", "static_graph"]
    measured = [v for v in doc["sweep"] if v["step_ms"] is not None]
    assert sorted(v["variant"] for v in measured) == ["as-is", "bucket_cap_mb=1"]
    assert all(v["step_ms"] > 0 and v["ranks"] == 4 and v["exit_code"] == 0 for v in measured), (measured, done.stderr)
    assert measured == sorted(measured, key=lambda v: v["step_ms"]) == doc["sweep"][:2]  # fastest first
    assert doc["sweep_best"]["variant"] == doc["sweep"][0]["variant"]
    # The failed launch is in the report with why, not lost.
    assert doc["sweep"][2]["variant"] == "static_graph" and doc["sweep"][2]["step_ms"] is None
    assert doc["sweep"][2]["error"] == "its launch exited with 3; it wrote no traces"
    assert_advice_agrees_with_sweep(doc)

    # Every launch trained its 12 steps in its own scratch folder, and the job's own
    # checkpoint folder was never written (the second launch did not resume the first).
    trace_dir = Path(re.search(r"traces go to (\S+?);", done.stderr).group(1))  # type: ignore[union-attr]
    assert f"into {trace_dir}/scratch/<variant>" in done.stderr
    assert list(own_checkpoints.iterdir()) == []
    for variant in ("as-is", "bucket_cap_mb=1"):
        assert (trace_dir / "scratch" / variant / "checkpoint" / "latest").read_text() == "step-12\n"
    log = next(tmp_path.glob("ck-stepdiag-*.out")).read_text()
    assert log.count("rank=0 steps=12 resumed_at=0 ") == 2, log

    # The bucket_cap_mb=1 launch's traces alone: four buckets per step.
    only = tmp_path / "cap1"
    only.mkdir()
    for path in trace_dir.glob("bucket_cap_mb=1.trace-rank*.json"):
        shutil.copy(path, only / path.name)
    analysed = clusterkit(dev_cluster, "analyze", str(only), "--json")
    assert analysed.returncode == 0, analysed.stderr
    for rank in json.loads(analysed.stdout)["ranks"]:
        assert per_step_sizes(rank) == ddp_buckets(1 * MIB) and len(ddp_buckets(1 * MIB)) == 4


def assert_advice_agrees_with_sweep(doc: dict[str, Any]) -> None:
    """An advice on a knob the sweep tried is a measured row faster than as-is, at that row's time."""
    base = next(v["step_ms"] for v in doc["sweep"] if v["variant"] == "as-is")
    tried = {v["variant"].partition("=")[0] for v in doc["sweep"] if v["variant"] != "as-is"}
    for item in doc["advice"]:
        if item["knob"] not in tried:
            continue
        row = next(v for v in doc["sweep"] if v["variant"] in (f"{item['knob']}={item['value']}", item["knob"]))
        assert item["measured"] and item["expected_ms"] == row["step_ms"] < base, (item, doc["sweep"])


def test_bench_ddp_of_a_job_that_profiles_nothing(dev_cluster: Any, tmp_path: Path) -> None:
    job = yaml.safe_load((REPO / "examples" / "cpu-ddp.yaml").read_text())
    job.update(name="ck-noprof", output=f"{tmp_path}/%x-%j.out", args=["--steps", "2"],
               script=str(REPO / "examples" / "train_ddp.py"))  # a trainer that profiles nothing
    done = clusterkit(dev_cluster, "bench", "ddp", str(write_yaml(tmp_path / "j.yaml", job)), "--steps", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("clusterkit: error: ")]
    assert len(error) == 1 and re.fullmatch(r"clusterkit: error: job \d+ wrote no profiler traces into \S+ "
                                            r"\(launches: as-is exited 0\)", error[0]), error
    assert "StepProfiler" in done.stderr and "Traceback" not in done.stderr
