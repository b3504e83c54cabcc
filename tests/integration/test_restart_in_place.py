"""Restarts inside the allocation, on the dev cluster's real Slurm, on a busy partition.

A 2-node x 2-rank job with `resilience: {spare_nodes: 1}` holds three of the four
nodes (n1-n3; its batch script runs on n1) while another job waits for two whole
nodes the whole time. A crash of a rank (a segmentation fault: a node's fault), a
hang and a node failed mid-job each end the attempt; the next one is a new step of
the same job on the spare n3 in place of the blamed n2, which goes back to Slurm.
When the batch script's own node fails, the standby job takes the chain over.
"""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from jobcli import REPO
from keeptrain import (
    assert_same_weights,
    chain_record,
    hostnames,
    job,
    squeue_state,
    submit,
    training,
    wait_idle,
    wait_state,
)

pytestmark = pytest.mark.integration

RESTART_S = 10  # from the end of the failed attempt to the new step


@pytest.fixture(autouse=True)
def debug_idle(dev_cluster: Any) -> None:
    """Each test names the nodes it expects (n1-n3): none is still held by the one before."""
    wait_idle(dev_cluster, "debug")


@contextmanager
def busy(dev_cluster: Any) -> Iterator[str]:
    """Another user's job that waits (Resources) for two whole nodes while the block runs."""
    done = subprocess.run(["sbatch", "--parsable", "-N", "2", "--exclusive", "-J", "ck-waiting", "-o", "/dev/null",
                           "--wrap", "sleep 30"], capture_output=True, text=True, env=dev_cluster.slurm_env(),
                          check=True)
    waiting = done.stdout.strip().split(";")[0]
    try:
        wait_state(dev_cluster, waiting, "PENDING", timeout=60)
        yield waiting
    finally:
        subprocess.run(["scancel", waiting], env=dev_cluster.slurm_env(), check=False)
        wait_state(dev_cluster, waiting, "")  # it may have started once the job under test ended


def spare_job(folder: Path, name: str, *args: str, spares: int = 1) -> Path:
    return job(folder, name, *args, step_seconds=0.3, resilience={"spare_nodes": spares})


def assert_restarted_on_the_spare(dev_cluster: Any, record: dict[str, Any], job_id: str, ended: str) -> None:
    first, second = record["attempts"]
    assert (first["slurm_job_id"], second["slurm_job_id"]) == (job_id, job_id), record  # the same job
    assert first["nodes"] == "n[1-2]" and second["nodes"] == "n[1,3]", record
    assert first["ended"] == ended and first["culprit"]["hosts"] == ["n2"], first
    assert first["excluded"] == ["n2"] and first["released"] == ["n2"], first
    assert first["step"] != second["step"] and second["step"].startswith(f"{job_id}."), record
    assert f"restarted in job {job_id} on n[1,3] (n3 in place of n2)" in first["why"], first
    assert second["started_at"] - first["ended_at"] <= RESTART_S, (second["started_at"] - first["ended_at"])
    assert "next_job_id" not in first and second["ended"] == "completed", record
    assert record["final"]["exit_code"] == 0


@pytest.mark.parametrize(("name", "plant", "ended", "spares"), [
    ("ck-spare-segv", "0:segv:3:8", "crash", 1),
    # two spares: the allocation is the whole partition, and the blamed node still leaves
    ("ck-spare-hang", "0:hang:3:8", "hang", 2),
])
def test_a_fault_restarts_in_the_same_allocation_on_the_spare(dev_cluster: Any, keep_folder: Path,
                                                              reference_weights: Path, name: str, plant: str,
                                                              ended: str, spares: int) -> None:
    job_id = submit(dev_cluster, spare_job(keep_folder, name, "--plant", plant, spares=spares))
    training(keep_folder, job_id)
    with busy(dev_cluster):  # the partition is busy when the fault comes
        training(keep_folder, job_id, attempt=1)
        held = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True,
                              env=dev_cluster.slurm_env(), check=True).stdout.strip()
        record = chain_record(keep_folder, job_id)
    assert held and "n2" not in hostnames(dev_cluster, held), held  # handed back while the job runs on
    assert_restarted_on_the_spare(dev_cluster, record, job_id, ended)
    assert_same_weights(keep_folder / f"{name}.weights", reference_weights)


def test_a_node_failed_mid_job_restarts_on_the_spare(
        dev_cluster: Any, keep_folder: Path, reference_weights: Path) -> None:
    job_id = submit(dev_cluster, spare_job(keep_folder, "ck-spare-node"))
    training(keep_folder, job_id)
    dev = str(REPO / "scripts" / "dev-cluster")
    try:
        with busy(dev_cluster):
            subprocess.run([dev, "fail", "n2"], check=True, capture_output=True, timeout=60)
            record = chain_record(keep_folder, job_id)
    finally:
        subprocess.run([dev, "heal", "n2"], check=False, capture_output=True, timeout=120)
    assert_restarted_on_the_spare(dev_cluster, record, job_id, "node_failure")
    assert_same_weights(keep_folder / "ck-spare-node.weights", reference_weights)


def test_the_batch_scripts_node_failed_and_the_standby_job_goes_on(
        dev_cluster: Any, keep_folder: Path, reference_weights: Path) -> None:
    job_id = submit(dev_cluster, spare_job(keep_folder, "ck-spare-batch"))
    record = training(keep_folder, job_id)
    standby = record["standby"]
    assert standby["after"] == job_id and squeue_state(dev_cluster, standby["job_id"]) == "PENDING", record
    dev = str(REPO / "scripts" / "dev-cluster")
    subprocess.run([dev, "fail", "n1"], check=True, capture_output=True, timeout=60)  # the batch script's node
    try:
        record = chain_record(keep_folder, job_id)
    finally:
        subprocess.run([dev, "heal", "n1"], check=False, capture_output=True, timeout=120)
    first, second = record["attempts"][:2]
    assert first["ended"] == "node_failure" and first["culprit"]["hosts"] == ["n1"], first
    assert first["why"] == f"its batch script was killed (job {standby['job_id']} took over)"
    assert second["slurm_job_id"] == standby["job_id"] and "n1" not in hostnames(dev_cluster, second["nodes"])
    assert record["attempts"][-1]["ended"] == "completed" and record["final"]["exit_code"] == 0
    assert not record.get("standby") and squeue_state(dev_cluster, standby["job_id"]) in ("", "RUNNING")
    assert_same_weights(keep_folder / "ck-spare-batch.weights", reference_weights)
