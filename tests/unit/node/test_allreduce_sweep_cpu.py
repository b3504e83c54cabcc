"""The real all-reduce sweep, run with gloo by several local processes on the CPU."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_kit.report.allreduce import parse_sweep_log, parse_sweep_meta

pytest.importorskip("torch")

SWEEP = Path(__file__).resolve().parents[3] / "cluster_kit" / "node" / "allreduce_sweep.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(world: int, *args: str, env_extra: dict[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Start ``world`` ranks by hand, as srun would, and wait for all of them."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            OMP_NUM_THREADS="1",
            CUDA_VISIBLE_DEVICES="",
            **(env_extra or {}),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SWEEP), "--backend", "gloo", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        results.append(
            subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        )
    return results


def test_three_ranks_sweep_checks_and_reports_every_size() -> None:
    results = run_ranks(3, "--max-bytes", "65536", "--iters", "3", "--warmup", "1")
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    rows = parse_sweep_log(results[0].stdout)
    assert [r["bytes"] for r in rows] == [8 << i for i in range(14)]
    for r in rows:
        assert (
            r["check"] == "ok"
            and r["world_size"] == 3
            and r["count"] == r["bytes"] // 4
        )
        assert r["busbw_gbps"] == pytest.approx(
            r["algbw_gbps"] * 4 / 3, rel=1e-3, abs=2e-6
        )
        assert r["time_us"] > 0
    assert parse_sweep_meta(results[0].stdout)["world_size"] == 3
    assert "algbw GB/s" in results[0].stdout  # the table for people
    assert parse_sweep_log(results[1].stdout) == []  # only rank 0 reports


def test_a_wrong_sum_on_one_rank_stops_every_rank() -> None:
    results = run_ranks(2, "--max-bytes", "64", "--iters", "1", "--corrupt-rank", "1")
    assert [r.returncode for r in results] == [1, 1]
    rows = parse_sweep_log(results[0].stdout)
    assert len(rows) == 1 and rows[0]["check"] == "mismatch"
    assert "CLUSTERKIT_ALLREDUCE_ERROR" in results[1].stderr


def test_the_slow_host_hook_holds_up_every_rank() -> None:
    """--find-slow's dev-cluster test slows one node this way: every rank's time grows."""
    args = ("--min-bytes", "1024", "--max-bytes", "1024", "--iters", "5", "--warmup", "1")
    fast = parse_sweep_log(run_ranks(2, *args)[0].stdout)
    slow_env = {"CLUSTERKIT_SWEEP_SLOW_HOST": socket.gethostname(), "CLUSTERKIT_SWEEP_SLOW_S": "0.05"}
    slow = parse_sweep_log(run_ranks(2, *args, env_extra=slow_env)[0].stdout)
    assert slow[0]["time_us"] >= 50_000 > fast[0]["time_us"]
