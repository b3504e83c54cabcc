"""`clusterkit bench ddp` on the dev cluster's real Slurm: 2 nodes x 2 Gloo ranks on CPU.

One rank (3, on n2) is planted to compute 40 ms more per step. The sweep runs the
job as it is and with `bucket_cap_mb=1`, one launch after the other in one job.
"""
from __future__ import annotations

import json
import math
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


def per_step_sizes(rank: dict[str, Any]) -> list[int]:
    return sorted((c["bytes"] for c in rank["collectives"] for _ in range(round(c["count"]))), reverse=True)


def test_bench_ddp_names_the_straggler_and_ranks_variants(dev_cluster: Any, tmp_path: Path) -> None:
    job = yaml.safe_load((REPO / "examples" / "cpu-ddp.yaml").read_text())
    job.update(name="ck-stepdiag", script=str(REPO / "examples" / "train_ddp_profiled.py"), output=f"{tmp_path}/%x-%j.out",
               args=["--steps", "12", "--width", str(WIDTH), "--depth", str(DEPTH),
                     "--slow-rank", "3", "--slow-ms", "40"])
    job_file = write_yaml(tmp_path / "stepdiag.yaml", job)
    done = clusterkit(dev_cluster, "bench", "ddp", str(job_file), "--steps", "4", "--sweep",
                      "--variant", "bucket_cap_mb=1", "--json", timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert re.fullmatch(r"\d+", doc["job_id"]) and (doc["world_size"], doc["steps"]) == (4, 4)
    ranks = doc["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["host"] for r in ranks] == ["n1", "n1", "n2", "n2"]
    for rank in ranks:
        parts = rank["compute_ms"] + rank["exposed_comm_ms"] + rank["other_ms"]
        assert math.isclose(parts, rank["step_ms"]["mean"], abs_tol=0.002), rank
        assert rank["exposed_comm_ms"] <= rank["comm_ms"]
        # The job as it is: DDP's default buckets (the first one capped at 1 MiB).
        assert per_step_sizes(rank) == ddp_buckets(25 * MIB, first_cap=MIB), rank["collectives"]
    straggler = doc["straggler"]
    assert straggler is not None and (straggler["rank"], straggler["host"]) == (3, "n2"), doc
    assert straggler["compute_ms"] - straggler["median_compute_ms"] > 20
    assert [v["variant"] for v in sorted(doc["sweep"], key=lambda v: v["variant"])] == ["as-is", "bucket_cap_mb=1"]
    assert all(v["step_ms"] > 0 and v["ranks"] == 4 for v in doc["sweep"])
    assert doc["sweep"] == sorted(doc["sweep"], key=lambda v: v["step_ms"])  # ranked, fastest first
    assert doc["sweep_best"]["variant"] == doc["sweep"][0]["variant"]

    # The bucket_cap_mb=1 launch's traces alone: four all-reduces per step.
    trace_dir = Path(re.search(r"traces go to (\S+)", done.stderr).group(1))  # type: ignore[union-attr]
    only = tmp_path / "cap1"
    only.mkdir()
    for path in trace_dir.glob("bucket_cap_mb=1.trace-rank*.json"):
        shutil.copy(path, only / path.name)
    analysed = clusterkit(dev_cluster, "analyze", str(only), "--json")
    assert analysed.returncode == 0, analysed.stderr
    for rank in json.loads(analysed.stdout)["ranks"]:
        assert per_step_sizes(rank) == ddp_buckets(1 * MIB) and len(ddp_buckets(1 * MIB)) == 4


def test_bench_ddp_of_a_job_that_profiles_nothing(dev_cluster: Any, tmp_path: Path) -> None:
    job = yaml.safe_load((REPO / "examples" / "cpu-ddp.yaml").read_text())
    job.update(name="ck-noprof", output=f"{tmp_path}/%x-%j.out", args=["--steps", "2"],
               script=str(REPO / "examples" / "train_ddp.py"))  # a trainer that profiles nothing
    done = clusterkit(dev_cluster, "bench", "ddp", str(write_yaml(tmp_path / "j.yaml", job)), "--steps", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("clusterkit: error: ")]
    assert len(error) == 1 and re.fullmatch(r"clusterkit: error: job \d+ wrote no profiler traces into \S+", error[0])
    assert "StepProfiler" in done.stderr and "Traceback" not in done.stderr
