"""The Python API, sweeps as one array job, --after and job records on the dev cluster's real Slurm.

Every test keeps its job records in a temporary XDG_STATE_HOME; the jobs ask for no
GPUs (cpu_profile), so they never queue behind the examples that hold the fake GPUs.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobcli import (
    REPO,
    cli_env,
    clusterkit,
    cpu_profile,
    job_id_of,
    scancel,
    shared_dir,
    write_yaml,
)

# Prints its sweep value, the rendezvous port and the node, then sleeps as asked.
SWEEP_PY = """\
import os, sys, time
print("ck-task value=%s port=%s index=%s node=%s" % (os.environ.get("CK_VALUE", "?"),
      os.environ.get("MASTER_PORT", "?"), os.environ.get("SLURM_ARRAY_TASK_ID", "-"),
      os.environ.get("SLURMD_NODENAME", "?")), flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


@pytest.fixture
def folder(dev_cluster: Any) -> Iterator[Path]:
    """A job folder ckuser can use: profile, job file, script; logs/ for the output."""
    with shared_dir("ck-pyapi-") as path:
        (path / "sweep.py").write_text(SWEEP_PY)
        (path / "logs").mkdir(mode=0o777)
        (path / "logs").chmod(0o777)
        write_yaml(path / "ck-cpu.yaml", cpu_profile(dev_cluster))
        write_yaml(path / "job.yaml", {
            "name": "ck-pyapi", "profile": str(path / "ck-cpu.yaml"), "nodes": 1, "gpus_per_node": 0,
            "script": str(path / "sweep.py"), "args": ["0"], "workdir": str(path),
            "output": "logs/%x-%j.out", "env": {"CK_VALUE": "none"}, "preflight": False})
        yield path


@pytest.fixture
def state_home(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


def ck_env(dev_cluster: Any, state_home: Path) -> dict[str, str]:
    """clusterkit's environment with this checkout first on the path and the records in `state_home`."""
    return cli_env(dev_cluster, XDG_STATE_HOME=str(state_home), PYTHONPATH=str(REPO))


def run_python(dev_cluster: Any, code: str, state_home: Path, timeout: float = 240) -> Any:
    """Run a plain Python script as a user would (no pytest in it); the JSON it printed last."""
    env = ck_env(dev_cluster, state_home)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # the API prints nothing
    return json.loads(done.stdout.splitlines()[-1])


def test_a_python_script_submits_waits_and_reads_the_logs(dev_cluster: Any, folder: Path,
                                                          state_home: Path) -> None:
    out = run_python(dev_cluster, f"""
        import json, cluster_kit
        job = cluster_kit.submit({str(folder / "job.yaml")!r}, overrides={{"env.CK_VALUE": "py-42"}})
        state = job.state()
        result = job.wait(poll=1)
        logs = "".join(job.logs())
        print(json.dumps({{"id": job.id, "state": state, "exit_code": result.exit_code,
                          "end": result.state, "ok": result.ok, "logs": logs}}))
    """, state_home)
    assert out["state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "COMPLETED")
    assert (out["exit_code"], out["end"], out["ok"]) == (0, "COMPLETED", True)
    assert "ck-task value=py-42 " in out["logs"]
    record = json.loads(next((state_home / "clusterkit" / "jobs").glob(f"{out['id']}@*.json")).read_text())
    assert record["overrides"] == {"env.CK_VALUE": "py-42"}
    assert record["settings"]["environment"]["env"]["CK_VALUE"] == "py-42"
    assert oct(os.stat(next((state_home / "clusterkit" / "jobs").glob(f"{out['id']}@*.json"))).st_mode & 0o777) == "0o600"


def test_a_bad_override_raises_with_exit_code_and_fix(dev_cluster: Any, folder: Path, state_home: Path) -> None:
    out = run_python(dev_cluster, f"""
        import json, cluster_kit
        try:
            cluster_kit.submit({str(folder / "job.yaml")!r}, overrides={{"slurm.tme": "01:00:00"}})
        except cluster_kit.ClusterKitError as exc:
            print(json.dumps({{"code": exc.exit_code, "message": exc.message}}))
    """, state_home)
    assert out["code"] == 2
    assert "overrides['slurm.tme']: unknown key 'tme' in slurm; did you mean 'time'?" in out["message"]


def test_a_sweep_of_three_values_is_one_array_job(dev_cluster: Any, folder: Path, state_home: Path) -> None:
    env = ck_env(dev_cluster, state_home)
    done = clusterkit(dev_cluster, "submit", str(folder / "job.yaml"), "--no-preflight", "--json", "--wait",
                      "--sweep", "env.CK_VALUE=alpha,beta,gamma", "--set", "args=[2]", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    job_id = doc["job_id"]
    assert doc["array"] == "0-2"
    assert doc["sweep"] == {"0": {"env.CK_VALUE": "alpha"}, "1": {"env.CK_VALUE": "beta"},
                            "2": {"env.CK_VALUE": "gamma"}}
    assert [task["job_id"] for task in doc["tasks"]] == [f"{job_id}_0", f"{job_id}_1", f"{job_id}_2"]
    seen = {}
    for index, value in enumerate(("alpha", "beta", "gamma")):
        log = (folder / "logs" / f"ck-pyapi-{job_id}_{index}.out").read_text()
        line = re.search(r"ck-task value=(\S+) port=(\d+) index=(\d+)", log)
        assert line, log
        assert (line.group(1), line.group(3)) == (value, str(index))
        seen[index] = int(line.group(2))
    assert len(set(seen.values())) == 3, seen
    status = clusterkit(dev_cluster, "status", job_id, "--json", env=env)
    assert status.returncode == 0, status.stderr
    tasks = {task["job_id"]: task for task in json.loads(status.stdout)["tasks"]}
    assert tasks[f"{job_id}_1"]["values"] == {"env.CK_VALUE": "beta"}
    listed = clusterkit(dev_cluster, "jobs", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    (entry,) = [job for job in json.loads(listed.stdout)["jobs"] if job["job_id"] == job_id]
    assert entry["array"] == "0-2" and len(entry["sweep"]) == 3 and entry["state"] == "COMPLETED"


def test_after_holds_a_job_until_its_dependency_ends(dev_cluster: Any, folder: Path, state_home: Path) -> None:
    env = ck_env(dev_cluster, state_home)
    first = clusterkit(dev_cluster, "submit", str(folder / "job.yaml"), "--no-preflight", "--set", "args=[8]",
                       "--set", "env.CK_VALUE=first", env=env)
    first_id = job_id_of(first)
    try:
        second = clusterkit(dev_cluster, "submit", str(folder / "job.yaml"), "--no-preflight",
                            "--after", f"{first_id}:any", "--set", "env.CK_VALUE=second", env=env)
        second_id = job_id_of(second)
        time.sleep(2)
        held = json.loads(clusterkit(dev_cluster, "status", second_id, "--json", env=env).stdout)
        assert held["state"] == "PENDING" and held["reason"] == "Dependency", held
        done = clusterkit(dev_cluster, "logs", second_id, "-f", env=env)
        assert done.returncode == 0, done.stderr
        assert "ck-task value=second" in done.stdout
        firsts = json.loads(clusterkit(dev_cluster, "status", first_id, "--json", env=env).stdout)
        assert firsts["state"] == "COMPLETED"
        listed = json.loads(clusterkit(dev_cluster, "jobs", "--json", env=env).stdout)["jobs"]
        assert [job["job_id"] for job in listed][:2] == [second_id, first_id]  # newest first
        assert listed[0]["dependency"] == f"afterany:{first_id}"
        assert listed[0]["profile"] == str(folder / "ck-cpu.yaml")
    finally:
        scancel(dev_cluster, first_id)
