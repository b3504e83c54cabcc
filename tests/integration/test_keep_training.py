"""Jobs that keep training, on the dev cluster's real Slurm: a 2-node x 2-rank gloo job
(examples/train_resilient.py, which checkpoints and resumes) under its supervisor.

Faults are planted for real: a rank that hangs in its data loader, a rank that
raises, the time limit, a node that dies mid-job (`scripts/dev-cluster fail`), and
a crash in every attempt until max_restarts is used up. Each run must end with the
weights of a run without faults (1e-5: DDP's first step after a restart buckets
differently).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from jobcli import REPO, cli_env, clusterkit, job_id_of, write_yaml
from keeptrain import (
    CHAIN_TIMEOUT_S,
    HANG_TIMEOUT_S,
    assert_same_weights,
    chain_record,
    hostnames,
    job,
    log_of,
    requeue,
    second_node,
    side_profile,
    submit,
    training,
    yaml_of,
)

pytestmark = pytest.mark.integration


def test_a_hung_rank_is_named_with_its_node_and_the_job_resumes_without_it(
        dev_cluster: Any, keep_folder: Path, reference_weights: Path) -> None:
    waited = clusterkit(dev_cluster, "submit", str(job(keep_folder, "ck-hang", "--plant", "0:hang:3:10")),
                        "--no-preflight", "--wait", "--json", timeout=CHAIN_TIMEOUT_S)
    assert waited.returncode == 0, waited.stderr  # --wait followed the chain to its completed attempt
    job_id = json.loads(waited.stdout)["job_id"]
    record = chain_record(keep_folder, job_id)
    assert "clusterkit: attempt 0 ended (hang: rank 3 is not in" in waited.stderr, waited.stderr
    assert f"restarted as job {record['attempts'][1]['slurm_job_id']} without" in waited.stderr
    status = json.loads(clusterkit(dev_cluster, "status", job_id, "--json").stdout)
    assert [a["ended"] for a in status["attempts"]] == ["hang", "completed"], status
    first, second = record["attempts"]
    culprit = second_node(dev_cluster, first["nodes"])  # ranks 2-3 run on the second node
    assert first["ended"] == "hang", first
    assert (first["culprit"]["ranks"], first["culprit"]["hosts"]) == ([3], [culprit]), first["culprit"]
    assert "load_batch" in first["culprit"]["evidence"], first["culprit"]
    assert "load_batch" in first["stacks"]["3"]
    assert first["detected_after_s"] <= HANG_TIMEOUT_S + 30, first
    assert first["excluded"] == [culprit] and first["next_job_id"] == second["slurm_job_id"]
    assert culprit not in subprocess.run(["scontrol", "show", "hostnames", second["nodes"]], capture_output=True,
                                         text=True, env=dev_cluster.slurm_env(), check=True).stdout.split()
    assert second["ended"] == "completed" and record["final"]["exit_code"] == 0
    assert "rank 0: attempt 1 starts at step 8 of" in log_of(second)  # the checkpoint before the hang
    assert_same_weights(keep_folder / "ck-hang.weights", reference_weights)


@pytest.mark.side_partition
def test_a_raised_rank_ends_the_attempt_at_once_and_is_named_but_no_node_is_blamed(
        dev_cluster: Any, keep_folder: Path, side_reference_weights: Path) -> None:
    job_id = submit(dev_cluster, job(keep_folder, "ck-raise", "--plant", "0:raise:2:6",
                                     profile=side_profile(keep_folder)))
    record = chain_record(keep_folder, job_id)
    first, second = record["attempts"]
    assert first["ended"] == "crash", first
    assert first["culprit"]["ranks"] == [2] and first["culprit"]["kind"] == "program"
    assert first["culprit"]["hosts"] == [second_node(dev_cluster, first["nodes"])]
    assert "RuntimeError: rank 2: planted fault at step 6" in first["culprit"]["evidence"], first
    raised = Path(keep_folder / f"clusterkit-{job_id}" / "attempt-0" / "exceptions" / "rank-2.txt").stat().st_mtime
    assert first["ended_at"] - raised < 10, (first["ended_at"], raised)  # not the collective timeout
    assert 0 <= first["detected_after_s"] < 10, first
    assert "excluded" not in first and not record.get("exclude")  # a program error is no node's fault
    assert second["ended"] == "completed" and record["final"]["exit_code"] == 0
    assert_same_weights(keep_folder / "ck-raise.weights", side_reference_weights)


@pytest.mark.side_partition
def test_the_time_limit_checkpoints_on_the_grace_signal_and_requeues_without_blame(
        dev_cluster: Any, keep_folder: Path, side_reference_weights: Path) -> None:
    # Slurm may send the grace signal up to 60 s early (sbatch --signal): with a 2-minute
    # limit and grace 40 it comes 20-80 s into an attempt, after the batch script set its
    # trap (1 minute and grace 40, which validate now refuses, was signalled as it started).
    job_id = submit(dev_cluster, job(keep_folder, "ck-limit", time_limit="00:02:00", step_seconds=2.0,
                                     resilience={"grace": 40, "max_restarts": 4},
                                     profile=side_profile(keep_folder)))
    record = chain_record(keep_folder, job_id, timeout=720)
    endings = [a["ended"] for a in record["attempts"]]
    assert endings[0] == "time_limit" and endings[-1] == "completed", endings
    assert set(endings[1:-1]) <= {"time_limit"}, endings
    assert not any(a.get("excluded") for a in record["attempts"])
    assert "stopped at step" in log_of(record["attempts"][0])  # it saved on the signal
    assert record["final"]["exit_code"] == 0
    assert_same_weights(keep_folder / "ck-limit.weights", side_reference_weights)


def test_a_node_failed_mid_job_is_excluded_and_the_job_completes(
        dev_cluster: Any, keep_folder: Path, reference_weights: Path) -> None:
    job_id = submit(dev_cluster, job(keep_folder, "ck-nodefail", step_seconds=0.5))
    record = training(keep_folder, job_id)
    victim = second_node(dev_cluster, record["attempts"][0]["nodes"])
    dev = str(REPO / "scripts" / "dev-cluster")
    subprocess.run([dev, "fail", victim], check=True, capture_output=True, timeout=60)
    try:
        record = chain_record(keep_folder, job_id)
    finally:
        subprocess.run([dev, "heal", victim], check=False, capture_output=True, timeout=120)
    first, second = record["attempts"][:2]
    assert first["ended"] == "node_failure" and first["culprit"]["hosts"] == [victim], first
    assert first["excluded"] == [victim] and victim not in second["nodes"]
    assert record["attempts"][-1]["ended"] == "completed" and record["final"]["exit_code"] == 0
    assert_same_weights(keep_folder / "ck-nodefail.weights", reference_weights)


@pytest.mark.side_partition
def test_a_requeue_by_slurm_goes_on_as_the_same_job_without_blame(
        dev_cluster: Any, keep_folder: Path, side_reference_weights: Path) -> None:
    job_id = submit(dev_cluster, job(keep_folder, "ck-requeue", step_seconds=0.5, profile=side_profile(keep_folder)))
    training(keep_folder, job_id)
    requeue(dev_cluster, job_id)
    record = chain_record(keep_folder, job_id)
    first, second = record["attempts"]
    assert (first["ended"], first["slurm_job_id"], second["slurm_job_id"]) == ("preempted", job_id, job_id), record
    assert first["why"] == ("preemption (or scontrol requeue): Slurm requeued the job, which runs again as itself "
                            "(1 of max_time_requeues 5)")
    assert not first.get("culprit") and not first.get("excluded") and "next_job_id" not in first
    assert second["ended"] == "completed" and record["final"]["exit_code"] == 0
    assert "attempt 1 starts at step 0 " not in log_of(second)  # it resumed from a checkpoint
    assert_same_weights(keep_folder / "ck-requeue.weights", side_reference_weights)


@pytest.mark.side_partition
def test_a_requeue_past_max_time_requeues_ends_the_chain_and_cancels_the_job(
        dev_cluster: Any, keep_folder: Path) -> None:
    job_id = submit(dev_cluster, job(keep_folder, "ck-requeue-out", step_seconds=0.5,
                                     resilience={"max_time_requeues": 0}, profile=side_profile(keep_folder)))
    training(keep_folder, job_id)
    requeue(dev_cluster, job_id)
    record = chain_record(keep_folder, job_id)
    assert [a["ended"] for a in record["attempts"]] == ["preempted"], record
    assert record["final"] == {"ended": "preempted", "exit_code": 1,
                               "why": "preemption (or scontrol requeue), and max_time_requeues (0) are used up"}
    deadline = time.monotonic() + 120
    queued = "?"
    while time.monotonic() < deadline and queued:
        queued = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                                env=dev_cluster.slurm_env(), check=False).stdout.strip()
        time.sleep(1)
    assert queued == "", f"job {job_id} is still queued after its chain ended: {queued}"
    assert len(json.loads((keep_folder / f"clusterkit-{job_id}" / "attempts.json").read_text())["attempts"]) == 1


def test_a_node_the_in_job_preflight_fails_is_blamed_before_training(
        dev_cluster: Any, keep_folder: Path) -> None:
    path = write_yaml(keep_folder / "ck-preflight.yaml", {
        **yaml_of(job(keep_folder, "ck-preflight")), "preflight": True})
    with dev_cluster.override("n2", "class/infiniband/mlx5_0/ports/1/state", "1: DOWN"):
        job_id = submit(dev_cluster, path)
        record = chain_record(keep_folder, job_id)
    first, second = record["attempts"]
    assert first["nodes"] == "n[1-2]", "Slurm placed attempt 0 away from n2, where the fault is planted"
    assert first["ended"] == "node_failure" and first["culprit"]["hosts"] == ["n2"], first
    assert "in-job preflight failed on n2" in first["culprit"]["evidence"]
    assert "rdma.port_state" in log_of(first)
    assert first["excluded"] == ["n2"] and "n2" not in hostnames(dev_cluster, second["nodes"])
    assert second["ended"] == "completed" and record["final"]["exit_code"] == 0


@pytest.mark.side_partition
def test_max_restarts_used_up_ends_the_chain_with_exit_1_and_nothing_queued(
        dev_cluster: Any, keep_folder: Path) -> None:
    # a crash, then a hang: two failures that are not the same error twice
    broken = job(keep_folder, "ck-broken", "--plant", "0:raise:0:2", "--plant", "1:hang:0:2",
                 resilience={"max_restarts": 1, "exclude": "never"}, profile=side_profile(keep_folder))
    waited = clusterkit(dev_cluster, "submit", str(broken), "--no-preflight", "--wait", timeout=CHAIN_TIMEOUT_S)
    assert waited.returncode == 1, waited.stderr  # the chain's exit, not the first attempt's
    job_id = job_id_of(waited)
    record = chain_record(keep_folder, job_id)
    diagnosed = clusterkit(dev_cluster, "diagnose", job_id, "--json")
    assert diagnosed.returncode == 0, diagnosed.stderr
    doc = json.loads(diagnosed.stdout)
    assert [a["ended"] for a in doc["attempts"]] == ["crash", "hang"]
    assert doc["attempts"][0]["culprit"]["ranks"] == [0]
    assert all(isinstance(a["started_at"], float) and a["ended_at"] > a["started_at"] for a in doc["attempts"])
    assert "max_restarts (1) are used up" in json.dumps(doc), doc
    assert [a["ended"] for a in record["attempts"]] == ["crash", "hang"]
    assert record["final"] == {"ended": "hang", "exit_code": 1,
                               "why": "a hang, and max_restarts (1) are used up"}
    assert "next_job_id" not in record["attempts"][-1]
    queued = subprocess.run(["squeue", "-h", "-n", "ck-broken"], capture_output=True, text=True,
                            env=dev_cluster.slurm_env(), check=True).stdout
    assert queued.strip() == ""


@pytest.mark.side_partition
def test_the_python_api_reads_the_output_of_every_attempt_through_a_restart(
        dev_cluster: Any, keep_folder: Path, tmp_path: Path) -> None:
    """A script submits with the Python API and follows the logs of a job whose rank 0
    raises in its first attempt (a program error: restarted in the same allocation, so both
    attempts write one output file, under one header): the restart resumed from the
    checkpoint, to the chain's end."""
    crashed = job(keep_folder, "ck-api-logs", "--plant", "0:raise:0:6", resilience={"exclude": "never"},
                  profile=side_profile(keep_folder))
    code = (f"import json, cluster_kit\njob = cluster_kit.submit({str(crashed)!r}, preflight=False)\n"
            "print(json.dumps({'id': job.id, 'lines': list(job.logs(follow=True, poll=1))}))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True, capture_output=True, check=False,
                          env=cli_env(dev_cluster, XDG_STATE_HOME=str(tmp_path), PYTHONPATH=str(REPO)),
                          timeout=CHAIN_TIMEOUT_S)
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    record = chain_record(keep_folder, out["id"])
    first, second = record["attempts"]
    assert (first["ended"], second["ended"]) == ("crash", "completed"), record
    lines = out["lines"]
    headers = [n for n, line in enumerate(lines) if line.startswith("==> attempt")]
    # a program error restarts in the same allocation: both attempts write one file
    assert first["slurm_job_id"] == second["slurm_job_id"] and first["output"] == second["output"]
    # followed live: the file's header again once the restart is in the record
    assert [lines[n] for n in headers] == [f"==> attempt 0: job {first['slurm_job_id']}: {first['output']} <==\n",
                                           f"==> attempts 0,1: job {first['slurm_job_id']}: {first['output']} <==\n"]
    text = "".join(lines)
    assert text.index("rank 0: attempt 0 starts at step 0 of 48\n") < text.index("rank 0: planted fault at step 6") \
        < text.index("rank 0: attempt 1 starts at step ") < text.index("rank 0: trained 48 steps\n")
    assert lines[-1] != ""
