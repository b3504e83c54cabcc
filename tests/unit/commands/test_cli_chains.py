"""`submit --wait`, `status`, `logs` and `diagnose` of a job with `resilience:` follow its
chain of attempts (in-process commands; Slurm's recorded text, attempts records of
tests/data/attempts, real files)."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import clirun
import pytest
from clirun import ck

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lifecycle"))
from chainrun import ChainCluster, plant_chain, running, save_chain

from cluster_kit.api import Job
from cluster_kit.app import App
from cluster_kit.lifecycle import records
from cluster_kit.slurm.runner import Completed

work = clirun.work  # the fixture: an empty folder as cwd and HOME

HANG = "rank 3 is not in all_reduce #11 that ranks 0-2 wait in; its stack: supervised_job.py:43 in load_batch"


@pytest.fixture
def cluster(work: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ChainCluster]:
    """Every command's Slurm is the recorded one; records under the test's folder."""
    monkeypatch.setenv("XDG_STATE_HOME", str(work / "state"))
    monkeypatch.setattr("time.sleep", lambda _s: None)  # the polls of --wait and -f
    found = ChainCluster()
    monkeypatch.setattr(App, "runner", lambda self, data: found)
    (work / "logs").mkdir()
    yield found


def recovered(cluster: ChainCluster, logs: Path) -> None:
    """Job 123 hung on n2 and was restarted as job 124, which completed."""
    plant_chain("hang_then_completed", logs)
    cluster.job("123", "killed", output=logs / "train-123.out", nodes="n[1-2]")
    cluster.job("124", "completed", output=logs / "train-124.out", nodes="n[1,3]")


def test_status_lists_the_attempts(work: Path, cluster: ChainCluster) -> None:
    recovered(cluster, work / "logs")
    done = ck("status", "124")
    assert done.exit_code == 0, done.stderr
    table = done.stdout.split("job 124 finished with exit code 0: COMPLETED\n", 1)[1]
    assert table == (
        "ATTEMPT  JOB  NODES   ENDED      CULPRIT\n"
        f"0        123  n[1-2]  hang       {HANG}; excluded n2\n"
        "1        124  n[1,3]  completed  -\n"
        "after 2 attempts (jobs 123, 124): completed\n")
    doc = json.loads(ck("status", "123", "--json").stdout)
    assert [a["ended"] for a in doc["attempts"]] == ["hang", "completed"]
    assert doc["chain"] == {"job_id": "123", "current_job_id": "124", "record": str(
        work / "logs" / "clusterkit-123" / "attempts.json"), "final": {"ended": "completed", "exit_code": 0,
                                                                       "why": "completed"}}
    assert doc["outcome"]["exit_code"] == 143  # job 123's own end


def test_diagnose_tells_each_attempt(work: Path, cluster: ChainCluster) -> None:
    recovered(cluster, work / "logs")
    done = ck("diagnose", "123")
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:4] == [
        "attempt 0 (job 123, nodes n[1-2]): hang (exit code 143), found after 61.4 s",
        f"  culprit: {HANG}",
        "  blamed: rank(s) 3 on n2",
        "  stack of rank 3 (last lines):"]
    assert lines[4:10][-1].endswith('supervised_job.py", line 257 in <module>')
    assert lines[10:] == [
        "  excluded from the next attempts: n2",
        "  then: a hang: restart 1 of max_restarts 3 without n2; restarted as job 124",
        "attempt 1 (job 124, nodes n[1,3]): completed (exit code 0)",
        "  then: completed",
        "chain of job 123: completed (exit code 0); Slurm state COMPLETED",
        ("advice: attempt 0 hung on n2: check n2 (clusterkit audit --nodes n2) before it runs jobs again; drain "
         "it if a check fails (audit --drain --apply)")]
    doc = json.loads(ck("diagnose", "123", "--json").stdout)
    assert set(doc) == {"job_id", "chain_id", "state", "attempts", "final", "advice"}
    assert doc["attempts"][0]["culprit"]["hosts"] == ["n2"] and "3" in doc["attempts"][0]["stacks"]


def test_logs_print_every_attempt_under_its_header(work: Path, cluster: ChainCluster) -> None:
    logs = work / "logs"
    recovered(cluster, logs)
    done = ck("logs", "123")
    assert done.exit_code == 0, done.stderr
    assert done.stdout == (
        f"==> attempt 0: job 123: {logs}/train-123.out <==\n"
        "attempt 0 of job 123 starts\nstep 5 loss 0.91 (job 123)\n"
        f"==> attempt 1: job 124: {logs}/train-124.out <==\n"
        "attempt 1 of job 123 starts\nstep 5 loss 0.91 (job 124)\n")


def crash_then_restart_fails(cluster: ChainCluster, logs: Path, last_line: str) -> None:
    """Job 130 crashed and runs again as 131, which writes `last_line` between two polls,
    fails and ends the chain."""
    data = plant_chain("crash_max_restarts", logs)
    save_chain(logs, running(data, 2))
    cluster.job("130", "failed", output=logs / "train-130.out")
    cluster.job("131", "running", "running", "failed", output=logs / "train-131.out")
    writes = iter([lambda: (logs / "train-131.out").open("a").write(last_line),
                   lambda: save_chain(logs, data)])
    real_run = cluster.run

    def run(argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0) -> Completed:
        if argv[0] == "squeue" and argv[2] == "--jobs=131":
            next(writes, lambda: None)()  # the job writes, then its supervisor ends the chain
        return real_run(argv, stdin, timeout)

    cluster.run = run  # type: ignore[method-assign]


def test_logs_follow_the_chain_to_its_end(work: Path, cluster: ChainCluster) -> None:
    logs = work / "logs"
    crash_then_restart_fails(cluster, logs, "ValueError: batch 5 has no labels\n")
    done = ck("logs", "-f", "130")
    assert done.exit_code == 1, done.stderr
    assert done.stdout.endswith(f"==> attempt 1: job 131: {logs}/train-131.out <==\n"
                                "attempt 1 of job 130 starts\nstep 5 loss 0.91 (job 131)\n"
                                "ValueError: batch 5 has no labels\n")
    assert done.stdout.count("==> attempt 1") == 1
    assert done.stderr.endswith("; after 2 attempts (jobs 130, 131): a crash, and max_restarts (1) are used up\n")


def test_the_python_api_reads_every_attempt_under_its_header(work: Path, cluster: ChainCluster) -> None:
    logs = work / "logs"
    recovered(cluster, logs)
    assert list(Job("123").logs()) == [
        f"==> attempt 0: job 123: {logs}/train-123.out <==\n",
        "attempt 0 of job 123 starts\n", "step 5 loss 0.91 (job 123)\n",
        f"==> attempt 1: job 124: {logs}/train-124.out <==\n",
        "attempt 1 of job 123 starts\n", "step 5 loss 0.91 (job 124)\n"]


def test_the_python_api_follows_the_chain_through_its_restart(work: Path, cluster: ChainCluster) -> None:
    """logs(follow=True) gives the restart's lines once each, its last one (written
    between two polls) without a newline, as written."""
    logs = work / "logs"
    crash_then_restart_fails(cluster, logs, "ValueError: batch 5 has no labels")
    lines = list(Job("130").logs(follow=True))
    assert lines[-4:] == [f"==> attempt 1: job 131: {logs}/train-131.out <==\n",
                          "attempt 1 of job 130 starts\n", "step 5 loss 0.91 (job 131)\n",
                          "ValueError: batch 5 has no labels"]
    assert lines[0] == f"==> attempt 0: job 130: {logs}/train-130.out <==\n"


def test_the_python_api_waits_for_a_queued_chain_to_start(work: Path, cluster: ChainCluster) -> None:
    """A job submitted with `resilience:` has no attempts record until its supervisor
    starts: following it waits for the record rather than reading its file as a plain job's."""
    logs = work / "logs"
    data = plant_chain("hang_then_completed", logs)
    chain_folder = logs / "clusterkit-123"
    (chain_folder / "attempts.json").unlink()
    records.save(records.JobRecord(job_id="123", where="local", outputs={"123": str(logs / "train-123.out")},
                                   settings={"resilience": {"max_restarts": 3}}))
    cluster.job("123", "pending", "pending", "killed", output=logs / "train-123.out", nodes="n[1-2]")
    cluster.job("124", "completed", output=logs / "train-124.out", nodes="n[1,3]")
    polls = iter([None, lambda: save_chain(logs, data)])
    real_run = cluster.run

    def run(argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0) -> Completed:
        if argv[0] == "squeue" and argv[2] == "--jobs=123":
            (next(polls, None) or (lambda: None))()  # the second poll finds it started
        return real_run(argv, stdin, timeout)

    cluster.run = run  # type: ignore[method-assign]
    lines = list(Job("123").logs(follow=True))
    assert lines == [f"==> attempt 0: job 123: {logs}/train-123.out <==\n",
                     "attempt 0 of job 123 starts\n", "step 5 loss 0.91 (job 123)\n",
                     f"==> attempt 1: job 124: {logs}/train-124.out <==\n",
                     "attempt 1 of job 123 starts\n", "step 5 loss 0.91 (job 124)\n"]


def test_the_python_api_stops_following_when_the_last_job_ends_without_a_restart(
        work: Path, cluster: ChainCluster) -> None:
    """A supervisor killed with its job leaves the record `running`, with no restart
    after it: following ends with the job, not never."""
    logs = work / "logs"
    save_chain(logs, running(plant_chain("hang_then_completed", logs), 1))
    cluster.job("123", "running", "killed", output=logs / "train-123.out", nodes="n[1-2]")
    real_run = cluster.run

    def run(argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0) -> Completed:
        assert len(cluster.calls) < 50, "logs(follow=True) is still polling a job that ended"
        return real_run(argv, stdin, timeout)

    cluster.run = run  # type: ignore[method-assign]
    assert list(Job("123").logs(follow=True)) == [
        f"==> attempt 0: job 123: {logs}/train-123.out <==\n",
        "attempt 0 of job 123 starts\n", "step 5 loss 0.91 (job 123)\n"]


JOB = ("profile: local-dev\nscript: train.py\nnodes: 2\noutput: {logs}/train-%j.out\n"
       "resilience:\n  max_restarts: 3\n  hang_timeout: 60\n")


def submit_job(work: Path) -> Path:
    (work / "train.py").write_text("print('hi')\n")
    job = work / "job.yaml"
    job.write_text(JOB.format(logs=work / "logs"))
    return job


def test_submit_wait_follows_the_restarts(work: Path, cluster: ChainCluster) -> None:
    logs = work / "logs"
    plant_chain("hang_then_completed", logs)
    cluster.submitted.append("123")
    cluster.job("123", "running", "running", "killed", output=logs / "train-123.out", nodes="n[1-2]")
    cluster.job("124", "pending", "running", "completed", output=logs / "train-124.out", nodes="n[1,3]")
    done = ck("submit", str(submit_job(work)), "--no-preflight", "--wait", "--json")
    assert done.exit_code == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"clusterkit: attempt 0 ended (hang: {HANG}); restarted as job 124 without n2",
        "job 124 finished with exit code 0: COMPLETED; after 2 attempts (jobs 123, 124): completed"]
    doc = json.loads(done.stdout)
    assert (doc["job_id"], doc["state"], doc["exit_code"]) == ("123", "COMPLETED", 0)  # the job submitted
    assert [(a["slurm_job_id"], a["ended"]) for a in doc["attempts"]] == [("123", "hang"), ("124", "completed")]
    assert records.find("124", "local").chain_id == "123"  # type: ignore[union-attr]


def test_ctrl_c_names_the_job_the_chain_runs_as(work: Path, cluster: ChainCluster) -> None:
    logs = work / "logs"
    plant_chain("hang_then_completed", logs)
    cluster.submitted.append("123")
    cluster.job("123", "running", "killed", output=logs / "train-123.out")
    cluster.job("124", "running", output=logs / "train-124.out")
    cluster.interrupt_at = ("124", 2)
    done = ck("submit", str(submit_job(work)), "--no-preflight", "--wait")
    assert done.exit_code == 130
    assert done.stderr.splitlines()[-1] == "job 124 is still running; stop it with: clusterkit cancel 124"


def test_a_job_without_resilience_reads_no_attempts_record(work: Path, cluster: ChainCluster) -> None:
    logs = work / "logs"
    (logs / "train-40.out").write_text("hello\n")
    records.save(records.JobRecord(job_id="40", where="local", outputs={"40": str(logs / "train-40.out")},
                                   settings={"resilience": None}))
    cluster.job("40", "failed", output=logs / "train-40.out")
    for command in (["status", "40"], ["logs", "40"], ["diagnose", "40", "--json"]):
        ck(*command)
    assert {argv[0] for argv in cluster.calls} == {"squeue", "scontrol", "tail"}
    assert "attempts" not in json.loads(ck("status", "40", "--json").stdout)

