"""slurm_runner against the dev cluster's real Slurm: submit, wait, status, cancel, test-only."""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.errors import ClusterRefused
from cluster_kit.slurm import jobs
from cluster_kit.slurm import runner as slurm_runner

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runner(dev_cluster: Any) -> slurm_runner.LocalRunner:
    """A local runner reading the dev cluster's slurm.conf."""
    return slurm_runner.LocalRunner(dev_cluster.slurm_env())


@pytest.fixture()
def options(tmp_path: Path) -> dict[str, Any]:
    """sbatch options shared by the test jobs; output lands in tmp_path."""
    tmp_path.chmod(0o777)
    return {"partition": "debug", "output": f"{tmp_path}/%x-%j.out", "chdir": str(tmp_path)}


def ended(runner: slurm_runner.LocalRunner, job_id: str, timeout: float) -> int | None:
    """The job's exit status once it ended (ClusterRefused after `timeout` s)."""
    deadline = time.monotonic() + timeout

    def sleep(seconds: float) -> None:
        if time.monotonic() > deadline:
            raise ClusterRefused(f"job {job_id} still runs after {timeout:g} s")
        time.sleep(seconds)

    return [status.exit_status for status in jobs.watch(runner, job_id, 0.2, sleep)][-1]


def wait_for_phase(runner: slurm_runner.LocalRunner, job_id: str, phase: str) -> None:
    deadline = time.monotonic() + 60
    while jobs.job_status(runner, job_id).phase != phase:
        assert time.monotonic() < deadline, f"job {job_id} never became {phase}"
        time.sleep(0.2)


def test_a_job_that_succeeds(runner: slurm_runner.LocalRunner, options: dict[str, Any]) -> None:
    job_id = jobs.submit(runner, "#!/bin/bash\necho hello from $SLURM_JOB_ID\n",
                                 options={**options, "job-name": "ck-it-ok", "nodes": 2})
    assert ended(runner, job_id, 120) == 0
    status = jobs.job_status(runner, job_id)
    assert (status.state, status.exit_status, status.nodes) == ("COMPLETED", 0, "n[1-2]")
    assert jobs.is_finished(runner, job_id)
    assert jobs.job_output_path(runner, job_id) == f"{options['chdir']}/ck-it-ok-{job_id}.out"
    output = jobs.read_output(runner, job_id)
    assert output == f"hello from {job_id}\n"
    assert jobs.read_output(runner, job_id, offset=len("hello from ")) == f"{job_id}\n"


def test_a_job_that_exits_3(runner: slurm_runner.LocalRunner, options: dict[str, Any]) -> None:
    job_id = jobs.submit(runner, "", options={**options, "job-name": "ck-it-fail",
                                                      "wrap": "echo failing; exit 3"})
    assert ended(runner, job_id, 120) == 3
    status = jobs.job_status(runner, job_id)
    assert (status.state, str(status.exit_code), status.reason) == ("FAILED", "3:0", "NonZeroExitCode")


def test_cancel_a_running_job(runner: slurm_runner.LocalRunner, options: dict[str, Any]) -> None:
    job_id = jobs.submit(runner, "", options={**options, "job-name": "ck-it-long",
                                                      "wrap": "sleep 300"})
    try:
        wait_for_phase(runner, job_id, "running")
        assert jobs.job_status(runner, job_id).source == "squeue"
        assert jobs.cancel(runner, job_id) is True
        code = ended(runner, job_id, 60)
    finally:
        jobs.cancel(runner, job_id)
    assert code != 0
    assert jobs.job_status(runner, job_id).state == "CANCELLED"
    assert jobs.cancel(runner, job_id) is False  # already ended: not an error


def test_test_only_accepts_a_possible_job(runner: slurm_runner.LocalRunner,
                                          options: dict[str, Any]) -> None:
    message = jobs.submit(runner, "", test_only=True,
                                  options={**options, "nodes": 2, "gpus-per-node": 4, "wrap": "true"})
    assert message.startswith("Job ") and "to start at" in message
    assert message.endswith("in partition debug")


def test_test_only_refuses_an_impossible_job(runner: slurm_runner.LocalRunner,
                                             options: dict[str, Any]) -> None:
    with pytest.raises(ClusterRefused) as info:
        jobs.submit(runner, "", test_only=True,
                            options={**options, "gpus-per-node": 8, "wrap": "true"})
    assert info.value.exit_code == 3
    assert "Requested node configuration is not available" in info.value.message
    assert info.value.fix


def test_submit_refusal_carries_slurms_message(runner: slurm_runner.LocalRunner,
                                               options: dict[str, Any]) -> None:
    with pytest.raises(ClusterRefused, match="Batch job submission failed: Requested node"):
        jobs.submit(runner, "", options={**options, "gpus-per-node": 8, "wrap": "true"})


def test_unknown_job(runner: slurm_runner.LocalRunner) -> None:
    with pytest.raises(ClusterRefused, match="does not know job 987654"):
        jobs.job_status(runner, "987654")
    assert jobs.is_finished(runner, "987654")
    with pytest.raises(ClusterRefused, match="Invalid job id specified"):
        jobs.cancel(runner, "987654")


def test_partition_nodes(runner: slurm_runner.LocalRunner, dev_cluster: Any) -> None:
    assert jobs.partition_nodes(runner, "debug") == dev_cluster.slurm_nodes


# ---------------------------------------------------------------- through the login node


@pytest.fixture(scope="module")
def login_runner(dev_cluster: Any) -> slurm_runner.LoginRunner:
    """Runs Slurm's commands on the dev cluster's `login` node over SSH, as ckuser."""
    return slurm_runner.LoginRunner({
        "host": "login", "user": dev_cluster.user, "identity_file": str(dev_cluster.ssh_key),
        "known_hosts": str(dev_cluster.known_hosts), "config_file": str(dev_cluster.ssh_config)})


@pytest.fixture()
def shared_dir() -> Iterator[Path]:
    """A directory the job (run as ckuser) can write and the login node can read."""
    path = Path(tempfile.mkdtemp(prefix="ck-login-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_login_runner_submits_waits_and_reads(login_runner: slurm_runner.LoginRunner,
                                              shared_dir: Path) -> None:
    job_id = jobs.submit(login_runner, "#!/bin/bash\necho \"it's $(whoami)\"\nexit 3\n",
                                 options={"output": f"{shared_dir}/%j.out", "chdir": str(shared_dir),
                                          "job-name": "ck it login"})
    assert ended(login_runner, job_id, 120) == 3
    assert jobs.read_output(login_runner, job_id) == "it's ckuser\n"


def test_login_runner_refusal_carries_slurms_message(login_runner: slurm_runner.LoginRunner) -> None:
    with pytest.raises(ClusterRefused) as info:
        jobs.submit(login_runner, "", test_only=True,
                            options={"gpus-per-node": 8, "wrap": "true"})
    assert "on login" in info.value.message
    assert "Requested node configuration is not available" in info.value.message


def test_login_runner_unreachable_host(dev_cluster: Any) -> None:
    runner = slurm_runner.LoginRunner({
        "host": "refuse", "user": dev_cluster.user, "identity_file": str(dev_cluster.ssh_key),
        "known_hosts": str(dev_cluster.known_hosts), "config_file": str(dev_cluster.ssh_config),
        "connect_timeout": 5})
    with pytest.raises(ClusterRefused, match="cannot run squeue on refuse"):
        jobs.job_status(runner, "1")


def test_login_runner_keeps_one_connection_and_replaces_a_dropped_one(dev_cluster: Any) -> None:
    runner = slurm_runner.LoginRunner({
        "host": "login", "user": dev_cluster.user, "identity_file": str(dev_cluster.ssh_key),
        "known_hosts": str(dev_cluster.known_hosts), "config_file": str(dev_cluster.ssh_config)})
    try:
        assert runner.run(["sinfo", "--version"]).ok
        first = runner._session
        assert runner.run(["squeue", "--version"]).ok and runner._session is first
        first.close()  # the connection drops between two commands
        assert runner.run(["sinfo", "--version"]).ok
        assert runner._session is not first and runner._session.active
    finally:
        runner.close()
    assert runner._session is None
