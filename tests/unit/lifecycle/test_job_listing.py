"""What submit keeps beyond Slurm's own view: the script's git commit, a sweep's index
-> values in `status --json`, and `clusterkit jobs` over the records (no cluster needed:
every record here says how its job ended)."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cluster_kit.cli import cli
from cluster_kit.lifecycle import records
from cluster_kit.lifecycle.request import build_dependency, script_provenance
from cluster_kit.report.jobs import with_sweep
from cluster_kit.slurm.runner import LocalRunner


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_record_names_the_scripts_commit_and_a_dirty_tree(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x")
    (tmp_path / "train.py").write_text("print(1)\n")
    git(tmp_path, "add", "train.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "train")
    runner = LocalRunner()
    clean = script_provenance(runner, {"script": str(tmp_path / "train.py"), "workdir": None})
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert clean == {"git_commit": head, "git_dirty": False}
    (tmp_path / "train.py").write_text("print(2)\n")
    assert script_provenance(runner, {"script": "train.py", "workdir": str(tmp_path)})["git_dirty"] is True
    assert script_provenance(runner, {"script": "/nonexistent/x.py", "workdir": None}) == {
        "git_commit": None, "git_dirty": None}


def test_dependencies_are_sbatchs_words() -> None:
    assert build_dependency(["12", "13:any", "14:notok", "15_2:ok"]) == "afterok:12,afterany:13,afternotok:14,afterok:15_2"
    assert build_dependency([]) is None


def test_status_json_maps_each_array_index_to_its_values() -> None:
    sweep = {"0": {"env.LR": "1e-3"}, "1": {"env.LR": "3e-4"}}
    doc = with_sweep({"job_id": "7", "tasks": [{"job_id": "7_0"}, {"job_id": "7_1"}, {"job_id": "7_[2-3]"}]}, sweep)
    assert doc["sweep"] == sweep
    assert [task.get("values") for task in doc["tasks"]] == [{"env.LR": "1e-3"}, {"env.LR": "3e-4"}, None]
    assert with_sweep({"job_id": "7_1"}, sweep)["values"] == {"env.LR": "3e-4"}
    assert with_sweep({"job_id": "8"}, {}) == {"job_id": "8"}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    folder = records.records_dir()
    now = time.time()
    ended = {"state": "COMPLETED", "exit_status": 0, "explanation": "done"}
    records.save(records.JobRecord(job_id="10", where="local", name="old", submitted_at=now - 3 * 86400,
                                   ended=ended), folder)
    records.save(records.JobRecord(job_id="11", where="local", name="sweep", submitted_at=now - 60,
                                   ended={**ended, "state": "FAILED", "exit_status": 1}, array="0-1%1",
                                   sweep=[{"env.LR": "1"}, {"env.LR": "2"}]), folder)
    records.save(records.JobRecord(job_id="12", where="local", name="next", submitted_at=now - 30, ended=ended,
                                   dependency="afterany:11", git_commit="abc", git_dirty=False), folder)
    return folder


def test_jobs_lists_the_recent_ones_newest_first(state: Path) -> None:
    done = CliRunner().invoke(cli, ["jobs"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [(row[0], row[1], row[2]) for row in rows] == [("12", "next", "COMPLETED"), ("11", "sweep", "FAILED")]
    assert "array 0-1%1: 2 tasks" in done.stdout and "after afterany:11" in done.stdout


def test_jobs_all_json_holds_every_record_with_its_state(state: Path) -> None:
    done = CliRunner().invoke(cli, ["jobs", "--all", "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    jobs = json.loads(done.stdout)["jobs"]
    assert [job["job_id"] for job in jobs] == ["12", "11", "10"]
    assert jobs[0]["git_commit"] == "abc" and jobs[0]["dependency"] == "afterany:11"
    assert jobs[1]["sweep"] == [{"env.LR": "1"}, {"env.LR": "2"}] and jobs[1]["state"] == "FAILED"
    assert jobs[2]["record"] == str(state / "10@local.json")
