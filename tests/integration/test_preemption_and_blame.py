"""Jobs that keep training, round two, on the dev cluster's real Slurm configured as shared
clusters preempt (partition_prio, PreemptMode=REQUEUE, GraceTime=30 on debug and side,
their `-urgent` partitions over the same nodes) and with memory cgroups (task/cgroup).

Each fault is planted for real: an urgent job that preempts the chain, a rank that hangs
at the same place in every attempt, a rank the kernel's OOM killer ends inside `mem:`,
`scontrol requeue` after a node was blamed, an admin's drain mid-attempt, and
`clusterkit cancel` of a chain whose standby job waits. Where the chain completes, its
final weights are those of the run without a fault.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from jobcli import clusterkit, finish, read_until, start
from keeptrain import (
    CHAIN_TIMEOUT_S,
    assert_same_weights,
    chain_record,
    holding,
    job,
    log_of,
    requeue,
    side_profile,
    squeue_state,
    submit,
    training,
    wait_idle,
    wait_state,
)

pytestmark = pytest.mark.integration

AGAIN_S = 10  # from the urgent job's end to the chain's next attempt
# How long an ExcNodeList update of a requeued run may still be on its way to slurmctld
# once the job pends again (measured here: up to 4 s under the full test suite's load).
EXCLUDE_UPDATE_S = 8


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error" in line.lower()]


def sbatch(dev_cluster: Any, *args: str) -> str:
    done = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args], capture_output=True, text=True,
                          env=dev_cluster.slurm_env(), check=True)
    return done.stdout.strip().split(";")[0]


def gone_at(dev_cluster: Any, job_id: str, timeout: float = 120) -> float:
    """When the job left squeue (polled every 0.2 s)."""
    deadline = time.monotonic() + timeout
    while squeue_state(dev_cluster, job_id):
        assert time.monotonic() < deadline, f"job {job_id} is still in squeue"
        time.sleep(0.2)
    return time.time()


@pytest.mark.side_partition
def test_preemption_with_a_grace_time_requeues_resumes_and_completes_only_at_the_end(
        dev_cluster: Any, keep_folder: Path, side_reference_weights: Path) -> None:
    path = job(keep_folder, "ck-preempt", step_seconds=0.5, profile=side_profile(keep_folder))
    waiting = start(dev_cluster, "submit", str(path), "--no-preflight", "--wait")
    job_id = read_until(waiting, waiting.stdout, r"^\d+$").strip()
    training(keep_folder, job_id)
    urgent = sbatch(dev_cluster, "-p", "side-urgent", "-w", "s[1-2]", "-N", "2", "--exclusive", "-J", "ck-urgent",
                    "--wrap", "sleep 20")
    wait_state(dev_cluster, urgent, "RUNNING")
    assert waiting.poll() is None, "submit --wait ended while the chain was preempted"
    ended = gone_at(dev_cluster, urgent)
    record = chain_record(keep_folder, job_id)
    waited = finish(waiting, CHAIN_TIMEOUT_S)
    assert waited.returncode == 0, waited.stderr
    first, second = record["attempts"]
    assert first["ended"] == "preempted" and not first.get("culprit") and not first.get("excluded"), first
    assert first["why"] == "preemption: requeued without blame (1 of max_time_requeues 5)", first
    assert second["started_at"] - ended <= AGAIN_S, (second["started_at"] - ended)
    assert second["ended"] == "completed" and record["final"]["exit_code"] == 0, record
    assert "starts at step 0 " not in log_of(second)  # resumed from the checkpoint it saved on SIGTERM
    assert error_lines(log_of(second)) == []  # a supervised job that succeeds writes no error line
    diagnosed = json.loads(clusterkit(dev_cluster, "diagnose", job_id, "--json").stdout)
    assert [a["ended"] for a in diagnosed["attempts"]] == ["preempted", "completed"], diagnosed
    assert diagnosed["attempts"][1]["waited_s"] >= 10, diagnosed  # it waited for the urgent job
    assert_same_weights(keep_folder / "ck-preempt.weights", side_reference_weights)


def test_a_hang_at_the_same_place_in_every_attempt_ends_the_chain_as_the_scripts(
        dev_cluster: Any, keep_folder: Path) -> None:
    wait_idle(dev_cluster, "debug")
    path = job(keep_folder, "ck-hang-twice", "--plant", "any:hang:3:10", step_seconds=0.3,
               resilience={"spare_nodes": 2})
    waited = clusterkit(dev_cluster, "submit", str(path), "--no-preflight", "--wait", timeout=CHAIN_TIMEOUT_S)
    assert waited.returncode == 1, waited.stderr
    record = chain_record(keep_folder, waited.stdout.strip())
    first, second = record["attempts"]
    assert (first["ended"], second["ended"]) == ("hang", "hang"), record
    blamed = first["culprit"]["hosts"]
    assert first["culprit"]["kind"] == "node" and first["excluded"] == blamed, first
    assert second["culprit"]["kind"] == "program" and "excluded" not in second, second
    assert second["culprit"]["signature"] == first["culprit"]["signature"]
    assert record["exclude"] == blamed  # nothing more was excluded for the script's hang
    assert record["final"]["why"].startswith("the script hangs the same way on different nodes: rank 3 "), record
    assert "load_batch" in record["final"]["why"]
    advice = " ".join(json.loads(clusterkit(dev_cluster, "diagnose", waited.stdout.strip(), "--json").stdout)
                      ["advice"])
    assert "no node is to blame" in advice and "drain" not in advice, advice
    assert not (keep_folder / "ck-hang-twice.weights").exists()


@pytest.mark.side_partition
def test_a_rank_the_oom_killer_ends_is_a_program_error_and_excludes_no_node(
        dev_cluster: Any, keep_folder: Path, side_reference_weights: Path) -> None:
    path = job(keep_folder, "ck-oom", "--plant", "0:oom:3:6", profile=side_profile(keep_folder),
               slurm={"mem": "1500M"})
    record = chain_record(keep_folder, submit(dev_cluster, path))
    first, second = record["attempts"]
    assert first["ended"] == "crash" and first["culprit"]["kind"] == "program", first
    assert first["culprit"]["ranks"] == [3] and first["culprit"]["hosts"] == ["s2"], first
    assert "Out Of Memory (the job's memory: 1500M per node)" in first["culprit"]["evidence"], first
    assert "excluded" not in first and not record.get("exclude"), record
    assert "Detected 1 oom-kill event" in log_of(first)  # the kernel's OOM killer, as Slurm saw it
    assert second["ended"] == "completed" and record["final"]["exit_code"] == 0
    assert_same_weights(keep_folder / "ck-oom.weights", side_reference_weights)


def test_a_node_blamed_for_a_hang_stays_out_after_scontrol_requeue_and_logs_keep_every_attempt(
        dev_cluster: Any, keep_folder: Path, reference_weights: Path) -> None:
    wait_idle(dev_cluster, "debug")
    path = job(keep_folder, "ck-requeued-blame", "--plant", "0:hang:3:8", step_seconds=0.3,
               resilience={"spare_nodes": 1})
    with holding(dev_cluster, "n4"):  # n1-n3 are the only nodes: the requeued job gets n2 back
        job_id = submit(dev_cluster, path)
        training(keep_folder, job_id, attempt=1)
        requeue(dev_cluster, job_id)
        # The supervisor of the requeued run sets the chain's excluded nodes; an admin who
        # clears them once that run is gone gets n2 back into the job: its next attempt
        # leaves n2 out before training.
        time.sleep(EXCLUDE_UPDATE_S)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "ExcNodeList=", "StartTime=now"],
                       env=dev_cluster.slurm_env(), check=False, capture_output=True, timeout=60)  # (runs already)
        record = chain_record(keep_folder, job_id)
    endings = [a["ended"] for a in record["attempts"]]
    assert endings == ["hang", "preempted", "completed"], record
    first, _, last = record["attempts"]
    assert first["culprit"]["hosts"] == ["n2"] and record["exclude"] == ["n2"], first
    assert last["allocation"] == "n[1-3]" and last["nodes"] == "n[1,3]", last  # n2 left out before training
    assert "n2 was excluded by an earlier attempt: training without it (released n2)" in log_of(last)
    assert_same_weights(keep_folder / "ck-requeued-blame.weights", reference_weights)
    logs = clusterkit(dev_cluster, "logs", job_id)
    assert logs.returncode == 0, logs.stderr
    for number in range(3):  # the requeue appended to the output file the attempts share
        assert f"rank 0: attempt {number} starts at step" in logs.stdout, logs.stdout
    assert "attempt 0 ended: hang" in logs.stdout


@pytest.mark.side_partition
def test_an_admins_drain_mid_attempt_blames_no_node_and_the_job_completes(
        dev_cluster: Any, keep_folder: Path, side_reference_weights: Path) -> None:
    env = dev_cluster.slurm_env()
    job_id = submit(dev_cluster, job(keep_folder, "ck-drained", step_seconds=0.3, profile=side_profile(keep_folder)))
    training(keep_folder, job_id)
    subprocess.run(["scontrol", "update", "NodeName=s2", "State=DRAIN", "Reason=maintenance"], env=env, check=True)
    try:
        record = chain_record(keep_folder, job_id)
        state = subprocess.run(["sinfo", "-h", "-n", "s2", "-o", "%T|%E"], capture_output=True, text=True, env=env,
                               check=True).stdout.strip()
    finally:
        subprocess.run(["scontrol", "update", "NodeName=s2", "State=RESUME"], env=env, check=False)
    [only] = record["attempts"]
    assert only["ended"] == "completed" and not only.get("culprit") and not record.get("exclude"), record
    assert state in ("drained|maintenance", "draining|maintenance"), state  # the admin's drain stays as it was
    assert "s2 is draining (maintenance): the attempt goes on" in log_of(only)
    assert error_lines(log_of(only)) == []
    assert_same_weights(keep_folder / "ck-drained.weights", side_reference_weights)


@pytest.mark.side_partition
def test_cancel_of_a_chain_leaves_nothing_queued_not_even_its_standby_job(
        dev_cluster: Any, keep_folder: Path) -> None:
    job_id = submit(dev_cluster, job(keep_folder, "ck-cancelled", step_seconds=0.5,
                                     profile=side_profile(keep_folder)))
    record = training(keep_folder, job_id)
    standby = record["standby"]["job_id"]
    assert squeue_state(dev_cluster, standby) == "PENDING", record
    done = clusterkit(dev_cluster, "cancel", job_id)
    assert done.returncode == 0 and f"cancelled {job_id}" in done.stdout, done.stdout + done.stderr
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (squeue_state(dev_cluster, job_id) or squeue_state(dev_cluster, standby)):
        time.sleep(0.5)
    assert (squeue_state(dev_cluster, job_id), squeue_state(dev_cluster, standby)) == ("", ""), "left in squeue"
    record = chain_record(keep_folder, job_id, timeout=30)
    assert record["final"]["ended"] == "cancelled" and len(record["attempts"]) == 1, record
