"""`clusterkit bench allreduce --find-slow` on the dev cluster's three Slurm nodes, with one
node slowed: every timed all-reduce on n2 first waits 20 ms (the sweep's
CLUSTERKIT_SWEEP_SLOW_HOST test hook, set through the job's env). One run on n1-n3, then
the three pairs: the two pairs with n2 are slow, n1+n3 is not, so n2 is named."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jobcli import REPO, finish, start, write_yaml

pytestmark = pytest.mark.integration


def test_the_slowed_node_is_named_with_each_runs_busbw(dev_cluster: Any, tmp_path: Path) -> None:
    job = yaml.safe_load((REPO / "examples" / "cpu-ddp.yaml").read_text())
    job.update(name="ck-find-slow", nodes=3, gpus_per_node=1, output=f"{tmp_path}/%x-%j.out",
               env={"OMP_NUM_THREADS": "1", "CLUSTERKIT_SWEEP_SLOW_HOST": "n2", "CLUSTERKIT_SWEEP_SLOW_S": "0.02"})
    path = write_yaml(tmp_path / "find-slow.yaml", job)
    done = finish(start(dev_cluster, "bench", "allreduce", str(path), "--find-slow", "--max-bytes", "64K", "--json"),
                  timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    doc = json.loads(done.stdout)
    assert doc["culprits"] == ["n2"]
    assert [(run["step"], sorted(run["nodes"])) for run in doc["runs"]] == [
        ("all", ["n1", "n2", "n3"]), ("pair", ["n1", "n2"]), ("pair", ["n1", "n3"]), ("pair", ["n2", "n3"])]
    assert [run["slow"] for run in doc["runs"][1:]] == [True, False, True]
    assert all(run["busbw_gbps"] > 0 and run["job_id"] for run in doc["runs"])
    fast = doc["runs"][2]["busbw_gbps"]
    assert doc["runs"][1]["busbw_gbps"] < 0.8 * fast and doc["runs"][3]["busbw_gbps"] < 0.8 * fast
    progress = [line for line in done.stderr.splitlines() if line.startswith("run ")]
    assert len(progress) == 4 and progress[0].startswith("run 1: n1,n2,n3: ")
    assert "clusterkit: error: slow all-reduce: n2" in done.stderr


def test_a_first_run_that_fails_stops_the_search_with_its_log(dev_cluster: Any, tmp_path: Path) -> None:
    """A sweep that cannot run (here: its python exits 1 at once) is not a slow node."""
    job = yaml.safe_load((REPO / "examples" / "cpu-ddp.yaml").read_text())
    job.update(name="ck-find-fail", nodes=3, gpus_per_node=1, output=f"{tmp_path}/%x-%j.out",
               environment={"python": "/bin/false"})
    path = write_yaml(tmp_path / "find-fail.yaml", job)
    done = finish(start(dev_cluster, "bench", "allreduce", str(path), "--find-slow", "--max-bytes", "64K"),
                  timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "slow all-reduce" not in done.stderr
    first = re.search(r"the first all-reduce run \(job (\d+), all the job's nodes\) failed", done.stderr)
    assert first, done.stderr
    assert f"fix: read its log: clusterkit logs {first.group(1)}" in done.stderr
