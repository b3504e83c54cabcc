"""`clusterkit bench allreduce`: a real Gloo sweep as a Slurm job on the dev cluster.

Both sweeps start together (torch start-up on every rank is most of their time)
and fit side by side on the nodes' fake GPUs: 2 + 1 per node.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jobcli import REPO, finish, start, write_yaml

pytestmark = pytest.mark.integration


def test_sweep_and_expectation(dev_cluster: Any, tmp_path: Path) -> None:
    # The same job shape on a profile that expects an absurd bus bandwidth.
    greedy = write_yaml(tmp_path / "greedy.yaml", {
        "name": "greedy", "extends": str(REPO / "profiles" / "local-dev.yaml"),
        "expect": {"allreduce_busbw_gbps": 1000000}})
    job = yaml.safe_load((REPO / "examples" / "cpu-ddp.yaml").read_text())
    job.update(name="ck-greedy", profile=str(greedy), gpus_per_node=1, output=f"{tmp_path}/%x-%j.out")
    greedy_job = write_yaml(tmp_path / "greedy-job.yaml", job)

    sweep = start(dev_cluster, "bench", "allreduce", "examples/cpu-ddp.yaml", "--max-bytes", "1M", "--json")
    too_slow = start(dev_cluster, "bench", "allreduce", str(greedy_job), "--max-bytes", "64K", "--json")

    done = finish(sweep)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)  # one JSON document, nothing else
    assert (doc["world_size"], doc["backend"], doc["checks_ok"], doc["passed"]) == (4, "gloo", True, True)
    rows = doc["rows"]
    assert [row["bytes"] for row in rows] == [8 << i for i in range(18)]  # 8 B .. 1 MiB
    for row in rows:
        assert (row["check"], row["world_size"], row["count"]) == ("ok", 4, row["bytes"] // 4), row
        assert row["time_us"] > 0
        # Reported to 6 decimals: compare within that rounding.
        assert math.isclose(row["algbw_gbps"], row["bytes"] / row["time_us"] / 1e3, rel_tol=1e-3, abs_tol=1e-6), row
        assert math.isclose(row["busbw_gbps"], row["algbw_gbps"] * 2 * (4 - 1) / 4, rel_tol=1e-3, abs_tol=2e-6), row
    assert doc["large_message_busbw_gbps"] == rows[-1]["busbw_gbps"]  # nothing reached 256 MiB
    assert "largest size measured (1 MiB)" in doc["basis"]

    done = finish(too_slow)
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert (doc["world_size"], doc["checks_ok"], doc["passed"]) == (2, True, False)
    assert [row["bytes"] for row in doc["rows"]] == [8 << i for i in range(14)]  # 8 B .. 64 KiB
    assert any(re.fullmatch(r"large-message busbw \S+ GB/s is below the expected 1e\+06 GB/s", note)
               for note in doc["notes"]), doc["notes"]
    error = [line for line in done.stderr.splitlines() if line.startswith("clusterkit: error: ")]
    assert len(error) == 1 and re.fullmatch(
        r"clusterkit: error: all-reduce sweep job \d+ busbw below 1000000 GB/s", error[0]), done.stderr
    assert "Traceback" not in done.stderr
