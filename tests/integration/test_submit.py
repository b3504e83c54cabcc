"""`clusterkit submit/status/cancel/logs` as a user runs them, against the dev cluster's Slurm.

The two CPU DDP examples (2 nodes x 2 Gloo ranks, torch start-up dominates) are
submitted as soon as this module starts and run while the quick tests below do
their work; those use a GPU-less profile so that they never queue behind the
examples, which hold the fake GPUs.
"""
from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jobcli import (
    REPO,
    cli_env,
    clusterkit,
    cpu_profile,
    finish,
    job_id_of,
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

DDP_EXAMPLES = {"srun": "examples/cpu-ddp.yaml", "torchrun": "examples/cpu-ddp-torchrun.yaml"}
# What examples/train_ddp.py prints on every rank.
DDP_RANK_LINE = re.compile(r"rank=(\d+) local_rank=(\S+) world_size=(\d+) master_addr=(\S+)"
                           r" allreduce_sum=(\d+) expected=(\d+) (\w+)")
IMPOSSIBLE = "Requested node configuration is not available"


def fitting_examples() -> list[str]:
    """The examples written for the dev cluster (profile local-dev)."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "examples").glob("*.yaml")
                  if yaml.safe_load(p.read_text()).get("profile") == "local-dev")


@pytest.fixture(scope="module", autouse=True)
def ddp_runs(request: pytest.FixtureRequest, dev_cluster: Any) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """`submit EXAMPLE --wait` of each DDP example the session selected, started now."""
    params = [getattr(item, "callspec", None) for item in request.session.items
              if getattr(item, "module", None) is request.module]
    wanted = {callspec.params["launcher"] for callspec in params if callspec and "launcher" in callspec.params}
    runs = {launcher: start(dev_cluster, "submit", DDP_EXAMPLES[launcher], "--wait")
            for launcher in sorted(wanted)}
    yield runs
    for proc in runs.values():
        if proc.poll() is None:
            finish(proc)


@pytest.fixture()
def cpu_job(dev_cluster: Any, tmp_path: Path) -> Any:
    """write(name, **job keys) -> a job file on a GPU-less profile, running ranks.py."""
    profile = write_yaml(tmp_path / "ck-cpu.yaml", cpu_profile(dev_cluster))
    script = write_ranks_script(tmp_path)

    def write(name: str, **keys: Any) -> Path:
        job = {"name": name, "profile": str(profile), "nodes": 1, "script": str(script),
               "output": f"{tmp_path}/%x-%j.out", "preflight": False, **keys}
        return write_yaml(tmp_path / f"{name}.yaml", job)

    return write


def status_fields(dev_cluster: Any, job_id: str, *profile: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """`clusterkit status JOBID` as {FIELD: VALUE}."""
    done = clusterkit(dev_cluster, "status", job_id, *profile, env=env)
    assert done.returncode == 0, done.stderr
    rows = [line.split(None, 1) for line in done.stdout.splitlines()[1:] if line.strip()]
    return {row[0]: row[1].strip() if len(row) > 1 else "" for row in rows}


# ---------------------------------------------------------------- asking Slurm first


@pytest.mark.parametrize("example", fitting_examples())
def test_test_only_accepts_each_dev_cluster_example(example: str, dev_cluster: Any) -> None:
    done = clusterkit(dev_cluster, "submit", example, "--test-only", "--no-preflight")
    assert done.returncode == 0, done.stderr
    # Slurm's own estimate, e.g. "Job 12 to start at 2024-05-01T10:00:00 using 4 processors on nodes n[1-2] in partition debug"
    assert re.fullmatch(r"Job \d+ to start at \S+ using \d+ processors on nodes \S+ in partition debug\n",
                        done.stdout), done.stdout


@pytest.mark.parametrize(("shape", "flags"), [
    ({"nodes": 1, "gpus_per_node": 8}, ["--test-only"]),
    ({"nodes": 1, "gpus_per_node": 8}, []),
    ({"nodes": 5, "gpus_per_node": 1}, ["--test-only"]),
], ids=["8-gpus-test-only", "8-gpus-submit", "5-nodes-test-only"])
def test_an_impossible_request_exits_3_with_slurms_message(shape: dict[str, int], flags: list[str],
                                                           dev_cluster: Any, tmp_path: Path) -> None:
    # local-dev lists its nodes, so validate itself refuses 5 of them (exit 2): the same
    # profile without the hostlist leaves the node count to Slurm, as a profile using sinfo does.
    unlisted = yaml.safe_load((REPO / "profiles" / "local-dev.yaml").read_text())
    del unlisted["nodes"]
    unlisted.update(name="local-dev-unlisted", extends=str(REPO / "profiles" / "base.yaml"))
    profile = write_yaml(tmp_path / "local-dev-unlisted.yaml", unlisted)
    job = write_yaml(tmp_path / "too-big.yaml", {
        "name": "ck-too-big", "profile": str(profile), **shape, "time": "00:01:00",
        "script": str(REPO / "examples" / "train_ddp.py"), "output": f"{tmp_path}/%x-%j.out", "preflight": False})
    done = clusterkit(dev_cluster, "submit", str(job), "--no-preflight", *flags)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout == ""
    first, fix = done.stderr.splitlines()
    assert first.startswith("clusterkit: error: sbatch") and first.endswith(IMPOSSIBLE), done.stderr
    assert fix.startswith("  fix: ")
    # A 3-node job on a 2-node partition is only refused by --test-only: plain
    # sbatch queues it (PartitionNodeLimit), as Slurm without EnforcePartLimits does.


def test_dry_run_prints_the_sbatch_command_and_script_and_submits_nothing(
        dev_cluster: Any, tmp_path: Path) -> None:
    name = f"ck-dry-{tmp_path.name}"
    job = yaml.safe_load((REPO / DDP_EXAMPLES["srun"]).read_text())
    job.update(name=name, script=str(REPO / "examples" / job["script"]), output=f"{tmp_path}/%x-%j.out")
    job_file = write_yaml(tmp_path / "dry.yaml", job)

    done = clusterkit(dev_cluster, "submit", str(job_file), "--dry-run")
    assert done.returncode == 0, done.stderr
    rendered = clusterkit(dev_cluster, "render", str(job_file))
    assert rendered.returncode == 0, rendered.stderr
    assert done.stdout == "# sbatch --parsable < script\n" + rendered.stdout
    assert f"#SBATCH --job-name={name}\n" in rendered.stdout
    assert done.stderr == ""
    queued = subprocess.run(["squeue", "-h", "--states=all", "-n", name, "-o", "%i"], check=True,
                            capture_output=True, text=True, env=dev_cluster.slurm_env())
    assert queued.stdout == ""  # not even a finished job of that name
    assert not list(tmp_path.glob("*.out"))


def test_wait_exits_with_the_jobs_exit_code(dev_cluster: Any, cpu_job: Any) -> None:
    job = cpu_job("ck-exit3", args=["--exit", "3"])
    done = clusterkit(dev_cluster, "submit", str(job), "--wait", "--no-preflight")
    assert done.returncode == 3, done.stdout + done.stderr
    job_id = job_id_of(done)
    assert f"job {job_id} finished with exit code 3" in done.stderr
    assert "Traceback" not in done.stderr
    status = status_fields(dev_cluster, job_id)
    assert (status["state"], status["exit_code"], status["exit_status"]) == ("FAILED", "3:0", "3")
    logs = clusterkit(dev_cluster, "logs", job_id)
    assert rank_lines(logs.stdout)[0]["WORLD_SIZE"] == "1"


def wait_until(check: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_status_logs_and_cancel_of_a_running_job(dev_cluster: Any, cpu_job: Any) -> None:
    job = cpu_job("ck-sleeper", args=["--sleep", "300"])
    done = clusterkit(dev_cluster, "submit", str(job), "--no-preflight")
    assert done.returncode == 0, done.stderr
    job_id = job_id_of(done)
    try:
        wait_until(lambda: status_fields(dev_cluster, job_id)["state"] == "RUNNING", "RUNNING")
        running = status_fields(dev_cluster, job_id)
        assert (running["phase"], running["source"]) == ("running", "squeue")
        wait_until(lambda: "ck-rank" in clusterkit(dev_cluster, "logs", job_id).stdout, "the job's first line")

        follow = start(dev_cluster, "logs", "-f", job_id)
        shown = read_until(follow, follow.stdout, r"^ck-rank ")  # it has printed the log so far ...
        assert follow.poll() is None  # ... and goes on following the running job
        cancelled = clusterkit(dev_cluster, "cancel", job_id)
        assert (cancelled.returncode, cancelled.stdout) == (0, f"cancelled {job_id}\n"), cancelled.stderr
        followed = finish(follow, timeout=60)  # ends on its own once the job has ended
        assert followed.returncode == 0, followed.stderr
        assert (shown + followed.stdout).startswith("ck-rank RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=n1 "), (
            shown + followed.stdout)

        final = wait_until(lambda: (s := status_fields(dev_cluster, job_id))["phase"] == "terminal" and s,
                           "the end of the job")
        assert final["state"] == "CANCELLED" and final["exit_status"] != "0", final
    finally:
        scancel(dev_cluster, job_id)


# ---------------------------------------------------------------- through the login node


def files_of(dev_cluster: Any, user: str, since: Path) -> list[str]:
    """Files `user` created after `since` in its home and the temp folders (not deeper in /tmp)."""
    found = subprocess.run(
        ["find", f"/home/{user}", "/tmp", "/var/tmp", "-maxdepth", "1", "-user", user, "-newer", str(since)],
        capture_output=True, text=True, check=False)
    home = subprocess.run(["find", f"/home/{user}", "-user", user, "-newer", str(since)],
                          capture_output=True, text=True, check=False)
    return sorted(set(found.stdout.split()) | set(home.stdout.split()))


def test_submit_status_and_logs_through_the_login_node(dev_cluster: Any, tmp_path: Path) -> None:
    login = {"host": "login", **ssh_section(dev_cluster)}
    profile = write_yaml(tmp_path / "via-login.yaml", cpu_profile(dev_cluster, name="via-login", login=login))
    # Local Slurm commands fail at once with an empty SLURM_CONF: everything has to
    # go through the login node, whose sshd sets the real one.
    env = cli_env(dev_cluster, SLURM_CONF="/dev/null")
    with shared_dir("ck-login-") as folder:
        # sbatch runs in ckuser's home on the login node: absolute paths only.
        job = write_yaml(folder / "job.yaml", {
            "name": "ck-via-login", "profile": str(profile), "nodes": 2, "workdir": str(folder),
            "script": str(write_ranks_script(folder)), "output": f"{folder}/out/%x-%j.out",
            "preflight": False})
        marker = tmp_path / "before"
        marker.write_text("")
        # -newer compares whole seconds on some file systems: start once the clock has
        # passed the marker's second, so a file made in that same second still counts as newer
        wait_until(lambda: time.time() >= int(marker.stat().st_mtime) + 1, "the next second", timeout=5)

        done = clusterkit(dev_cluster, "submit", str(job), "--wait", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        job_id = job_id_of(done)
        assert files_of(dev_cluster, dev_cluster.user, marker) == []  # the script came on stdin

        status = status_fields(dev_cluster, job_id, "--profile", str(profile), env=env)
        assert (status["state"], status["exit_status"], status["nodes"]) == ("COMPLETED", "0", "n[1-2]")
        assert status["stdout"] == f"{folder}/out/ck-via-login-{job_id}.out"
        logs = clusterkit(dev_cluster, "logs", job_id, "--profile", str(profile), env=env)
        assert logs.returncode == 0, logs.stderr
        ranks = rank_lines(logs.stdout)
        assert sorted(ranks) == [0, 1]
        for rank, fields in ranks.items():
            assert fields == {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n1",
                              "SLURMD_NODENAME": f"n{rank + 1}", "user": dev_cluster.user}
        # Without --profile, the job's record names the profile that reaches the login node...
        recorded = clusterkit(dev_cluster, "status", job_id, env=env)
        assert recorded.returncode == 0 and "COMPLETED" in recorded.stdout, recorded.stderr
        # ...and without a record the same command runs here and fails: they did go through it.
        local = clusterkit(dev_cluster, "status", job_id, env={**env, "XDG_STATE_HOME": str(folder / "none")})
        assert local.returncode == 3 and "squeue failed on this machine" in local.stderr, local.stderr


# ---------------------------------------------------------------- the DDP examples (started with the module)


@pytest.mark.parametrize("launcher", sorted(DDP_EXAMPLES))
def test_cpu_ddp_example_runs_every_rank(launcher: str, ddp_runs: dict[str, subprocess.Popen[str]],
                                         dev_cluster: Any) -> None:
    done = finish(ddp_runs[launcher])
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = job_id_of(done)
    assert f"job {job_id} finished with exit code 0" in done.stderr

    logs = clusterkit(dev_cluster, "logs", job_id)
    assert logs.returncode == 0, logs.stderr
    ranks = {int(m.group(1)): m.groups()[1:] for m in DDP_RANK_LINE.finditer(logs.stdout)}
    # 2 ranks per node, so LOCAL_RANK is 0 then 1 on each node; the sum of rank+1 is 10.
    assert ranks == {rank: (str(rank % 2), "4", "n1", "10", "10", "ok") for rank in range(4)}, logs.stdout
    assert re.search(r"^rank=0 steps=5 loss=\S+ weights_in_sync=true ok$", logs.stdout, re.MULTILINE), logs.stdout

    status = status_fields(dev_cluster, job_id)
    assert (status["state"], status["exit_status"], status["nodes"]) == ("COMPLETED", "0", "n[1-2]")
