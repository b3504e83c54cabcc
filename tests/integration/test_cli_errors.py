"""Errors that need the dev cluster, through the real `clusterkit` process.

A login host that refuses SSH is "the cluster refused" (exit 3); an unknown job id
is squeue/scancel refusing it (exit 3); a job none of whose nodes Slurm could give stops submit (exit 1).
Each is one message plus its fix on stderr, never a traceback.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from jobcli import clusterkit, ssh_section, write_yaml

pytestmark = pytest.mark.integration

UNKNOWN_JOB = "99999999"
CLI_TIMEOUT = 90


def one_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The error line of a refused command: exit `code`, one message and its fix."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("clusterkit: error: "), done.stderr
    assert lines[1].startswith("  fix: "), done.stderr
    return lines[0]


def write_job(folder: Path, profile: dict[str, Any]) -> Path:
    write_yaml(folder / "profile.yaml", profile)
    job = folder / "job.yaml"
    job.write_text("profile: ./profile.yaml\nscript: train.py\nnodes: 1\ntime: '00:01:00'\n")
    (folder / "train.py").write_text("print('training')\n")
    return job


def test_submit_through_an_unreachable_login_host_exits_3(dev_cluster: Any, tmp_path: Path) -> None:
    login = {"host": "refuse", "user": dev_cluster.user, "identity_file": str(dev_cluster.ssh_key)}
    job = write_job(tmp_path, {"name": "far", "login": login, "slurm": {"partition": "debug"}})
    line = one_error(clusterkit(dev_cluster, "submit", "--no-preflight", str(job), cwd=tmp_path,
                                timeout=CLI_TIMEOUT), 3)
    # the first thing asked of the login host is whether the job's script is there
    assert line == (f"clusterkit: error: cannot look for the job's script {tmp_path}/train.py on refuse: "
                    "connection refused (refuse port 22)")
    line = one_error(clusterkit(dev_cluster, "submit", str(job), cwd=tmp_path, timeout=CLI_TIMEOUT), 3)
    assert "on refuse: connection refused" in line


def test_status_and_cancel_of_an_unknown_job_exit_3(dev_cluster: Any, tmp_path: Path) -> None:
    line = one_error(clusterkit(dev_cluster, "status", UNKNOWN_JOB, cwd=tmp_path, timeout=CLI_TIMEOUT), 3)
    assert line == f"clusterkit: error: Slurm on this machine does not know job {UNKNOWN_JOB}"
    line = one_error(clusterkit(dev_cluster, "cancel", UNKNOWN_JOB, cwd=tmp_path, timeout=CLI_TIMEOUT), 3)
    assert "Invalid job id specified" in line


def test_submit_stops_when_no_profile_node_is_in_the_partition(dev_cluster: Any, tmp_path: Path) -> None:
    profile = {"name": "elsewhere", "nodes": "ib-portdown", "ssh": ssh_section(dev_cluster, connect_timeout=3),
               "slurm": {"partition": "debug"},
               "network": {"fabric": "infiniband", "ib_hca": ["mlx5_3:1"]}}
    job = write_job(tmp_path, profile)
    line = one_error(clusterkit(dev_cluster, "submit", str(job), cwd=tmp_path, timeout=CLI_TIMEOUT), 1)
    assert line == ("clusterkit: error: no node Slurm could give this job: "
                    "ib-portdown (not in the partition (sinfo))")
