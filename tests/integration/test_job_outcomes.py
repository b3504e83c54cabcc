"""How jobs end, on the dev cluster's real Slurm: what `submit --wait`, `status`,
`logs` and `cancel` say of a raised rank, a time limit, an array with a failed
task, a job Slurm forgot, a held job, and a node that stopped responding.

Every job here asks for no GPUs, so none queues behind the examples. Each test
gives clusterkit its own XDG_STATE_HOME, so the job records it reads are the
ones its own submits wrote.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobcli import (
    REPO,
    cli_env,
    clusterkit,
    cpu_profile,
    finish,
    job_id_of,
    scancel,
    shared_dir,
    start,
    write_yaml,
)

from cluster_kit.lifecycle import records

pytestmark = pytest.mark.integration

TIMEOUT = 240

# stdlib only: rank $CK_FAIL_RANK (default 3; array task 0) exits $CK_FAIL_CODE
# (default 1) at once, the others sleep.
FAILER_PY = """\
import os, sys, time
rank = int(os.environ.get("RANK", "0"))
task = os.environ.get("SLURM_ARRAY_TASK_ID")
print("ck-failer rank=%d task=%s" % (rank, task), flush=True)
if (task is None and rank == int(os.environ.get("CK_FAIL_RANK", "3"))) or task == "0":
    sys.exit(int(os.environ.get("CK_FAIL_CODE", "1")))
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


@pytest.fixture()
def folder() -> Iterator[Path]:
    with shared_dir("ck-outcome-") as path:
        yield path


@pytest.fixture()
def env(dev_cluster: Any, folder: Path) -> dict[str, str]:
    state = folder / "state"
    state.mkdir()
    return cli_env(dev_cluster, XDG_STATE_HOME=str(state))


def write_job(folder: Path, dev_cluster: Any, name: str, partition: str = "debug", **keys: Any) -> Path:
    """A job of the failer script on two nodes of `partition` (cpu_profile's)."""
    profile = write_yaml(folder / "ck-cpu.yaml", cpu_profile(dev_cluster, partition))
    script = folder / "failer.py"
    script.write_text(FAILER_PY)
    job = {"name": name, "profile": str(profile), "nodes": 1, "script": str(script),
           "output": f"{folder}/%x-%j.out", "preflight": False, **keys}
    return write_yaml(folder / f"{name}.yaml", job)


def squeue_states(dev_cluster: Any, job_id: str) -> str:
    done = subprocess.run(["squeue", "-h", "--states=all", f"--jobs={job_id}", "-o", "%T"],
                          capture_output=True, text=True, env=dev_cluster.slurm_env(), check=False)
    return done.stdout


def test_a_rank_that_raises_is_named_with_its_node_and_own_exit_code(
        dev_cluster: Any, folder: Path, env: dict[str, str]) -> None:
    job = write_job(folder, dev_cluster, "ck-raise", nodes=2, args=["60"],
                    slurm={"ntasks_per_node": 2}, env={"CK_FAIL_CODE": "7"})
    began = time.monotonic()
    done = clusterkit(dev_cluster, "submit", str(job), "--wait", "--no-preflight", env=env)
    job_id = job_id_of(done)
    assert time.monotonic() - began < 60  # srun stopped the sleeping ranks at once
    # srun exits 143 after it terminated the other ranks; the sentence says who failed.
    assert done.returncode == 143, done.stderr
    assert (f"job {job_id} finished with exit code 143: FAILED; first failure: "
            "rank 3 on n2 exited with exit code 7") in done.stderr
    status = clusterkit(dev_cluster, "status", job_id, "--json", env=env)
    doc = json.loads(status.stdout)
    assert doc["outcome"]["first_failure"] == {"node": "n2", "tasks": [3], "what": "Exited with exit code 7",
                                               "exit_code": 7}
    assert doc["state"] == "FAILED" and doc["exit_status"] == 143
    diagnosed = json.loads(clusterkit(dev_cluster, "diagnose", job_id, "--json", env=env).stdout)
    attempt = diagnosed["attempts"][0]
    assert (diagnosed["state"], attempt["ended"], attempt["nodes"]) == ("FAILED", "crash", "n[1-2]")
    assert attempt["culprit"]["ranks"] == [3] and attempt["culprit"]["hosts"] == ["n2"]
    assert attempt["culprit"]["evidence"].startswith("rank 3 on n2 exited with exit code 7")


@pytest.mark.side_partition
def test_the_time_limit_reads_as_timeout(dev_cluster: Any, folder: Path, env: dict[str, str]) -> None:
    job = write_job(folder, dev_cluster, "ck-timeout", partition="side", time="00:01:00", args=["600"],
                    env={"CK_FAIL_CODE": "0"})
    done = clusterkit(dev_cluster, "submit", str(job), "--wait", "--no-preflight", "--json", env=env,
                      timeout=TIMEOUT)
    doc = json.loads(done.stdout)  # printed once, after the job ended
    assert done.returncode != 0 and doc["state"] == "TIMEOUT", done.stderr
    assert doc["exit_code"] == done.returncode and doc["output"].endswith(f"ck-timeout-{doc['job_id']}.out")
    assert f"job {doc['job_id']} finished with exit code {done.returncode}: TIMEOUT (reached its time limit)" \
        in done.stderr


def test_an_array_job_with_a_failed_task_fails_and_shows_every_task(
        dev_cluster: Any, folder: Path, env: dict[str, str]) -> None:
    job = write_job(folder, dev_cluster, "ck-array", output=f"{folder}/%x-%A_%a.out",
                    slurm={"sbatch": {"array": "0-2"}})
    done = clusterkit(dev_cluster, "submit", str(job), "--wait", "--no-preflight", env=env, timeout=TIMEOUT)
    job_id = job_id_of(done)
    assert done.returncode == 1, done.stderr
    assert (f"array job {job_id}: 1 of 3 task(s) did not complete; job {job_id}_0 finished with "
            "exit code 1: FAILED") in done.stderr
    doc = json.loads(clusterkit(dev_cluster, "status", job_id, "--json", env=env).stdout)
    assert [(t["job_id"], t["state"]) for t in doc["tasks"]] == [
        (f"{job_id}_0", "FAILED"), (f"{job_id}_1", "COMPLETED"), (f"{job_id}_2", "COMPLETED")]
    logs = clusterkit(dev_cluster, "logs", job_id, env=env)
    assert logs.returncode == 0, logs.stderr
    for task in range(3):
        assert f"==> {job_id}_{task}: {folder}/ck-array-{job_id}_{task}.out <==" in logs.stdout
        assert f"ck-failer rank=0 task={task}" in logs.stdout


def test_logs_and_status_read_the_record_once_slurm_forgot_the_job(
        dev_cluster: Any, folder: Path, env: dict[str, str]) -> None:
    job = write_job(folder, dev_cluster, "ck-forgot", env={"CK_FAIL_CODE": "0"})
    done = clusterkit(dev_cluster, "submit", str(job), "--wait", "--no-preflight", env=env)
    assert done.returncode == 0, done.stderr
    job_id = job_id_of(done)
    # Slurm forgets an ended job after MinJobAge (300 s here): its record stays.
    # The same record under an id this Slurm never had stands for that moment.
    state = Path(env["XDG_STATE_HOME"]) / "clusterkit" / "jobs"
    record = records.find(job_id, "local", state)
    assert record is not None and record.ended and record.ended["state"] == "COMPLETED"
    gone = "987001"
    assert "Invalid job id" in subprocess.run(["scontrol", "show", "job", gone], check=False, capture_output=True,
                                              text=True, env=dev_cluster.slurm_env()).stderr
    record.job_id, record.outputs = gone, {gone: record.outputs[job_id]}
    records.save(record, state)

    logs = clusterkit(dev_cluster, "logs", gone, env=env)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.startswith("ck-failer rank=0"), logs.stdout
    status = clusterkit(dev_cluster, "status", gone, env=env)
    assert status.returncode == 0, status.stderr
    assert f"Slurm no longer knows job {gone}; shown from clusterkit's record" in status.stderr
    assert "COMPLETED" in status.stdout and "record" in status.stdout


def test_a_held_job_logs_no_output_yet_and_cancel_takes_several_ids(
        dev_cluster: Any, folder: Path, env: dict[str, str]) -> None:
    ids = []
    for name in ("ck-held-a", "ck-held-b"):
        job = write_job(folder, dev_cluster, name, slurm={"sbatch": {"hold": True}})
        ids.append(job_id_of(clusterkit(dev_cluster, "submit", str(job), "--no-preflight", env=env)))
    try:
        logs = clusterkit(dev_cluster, "logs", ids[0], env=env)
        assert logs.returncode == 0 and logs.stdout == "", logs.stderr
        assert f"job {ids[0]}: PENDING (JobHeldUser): no output yet" in logs.stderr
        cancelled = clusterkit(dev_cluster, "cancel", *ids, env=env)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout == "".join(f"cancelled {job_id}\n" for job_id in ids)
    finally:
        for job_id in ids:
            scancel(dev_cluster, job_id)


def test_logs_follow_of_a_failed_job_ends_with_its_state_and_exit_code(
        dev_cluster: Any, folder: Path, env: dict[str, str]) -> None:
    job = write_job(folder, dev_cluster, "ck-follow-fail", env={"CK_FAIL_CODE": "5", "CK_FAIL_RANK": "0"})
    job_id = job_id_of(clusterkit(dev_cluster, "submit", str(job), "--no-preflight", env=env))
    followed = clusterkit(dev_cluster, "logs", "-f", job_id, env=env)
    assert followed.returncode == 5, followed.stderr
    assert followed.stdout.startswith("ck-failer rank=0")
    assert followed.stderr.splitlines()[-1] == (
        f"job {job_id} finished with exit code 5: FAILED; first failure: rank 0 on n1 exited with exit code 5")


# ---------------------------------------------------------------- a node that does not answer


def slurmd_pid(dev_cluster: Any, node: str) -> int:
    return int((dev_cluster.state_dir / "run" / f"slurmd-{node}.pid").read_text().strip())


def node_state(dev_cluster: Any, node: str) -> str:
    done = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-p", "debug", "-o", "%T"], capture_output=True,
                          text=True, env=dev_cluster.slurm_env(), check=True)
    return done.stdout.strip()  # (one partition: the node is in debug-urgent too)


@pytest.fixture()
def n2_not_responding(dev_cluster: Any) -> Iterator[None]:
    """n2 drained and resumed while its slurmd does not answer: `idle*` (then
    `down*` after SlurmdTimeout); it answers again afterwards."""
    pid = slurmd_pid(dev_cluster, "n2")
    scontrol = ["scontrol", "update", "NodeName=n2"]
    slurm_env = dev_cluster.slurm_env()
    os.kill(pid, signal.SIGSTOP)
    try:
        subprocess.run([*scontrol, "State=DOWN", "Reason=ck-test not responding"], check=True, env=slurm_env)
        subprocess.run([*scontrol, "State=RESUME"], check=True, env=slurm_env)
        assert node_state(dev_cluster, "n2").endswith("*")
        yield
    finally:  # a fresh slurmd registers at once (the woken one waits for Slurm's next ping)
        subprocess.run([str(REPO / "scripts" / "dev-cluster"), "heal", "n2"], check=False, capture_output=True,
                       timeout=120)
        assert node_state(dev_cluster, "n2") == "idle"


def test_a_node_submit_did_not_check_never_receives_the_job(
        dev_cluster: Any, folder: Path, env: dict[str, str], n2_not_responding: None) -> None:
    one = write_job(folder, dev_cluster, "ck-unchecked", env={"CK_FAIL_CODE": "0"})
    two = write_job(folder, dev_cluster, "ck-unchecked-2", nodes=2)
    submitted = start(dev_cluster, "submit", str(one), "--json", env=env)
    refused = clusterkit(dev_cluster, "submit", str(two), env=env)
    done = finish(submitted)

    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    try:
        assert doc["excluded"] == {"n2": ["slurm.state"], "n3": ["profile.nodes"], "n4": ["profile.nodes"]}
        assert [n["node"] for n in doc["preflight"]["nodes"]] == ["n1"]  # the only node checked
        assert "clusterkit: excluding n2 (--exclude): not preflighted: Slurm state idle*" in done.stderr
        record = records.find(doc["job_id"], "local", Path(env["XDG_STATE_HOME"]) / "clusterkit" / "jobs")
        assert record is not None
        assert [line for line in record.script.splitlines() if "--exclude" in line] == ['#SBATCH --exclude="n[2-4]"']
    finally:
        scancel(dev_cluster, doc["job_id"])

    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stdout == ""
    assert ("only 1 healthy node(s) of 1 for a 2-node job; not checked: n2 (Slurm state idle*" in refused.stderr
            or "not checked: n2 (Slurm state down*" in refused.stderr), refused.stderr
    assert ("  fix: wait until Slurm can use n2 again (sinfo -n n2) and submit again, add n[3-4] to the "
            "profile's nodes, ask for at most 1 node(s)") in refused.stderr
