"""Helpers for the tests of jobs that keep training (`resilience:`) on the dev cluster.

A job here is examples/train_resilient.py on 2 nodes x 2 gloo ranks: it checkpoints,
resumes and can be planted with faults. `chain_record` waits for the attempts record
to say the chain ended; `assert_same_weights` compares the final weights with those of
the same training without a fault (the `reference_weights` fixture of conftest.py).
"""
from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jobcli import PARTITION_NODES, REPO, clusterkit, job_id_of, write_yaml

STEPS = 48
CHAIN_TIMEOUT_S = 420
HANG_TIMEOUT_S = 10  # steps take 0.1-3 s here; a hang costs a test this long


def job(folder: Path, name: str, *args: str, resilience: dict[str, Any] | None = None,
        time_limit: str = "00:05:00", step_seconds: float = 0.1, profile: str = "local-dev",
        **extra: Any) -> Path:
    return write_yaml(folder / f"{name}.yaml", {
        "name": name, "profile": profile, "nodes": 2, "gpus_per_node": 2, "time": time_limit,
        "script": str(REPO / "examples" / "train_resilient.py"),
        "args": ["--steps", str(STEPS), "--step-seconds", str(step_seconds), "--checkpoint-every", "4",
                 "--weights-out", str(folder / f"{name}.weights"), *args],
        "output": f"{folder}/%x-%j.out", "env": {"OMP_NUM_THREADS": "1"}, "preflight": False,
        "resilience": {"hang_timeout": HANG_TIMEOUT_S, "max_restarts": 2, "checkpoint_dir": str(folder / f"{name}.ckpt"),
                       **(resilience or {})}, **extra})


def side_profile(folder: Path) -> str:
    """profiles/local-dev.yaml on partition side (s1-s2): for the tests marked side_partition,
    which run beside the tests on partition debug."""
    return str(write_yaml(folder / "local-dev-side.yaml", {
        "name": "local-dev-side", "extends": str(REPO / "profiles" / "local-dev.yaml"),
        "nodes": PARTITION_NODES["side"], "slurm": {"partition": "side"}}))


def submit(dev_cluster: Any, job_file: Path) -> str:
    done = clusterkit(dev_cluster, "submit", str(job_file), "--no-preflight")
    assert done.returncode == 0, done.stdout + done.stderr
    return job_id_of(done)


def record_path(folder: Path, job_id: str) -> Path:
    return folder / f"clusterkit-{job_id}" / "attempts.json"


def chain_record(folder: Path, job_id: str, timeout: float = CHAIN_TIMEOUT_S) -> dict[str, Any]:
    """The attempts record once the chain has ended."""
    path = record_path(folder, job_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = None
        if record and record.get("final"):
            return record
        time.sleep(2)
    raise AssertionError(f"the chain of job {job_id} did not end in {timeout:.0f} s: "
                         f"{path.read_text() if path.exists() else 'no record'}")


def hostnames(dev_cluster: Any, nodelist: str) -> list[str]:
    done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                          env=dev_cluster.slurm_env(), check=True)
    return done.stdout.split()


def second_node(dev_cluster: Any, nodelist: str) -> str:
    return hostnames(dev_cluster, nodelist)[1]


def yaml_of(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text())


def assert_same_weights(got: Path, reference: Path) -> None:
    """Final weights as the run without faults (1e-5: DDP's first step after a restart
    buckets differently)."""
    import torch

    mine, theirs = torch.load(got, weights_only=True), torch.load(reference, weights_only=True)
    assert sorted(mine) == sorted(theirs)
    for key in mine:
        assert torch.allclose(mine[key], theirs[key], atol=1e-5, rtol=0), key


def training(folder: Path, job_id: str, attempt: int = 0) -> dict[str, Any]:
    """Once every rank of the attempt has sent a heartbeat, and a few steps more: the
    attempts record then."""
    beats = folder / f"clusterkit-{job_id}" / f"attempt-{attempt}" / "heartbeat"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(list(beats.glob("rank-*"))) < 4:
        time.sleep(1)
    time.sleep(3)
    return json.loads(record_path(folder, job_id).read_text())


def log_of(attempt: dict[str, Any]) -> str:
    return Path(attempt["output"]).read_text()


def squeue_state(dev_cluster: Any, job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                          env=dev_cluster.slurm_env(), check=False).stdout.strip()


def wait_idle(dev_cluster: Any, partition: str, timeout: float = 180) -> None:
    """Until every node of the partition is idle, so that Slurm hands out the lowest-named
    nodes first and a test may name them (n1 runs the batch script, n2 the second node)."""
    def states() -> str:
        return subprocess.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N=%T"], capture_output=True,
                              text=True, env=dev_cluster.slurm_env(), check=True).stdout
    deadline = time.monotonic() + timeout
    while any(not line.endswith("=idle") for line in states().split()):
        assert time.monotonic() < deadline, f"partition {partition} is not idle: {states().split()}"
        time.sleep(0.5)


def wait_state(dev_cluster: Any, job_id: str, state: str, timeout: float = 120) -> None:
    """Until squeue shows the job in `state`; "" once it has left squeue (COMPLETING
    included: its nodes are free again)."""
    deadline = time.monotonic() + timeout
    while (now := squeue_state(dev_cluster, job_id)) != state:
        assert time.monotonic() < deadline, f"job {job_id} is {now or 'gone'!r}, not {state or 'gone'!r}"
        time.sleep(0.5)


@contextmanager
def holding(dev_cluster: Any, nodes: str, seconds: int = 900) -> Iterator[str]:
    """A job of another user's kind that holds `nodes` (exclusively) while the block runs."""
    done = subprocess.run(["sbatch", "--parsable", "-N", str(len(hostnames(dev_cluster, nodes))), "-w", nodes,
                           "--exclusive", "-J", "ck-holder", "-o", "/dev/null", "--wrap", f"sleep {seconds}"],
                          capture_output=True, text=True, env=dev_cluster.slurm_env(), check=True)
    holder = done.stdout.strip().split(";")[0]
    try:
        wait_state(dev_cluster, holder, "RUNNING")
        yield holder
    finally:
        subprocess.run(["scancel", holder], env=dev_cluster.slurm_env(), check=False, capture_output=True)


def requeue(dev_cluster: Any, job_id: str, exclude: str | None = None) -> None:
    """What preemption with PreemptMode=REQUEUE does to a running job, by hand; then the
    job may start at once (Slurm holds a requeued job back for 120 s, BeginTime), with
    `exclude` as its ExcNodeList when given ("" clears it)."""
    env = dev_cluster.slurm_env()
    subprocess.run(["scontrol", "requeue", job_id], env=env, check=True, capture_output=True, timeout=60)
    deadline = time.monotonic() + 60
    while squeue_state(dev_cluster, job_id) not in ("PENDING", "RUNNING") and time.monotonic() < deadline:
        time.sleep(0.5)
    settings = [f"ExcNodeList={exclude}"] if exclude is not None else []
    subprocess.run(["scontrol", "update", f"JobId={job_id}", *settings, "StartTime=now"], env=env, check=False,
                   capture_output=True, timeout=60)
