"""Errors that need the dev cluster, through the real `clusterkit` process.

A login host that refuses SSH is "the cluster refused" (exit 3); an unknown job id
is squeue/scancel refusing it (exit 3); a failing preflight stops submit (exit 1).
Each is one message plus its fix on stderr, never a traceback.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

UNKNOWN_JOB = "99999999"


def clusterkit(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "clusterkit"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "cluster_kit"]
    return subprocess.run([*argv, *args], cwd=cwd, capture_output=True, text=True, timeout=90,
                          stdin=subprocess.DEVNULL, check=False, env=env)


def one_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The error line of a refused command: exit `code`, one message and its fix."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("clusterkit: error: "), done.stderr
    assert lines[1].startswith("  fix: "), done.stderr
    return lines[0]


def write_job(folder: Path, profile: dict[str, Any]) -> Path:
    (folder / "profile.yaml").write_text(yaml.safe_dump(profile))
    job = folder / "job.yaml"
    job.write_text("profile: ./profile.yaml\nscript: train.py\nnodes: 1\ntime: '00:01:00'\n")
    return job


def ssh_settings(dev_cluster: Any) -> dict[str, Any]:
    return {"user": dev_cluster.user, "identity_file": str(dev_cluster.ssh_key),
            "known_hosts": str(dev_cluster.known_hosts), "connect_timeout": 3}


def test_submit_through_an_unreachable_login_host_exits_3(dev_cluster: Any, tmp_path: Path) -> None:
    login = {"host": "refuse", "user": dev_cluster.user, "identity_file": str(dev_cluster.ssh_key)}
    job = write_job(tmp_path, {"name": "far", "login": login, "slurm": {"partition": "debug"}})
    line = one_error(clusterkit(tmp_path, "submit", "--no-preflight", str(job)), 3)
    assert line == "clusterkit: error: cannot run sbatch on refuse: connection refused (refuse port 22)"
    # with the preflight, the node list comes from sinfo on the same login host
    line = one_error(clusterkit(tmp_path, "submit", str(job)), 3)
    assert "cannot run sinfo on refuse: connection refused" in line


def test_status_and_cancel_of_an_unknown_job_exit_3(dev_cluster: Any, tmp_path: Path) -> None:
    env = dev_cluster.slurm_env()
    line = one_error(clusterkit(tmp_path, "status", UNKNOWN_JOB, env=env), 3)
    assert line == f"clusterkit: error: Slurm does not know job {UNKNOWN_JOB}"
    line = one_error(clusterkit(tmp_path, "cancel", UNKNOWN_JOB, env=env), 3)
    assert "Invalid job id specified" in line


def test_submit_stops_when_the_preflight_fails(dev_cluster: Any, tmp_path: Path) -> None:
    profile = {"name": "broken", "nodes": "ib-portdown", "ssh": ssh_settings(dev_cluster),
               "slurm": {"partition": "debug"},
               "network": {"fabric": "infiniband", "ib_hca": ["mlx5_3:1"]}}
    job = write_job(tmp_path, profile)
    done = clusterkit(tmp_path, "submit", str(job), env=dev_cluster.slurm_env())
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""  # no job id: nothing was submitted
    assert done.stderr.startswith("clusterkit: error: preflight failed; not submitting\n")
    assert "rdma.port_state" in done.stderr and "mlx5_3 port 1 is DOWN" in done.stderr
    assert "fix: fix or exclude the failing nodes, or submit with --no-preflight" in done.stderr
