"""Jobs that keep training, done right, on the dev cluster's real Slurm: nobody else's
script runs, the right node is blamed where host names are not Slurm names, a bug in
the script is not a node, the time limit requeues a script that ignores the grace
signal, a node Slurm marks DOWN ends the attempt within seconds, and a long save
inside ddp.paused is no hang. Every fault is planted for real: another local user
(`ckuser`), a node whose host name differs (n4), a Slurm time limit, `scontrol update
State=DOWN`.
"""
from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from jobcli import clusterkit, job_id_of
from keeptrain import (
    HANG_TIMEOUT_S,
    assert_same_weights,
    chain_record,
    holding,
    hostnames,
    job,
    log_of,
    record_path,
    second_node,
    side_profile,
    submit,
    training,
)

pytestmark = pytest.mark.integration


def as_ckuser(dev_cluster: Any, code: str) -> None:
    subprocess.run(["runuser", "-u", dev_cluster.user, "--", "/usr/bin/python3", "-c", textwrap.dedent(code)],
                   check=True, capture_output=True, text=True, timeout=60)


def next_job_id(dev_cluster: Any) -> int:
    """The id Slurm gives the next job (a held job, submitted and cancelled)."""
    done = subprocess.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"],
                          capture_output=True, text=True, env=dev_cluster.slurm_env(), check=True)
    held = done.stdout.strip().split(";")[0]
    subprocess.run(["scancel", held], env=dev_cluster.slurm_env(), check=True)
    return int(held) + 1


def test_a_chain_folder_planted_by_another_user_runs_nothing_of_theirs(dev_cluster: Any, keep_folder: Path) -> None:
    logs = keep_folder / "shared-logs"
    logs.mkdir()
    logs.chmod(0o1777)  # a project log folder every user writes into
    owned = logs / "owned-by-ckuser"
    first = next_job_id(dev_cluster)
    # ckuser guesses the next job ids: a folder for each, their script, and a record
    # that would send followers to a job of theirs.
    as_ckuser(dev_cluster, f"""
        import json, os
        for job in range({first}, {first} + 20):
            folder = "{logs}/clusterkit-%d" % job
            os.mkdir(folder)
            os.chmod(folder, 0o777)
            with open(folder + "/job.sbatch", "w") as f:
                f.write("#!/bin/bash\\ntouch {owned}\\n")
            with open(folder + "/attempts.json", "w") as f:
                json.dump({{"format": "clusterkit.attempts/1", "job_id": str(job), "resilience": {{}},
                           "attempts": [{{"attempt": 0, "slurm_job_id": str(job), "ended": "crash",
                                          "next_job_id": "1"}}], "final": None}}, f)
            os.chmod(folder + "/attempts.json", 0o666)
    """)
    path = job(keep_folder, "ck-planted", "--plant", "0:raise:1:3", output=f"{logs}/%x-%j.out")
    waited = clusterkit(dev_cluster, "submit", str(path), "--no-preflight", "--wait", timeout=300)
    job_id = job_id_of(waited)
    assert first <= int(job_id) < first + 20, (first, job_id)
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "restarted as job" not in waited.stderr and "attempt 0 ended" not in waited.stderr, waited.stderr
    output = (logs / f"ck-planted-{job_id}.out").read_text()
    folder = logs / f"clusterkit-{job_id}"
    owner = folder.stat().st_uid
    assert (f"clusterkit supervisor: {folder} belongs to {dev_cluster.user} (uid {owner}), not to the job's user "
            "(root (uid 0)): the supervisor uses only folders of the job's own user that nobody else can write; remove it (or have its owner remove "
            "it), or set `output:` to a folder only you can write, and submit again") in output, output
    assert "starts at step" not in output  # nothing was trained, and nothing of theirs ran
    time.sleep(3)
    assert not owned.exists()
    assert json.loads((folder / "attempts.json").read_text())["attempts"][0]["next_job_id"] == "1"  # untouched


def test_a_hang_on_a_node_whose_host_name_is_not_its_slurm_name_excludes_that_node(
        dev_cluster: Any, keep_folder: Path, reference_weights: Path) -> None:
    with holding(dev_cluster, "n[1-2]"):  # so that the job gets n3 and n4
        job_id = submit(dev_cluster, job(keep_folder, "ck-fqdn", "--plant", "0:hang:3:10"))
        first = training(keep_folder, job_id)["attempts"][0]
    assert first["nodes"] == "n[3-4]", first
    beat = (keep_folder / f"clusterkit-{job_id}" / "attempt-0" / "heartbeat" / "rank-3").read_text().split()
    assert beat[2] == "n4"  # the Slurm name, where hostname says ip-10-0-1-4.ckdev.internal
    record = chain_record(keep_folder, job_id)
    first, second = record["attempts"]
    assert first["ended"] == "hang" and first["culprit"]["hosts"] == ["n4"], first
    assert first["culprit"]["ranks"] == [3] and first["culprit"]["kind"] == "node"
    assert first["excluded"] == ["n4"] and "n4" not in hostnames(dev_cluster, second["nodes"])
    assert second["ended"] == "completed" and record["final"]["exit_code"] == 0
    assert_same_weights(keep_folder / "ck-fqdn.weights", reference_weights)


@pytest.mark.side_partition
def test_the_same_exception_in_two_attempts_ends_the_chain_without_blaming_a_node(
        dev_cluster: Any, keep_folder: Path) -> None:
    job_id = submit(dev_cluster, job(keep_folder, "ck-bug", "--plant", "any:raise:1:6",
                                     resilience={"max_restarts": 3}, profile=side_profile(keep_folder)))
    record = chain_record(keep_folder, job_id)
    first, second = record["attempts"]
    assert (first["ended"], second["ended"]) == ("crash", "crash"), record
    for attempt in (first, second):
        assert attempt["culprit"]["kind"] == "program" and attempt["culprit"]["ranks"] == [1], attempt
        assert attempt["culprit"]["error"] == "RuntimeError: rank 1: planted fault at step 6"
        assert not attempt.get("excluded")
    assert second["nodes"] == first["nodes"]  # restarted in place: a bug is no node's fault
    assert not record.get("exclude")
    assert record["final"]["exit_code"] == 1
    assert record["final"]["why"].startswith(
        "the script fails the same way twice: RuntimeError: rank 1: planted fault at step 6 at train_resilient.py:"), \
        record["final"]
    assert record["final"]["why"].endswith(f"(attempts 0 and 1 on {hostnames(dev_cluster, first['nodes'])[0]})")
    assert "next_job_id" not in second


@pytest.mark.side_partition
def test_a_script_that_ignores_the_grace_signal_is_requeued_at_its_time_limit(
        dev_cluster: Any, keep_folder: Path, side_reference_weights: Path) -> None:
    job_id = submit(dev_cluster, job(keep_folder, "ck-ignore", "--ignore-stop", time_limit="00:02:00",
                                     step_seconds=3.0, resilience={"grace": 40}, profile=side_profile(keep_folder)))
    record = chain_record(keep_folder, job_id, timeout=600)
    endings = [a["ended"] for a in record["attempts"]]
    assert endings[0] == "time_limit" and endings[-1] == "completed", endings
    first = record["attempts"][0]
    assert first["why"].startswith("the time limit: requeued without blame"), first
    assert "next_job_id" in first and not any(a.get("excluded") for a in record["attempts"])
    assert "stopped at step" not in log_of(first)  # it never looked at stop_requested()
    assert "DUE TO TIME LIMIT" in log_of(first)
    assert record["final"]["exit_code"] == 0
    assert_same_weights(keep_folder / "ck-ignore.weights", side_reference_weights)


GATE_REASON = "clusterkit: gpu.ecc: GPU 2 has 2 uncorrected volatile ECC errors"


@pytest.mark.parametrize(("state", "reason", "said"), [
    ("DOWN", "ck-test", "failed"), ("DRAIN", GATE_REASON, f"is draining ({GATE_REASON})")])
def test_a_node_slurm_marks_down_or_the_health_gate_drains_mid_attempt_ends_it_within_seconds(
        dev_cluster: Any, keep_folder: Path, reference_weights: Path, state: str, reason: str, said: str) -> None:
    """DOWN: Slurm ends the step on the node at once (and, the node's slurmd answering,
    returns it to service: ReturnToService=2). DRAIN by clusterkit's health gate (its
    reason starts with `clusterkit:`; an admin's drain is no fault of the attempt):
    nothing stops the step but the supervisor, which reads the nodes' states every 5 s."""
    name = f"ck-{state.lower()}"
    job_id = submit(dev_cluster, job(keep_folder, name, step_seconds=0.5))
    victim = second_node(dev_cluster, training(keep_folder, job_id)["attempts"][0]["nodes"])
    env = dev_cluster.slurm_env()
    changed = time.time()
    subprocess.run(["scontrol", "update", f"NodeName={victim}", f"State={state}", f"Reason={reason}"], env=env,
                   check=True)
    try:
        record = chain_record(keep_folder, job_id)
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={victim}", "State=RESUME"], env=env, check=False,
                       capture_output=True)
    first, second = record["attempts"][:2]
    assert first["ended"] == "node_failure" and first["culprit"]["hosts"] == [victim], first
    assert f"{victim} {said}" in first["culprit"]["evidence"], first
    assert first["ended_at"] - changed <= 15, (first["ended_at"] - changed, first)
    assert first["excluded"] == [victim] and victim not in hostnames(dev_cluster, second["nodes"])
    assert record["attempts"][-1]["ended"] == "completed" and record["final"]["exit_code"] == 0
    assert_same_weights(keep_folder / f"{name}.weights", reference_weights)


@pytest.mark.side_partition
def test_a_save_longer_than_hang_timeout_inside_paused_is_no_hang(
        dev_cluster: Any, keep_folder: Path, side_reference_weights: Path) -> None:
    job_id = submit(dev_cluster, job(keep_folder, "ck-slow-save", "--slow-save", f"8:{2 * HANG_TIMEOUT_S}",
                                     profile=side_profile(keep_folder)))
    record = chain_record(keep_folder, job_id)
    assert [a["ended"] for a in record["attempts"]] == ["completed"], record
    attempt = record["attempts"][0]
    assert attempt["ended_at"] - attempt["started_at"] > 2 * HANG_TIMEOUT_S  # the pause outlasted hang_timeout
    assert_same_weights(keep_folder / "ck-slow-save.weights", side_reference_weights)


def test_cancel_of_the_first_job_ends_the_chain_where_it_runs_now(dev_cluster: Any, keep_folder: Path) -> None:
    # a segmentation fault (a node's fault) with no spare: the next attempt is a new job
    job_id = submit(dev_cluster, job(keep_folder, "ck-cancel", "--plant", "0:segv:3:4", step_seconds=1.0))
    deadline = time.monotonic() + 180
    while True:
        record = json.loads(record_path(keep_folder, job_id).read_text()) \
            if record_path(keep_folder, job_id).exists() else {"attempts": []}
        if len(record["attempts"]) == 2:
            break
        assert time.monotonic() < deadline, record
        time.sleep(1)
    current = record["attempts"][1]["slurm_job_id"]
    done = clusterkit(dev_cluster, "cancel", job_id)
    assert done.returncode == 0, done.stderr
    standby = record["standby"]["job_id"]  # the current job's: it would take over once that one ended
    assert done.stdout.splitlines() == [f"cancelled {standby} (the standby job of job {job_id}'s chain)",
                                        f"job {job_id} had already ended",
                                        f"cancelled {current} (the chain of job {job_id} ran as it)"]
    record = chain_record(keep_folder, job_id, timeout=60)
    assert record["attempts"][-1]["ended"] == "cancelled" and record["final"]["ended"] == "cancelled", record
    assert os.path.exists(record_path(keep_folder, job_id))
