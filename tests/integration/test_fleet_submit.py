"""`submit` on a fleet with a broken node, on the dev cluster's real Slurm and sshd nodes.

n2's fake sysfs is edited for the tests that need a broken node (mlx5_0 port 1
DOWN, restored afterwards): preflight then fails n2 on `rdma.port_state`. The
profile asks for no GPUs, so its jobs never queue behind the examples.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobcli import (
    cli_env,
    clusterkit,
    cpu_profile,
    finish,
    rank_lines,
    read_until,
    scancel,
    shared_dir,
    ssh_section,
    start,
    write_ranks_script,
    write_yaml,
)

pytestmark = pytest.mark.integration

PORT_STATE = "class/infiniband/mlx5_0/ports/1/state"
TIMEOUT = 240


@pytest.fixture()
def folder() -> Iterator[Path]:
    with shared_dir("ck-fleet-") as path:
        yield path


@pytest.fixture()
def broken_n2(dev_cluster: Any) -> Iterator[None]:
    with dev_cluster.override("n2", PORT_STATE, "1: DOWN"):
        yield


def ib_profile(dev_cluster: Any, folder: Path, listed: bool = True, **extra: Any) -> Path:
    """The dev cluster's nodes over InfiniBand; `listed=False` leaves out the `nodes`
    hostlist, so the nodes come from sinfo and only Slurm knows how many there are."""
    profile = cpu_profile(dev_cluster, name="ck-fleet",
                          network={"fabric": "infiniband", "ib_hca": ["mlx5_0:1", "mlx5_1:1"]}, **extra)
    if not listed:
        del profile["nodes"]
    return write_yaml(folder / "ck-fleet.yaml", profile)


def job_file(folder: Path, profile: Path, name: str, **keys: Any) -> Path:
    script = write_ranks_script(folder)
    job = {"name": name, "profile": str(profile), "nodes": 1, "script": str(script),
           "output": f"{folder}/%x-%j.out", "preflight": False, **keys}
    return write_yaml(folder / f"{name}.yaml", job)


def queued(dev_cluster: Any, name: str, states: str = "all") -> str:
    done = subprocess.run(["squeue", "-h", f"--states={states}", "-n", name, "-o", "%i %T %r"],
                          capture_output=True, text=True, env=dev_cluster.slurm_env(), check=True)
    return done.stdout


def scontrol_field(dev_cluster: Any, job_id: str, key: str) -> str:
    done = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                          env=dev_cluster.slurm_env(), check=True)
    match = re.search(rf"\b{key}=(\S*)", done.stdout)
    assert match, done.stdout
    return match.group(1)


def test_a_one_node_job_routes_around_the_broken_node(dev_cluster: Any, folder: Path, broken_n2: None) -> None:
    job = job_file(folder, ib_profile(dev_cluster, folder), "ck-route")
    done = clusterkit(dev_cluster, "submit", str(job), "--json", "--wait", timeout=TIMEOUT)
    doc = json.loads(done.stdout)  # the one document on stdout
    job_id = doc["job_id"]
    try:
        assert done.returncode == 0, done.stderr
        # n3 and n4 are in the partition, not in the profile's nodes: never checked, never used
        assert doc["excluded"] == {"n2": ["rdma.port_state"], "n3": ["profile.nodes"], "n4": ["profile.nodes"]}
        assert doc["preflight"]["summary"] == {"pass": 1, "warn": 0, "fail": 1, "unreachable": 0}
        assert "clusterkit: excluding n2 (--exclude): rdma.port_state: mlx5_0 port 1 is DOWN" in done.stderr
        assert scontrol_field(dev_cluster, job_id, "ExcNodeList") == "n[2-4]"
        assert scontrol_field(dev_cluster, job_id, "NodeList") == "n1"
        log = next(folder.glob(f"ck-route-{job_id}.out")).read_text()
        assert rank_lines(log)[0]["SLURMD_NODENAME"] == "n1"
    finally:
        scancel(dev_cluster, job_id)


def test_a_two_node_job_is_refused_naming_the_node_and_check(dev_cluster: Any, folder: Path,
                                                           broken_n2: None) -> None:
    job = job_file(folder, ib_profile(dev_cluster, folder), "ck-refused", nodes=2)
    done = clusterkit(dev_cluster, "submit", str(job), timeout=TIMEOUT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.startswith("clusterkit: error: preflight failed; not submitting: only 1 healthy "
                                  "node(s) of 2 for a 2-node job; failing: n2 (rdma.port_state); not checked: n[3-4] (in the "
                                  "partition, not in the profile's nodes)\n"), done.stderr
    assert "mlx5_0 port 1 is DOWN" in done.stderr
    assert "  fix: ask for at most 1 node(s), fix the failing nodes (clusterkit preflight --nodes n[2-4])" in done.stderr
    assert queued(dev_cluster, "ck-refused") == ""


def test_strict_refuses_a_job_that_would_fit(dev_cluster: Any, folder: Path, broken_n2: None) -> None:
    job = job_file(folder, ib_profile(dev_cluster, folder), "ck-strict")
    done = clusterkit(dev_cluster, "submit", str(job), "--strict", timeout=TIMEOUT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "--strict: failing node(s) n2 (rdma.port_state)" in done.stderr
    assert queued(dev_cluster, "ck-strict") == ""


def test_a_job_larger_than_the_partition_exits_3_and_leaves_nothing_pending(
        dev_cluster: Any, folder: Path) -> None:
    job = job_file(folder, ib_profile(dev_cluster, folder, listed=False), "ck-never", nodes=5)
    # --wait would wait forever on a job that never starts; clusterkit() fails after TIMEOUT s
    done = clusterkit(dev_cluster, "submit", str(job), "--wait", timeout=TIMEOUT)
    assert done.returncode == 3, done.stdout + done.stderr
    job_id = done.stdout.strip()
    assert re.fullmatch(r"\d+", job_id), done.stdout
    first, fix = done.stderr.splitlines()[-2:]
    assert first == (f"clusterkit: error: Slurm on this machine can never start job {job_id}: pending "
                     "with reason PartitionNodeLimit: it asks for 5 nodes, partition debug has 4; cancelled it")
    assert fix.startswith("  fix: ask for at most 4 node(s)")
    assert queued(dev_cluster, "ck-never", states="PENDING") == ""


def test_without_wait_the_never_starting_job_is_exit_3_named_and_cancelled(dev_cluster: Any, folder: Path) -> None:
    job = job_file(folder, ib_profile(dev_cluster, folder, listed=False), "ck-never-nowait", nodes=5)
    done = clusterkit(dev_cluster, "submit", str(job), "--no-preflight", timeout=TIMEOUT)
    job_id = done.stdout.strip()
    try:
        assert done.returncode == 3, done.stdout + done.stderr
        assert f"can never start job {job_id}: pending with reason PartitionNodeLimit" in done.stderr
        assert "; cancelled it\n" in done.stderr
        assert queued(dev_cluster, "ck-never-nowait", states="PENDING") == ""  # not left queued
    finally:
        scancel(dev_cluster, job_id)


def test_ctrl_c_under_wait_exits_130_and_names_the_running_job(dev_cluster: Any, folder: Path) -> None:
    job = job_file(folder, ib_profile(dev_cluster, folder), "ck-interrupted", args=["--sleep", "120"])
    proc = start(dev_cluster, "--verbose", "submit", str(job), "--wait", "--no-preflight")
    assert proc.stdout is not None
    job_id = proc.stdout.readline().strip()  # printed as soon as sbatch answered
    try:
        assert re.fullmatch(r"\d+", job_id), job_id
        polling = read_until(proc, proc.stderr, rf"^clusterkit: run on this machine: squeue .*{job_id}")
        proc.send_signal(signal.SIGINT)
        done = finish(proc, timeout=60)
        stderr = polling + done.stderr
        assert done.returncode == 130, stderr
        # running, or still queued behind other jobs: either way it is named with how to stop it
        assert re.fullmatch(rf"job {job_id} is still (running|queued \(PENDING\)); stop it with: "
                            rf"clusterkit cancel {job_id}", stderr.splitlines()[-1]), stderr
        assert "Traceback" not in stderr and "Aborted" not in stderr
        assert queued(dev_cluster, "ck-interrupted", states="PENDING,RUNNING") != ""  # really still there
    finally:
        scancel(dev_cluster, job_id)


def test_ctrl_c_through_the_login_node_names_the_profile_to_cancel_with(dev_cluster: Any, folder: Path) -> None:
    login = {"host": "login", **ssh_section(dev_cluster)}
    profile = write_yaml(folder / "via-login.yaml", cpu_profile(dev_cluster, name="via-login", login=login))
    job = write_yaml(folder / "job.yaml", {
        "name": "ck-interrupted-login", "profile": "./via-login.yaml", "nodes": 1, "workdir": str(folder),
        "script": str(write_ranks_script(folder)), "args": ["--sleep", "120"],
        "output": f"{folder}/%x-%j.out", "preflight": False})
    env = cli_env(dev_cluster, SLURM_CONF="/dev/null")  # only the login node can run Slurm's commands
    proc = start(dev_cluster, "--verbose", "submit", str(job), "--wait", "--no-preflight", env=env)
    assert proc.stdout is not None
    job_id = proc.stdout.readline().strip()
    try:
        assert re.fullmatch(r"\d+", job_id), job_id
        polling = read_until(proc, proc.stderr, rf"^clusterkit: run on login over SSH: squeue .*{job_id}")
        proc.send_signal(signal.SIGINT)
        done = finish(proc, timeout=60)
        stderr = polling + done.stderr
        assert done.returncode == 130, stderr
        last = stderr.splitlines()[-1]
        assert re.fullmatch(rf"job {job_id} is still (running|queued \(PENDING\)); stop it with: "
                            rf"clusterkit cancel {job_id} --profile {re.escape(str(profile.resolve()))}", last), last
        assert "clusterkit: run on login over SSH: sbatch --parsable" in stderr.splitlines()
    finally:
        scancel(dev_cluster, job_id)


def test_torchrun_task_gets_the_cpus_of_all_its_workers(dev_cluster: Any, folder: Path) -> None:
    worker = folder / "cpus.py"
    # one write per line: the workers share the output file
    worker.write_text("import os\nos.write(1, ('ck-rank RANK=%s cpus=%s\\n' % (os.environ['RANK'], "
                      "os.environ.get('SLURM_CPUS_PER_TASK'))).encode())\n")
    profile = write_yaml(folder / "ck-torchrun.yaml", cpu_profile(
        dev_cluster, name="ck-torchrun", environment={"python": sys.executable}))
    job = write_yaml(folder / "ck-cpus.yaml", {
        "name": "ck-cpus", "profile": str(profile), "nodes": 1, "gpus_per_node": 2,
        "launcher": "torchrun", "slurm": {"cpus_per_task": 2}, "script": str(worker),
        "output": f"{folder}/%x-%j.out", "preflight": False})
    done = clusterkit(dev_cluster, "submit", str(job), "--wait", "--no-preflight", timeout=TIMEOUT)
    job_id = done.stdout.strip()
    try:
        assert done.returncode == 0, done.stderr
        log = next(folder.glob(f"ck-cpus-{job_id}.out")).read_text()
        ranks = rank_lines(log)
        assert sorted(ranks) == [0, 1], log
        assert {fields["cpus"] for fields in ranks.values()} == {"4"}  # 2 per worker x 2 workers
        assert scontrol_field(dev_cluster, job_id, "NumCPUs") == "4"
    finally:
        scancel(dev_cluster, job_id)


def test_verbose_logs_each_slurm_and_ssh_call(dev_cluster: Any, folder: Path) -> None:
    job = job_file(folder, ib_profile(dev_cluster, folder), "ck-verbose")
    done = clusterkit(dev_cluster, "--verbose", "submit", str(job), "--test-only", timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "clusterkit: run on this machine: sinfo --Node --noheader '--format=%N|%T|%E' --partition=debug" in lines
    assert any(line.startswith("clusterkit: ssh to 2 node(s) n[1-2] as ckuser: ") for line in lines), lines
    assert "clusterkit: run on this machine: sbatch --parsable --test-only" in lines


def test_ctrl_c_while_nodes_are_probed_exits_130_without_a_traceback(dev_cluster: Any, folder: Path) -> None:
    # `silent` accepts TCP and never sends a byte: the probe waits for its banner
    profile = write_yaml(folder / "slow.yaml", cpu_profile(
        dev_cluster, name="slow", nodes="silent", ssh=ssh_section(dev_cluster, connect_timeout=30)))
    proc = start(dev_cluster, "--verbose", "preflight", "--profile", str(profile))
    probing = read_until(proc, proc.stderr, r"^clusterkit: ssh to 1 node\(s\) silent\b")
    proc.send_signal(signal.SIGINT)
    done = finish(proc, timeout=30)
    stderr = probing + done.stderr
    assert done.returncode == 130, done.stdout + stderr
    assert stderr.splitlines()[-1] == "clusterkit: interrupted", stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr
