"""A job with `resilience:` is a chain of Slurm jobs: found, followed and diagnosed from its
attempts record (tests/data/attempts) with Slurm's recorded text (tests/data/slurm)."""
from __future__ import annotations

import json
import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest
from chainrun import DATA, ChainCluster, plant_chain, running, save_chain

from cluster_kit import lifecycle
from cluster_kit.lifecycle import chains, records
from cluster_kit.lifecycle.chain_diagnosis import chain_advice
from cluster_kit.lifecycle.diagnosis import diagnose
from cluster_kit.supervisor import record


@pytest.fixture
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The jobs' output folder; job records kept under the test's folder."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    folder = tmp_path / "logs"
    folder.mkdir()
    yield folder


def submitted(job_id: str, logs: Path, resilience: dict | None = None) -> records.JobRecord:
    """The record `submit` keeps of a job (resilience as in its effective settings)."""
    rec = records.JobRecord(job_id=job_id, where="local", name="train", outputs={job_id: str(logs / f"train-{job_id}.out")},
                            settings={"resilience": resilience}, submitted_at=1.0)
    records.save(rec)
    return rec


RESILIENCE = {"max_restarts": 3}


def requeued_record(*endings: str, final: dict | None = None) -> chains.Chain:
    """Job 125's chain, each attempt run as job 125 itself: Slurm requeued it."""
    attempts = [{"attempt": n, "slurm_job_id": "125", "nodes": "n[1-2]", "ended": ended,
                 "output": "/scratch/alice/run1/logs/train-125.out"} for n, ended in enumerate(endings)]
    text = json.dumps({"format": record.FORMAT, "job_id": "125", "attempts": attempts, "final": final,
                       "resilience": RESILIENCE})
    chain = chains.parse_chain(text, "/scratch/alice/run1/logs/clusterkit-125")
    assert chain is not None
    return chain


def test_a_requeue_by_slurm_goes_on_as_the_same_job() -> None:
    preempted = requeued_record("preempted")
    assert (preempted.after("125"), preempted.current_job_id) == ("125", "125")
    assert chains.restart_line(preempted, "125") == "attempt 0 ended (preempted); Slurm requeued it as the same job"
    assert requeued_record("preempted", "running").after("125") is None  # its new run is the attempt now
    done = requeued_record("preempted", "completed", final={"ended": "completed", "exit_code": 0, "why": "completed"})
    assert done.after("125") is None
    used_up = requeued_record("preempted", final={"ended": "preempted", "exit_code": 1, "why": "..."})
    assert used_up.after("125") is None


def test_a_record_reads_as_the_chain_of_its_jobs(logs: Path) -> None:
    text = (DATA / "attempts" / "hang_then_completed.json").read_text()
    chain = chains.parse_chain(text, str(logs / "clusterkit-123"))
    assert chain is not None
    assert (chain.chain_id, chain.job_ids, chain.current_job_id, chain.exit_code) == ("123", ["123", "124"], "124", 0)
    assert chain.after("123") == "124" and chain.after("124") is None
    assert chain.ended("123") and (chain.attempt_of("124") or {}).get("nodes") == "n[1,3]"
    assert chain.path == str(logs / "clusterkit-123" / "attempts.json")
    assert chains.parse_chain('{"format": "other"}', "x") is None
    assert chains.parse_chain("{not json", "x") is None


def test_a_chain_going_on_runs_as_its_newest_job() -> None:
    data = json.loads((DATA / "attempts" / "hang_then_completed.json").read_text())
    ran = chains.parse_chain(json.dumps(running(data, 1)), "f")
    assert ran is not None and (ran.current_job_id, ran.after("123"), ran.ended("123")) == ("123", None, False)
    restarted = json.loads(json.dumps(data))
    restarted["attempts"] = restarted["attempts"][:1]
    restarted["final"] = None
    waiting = chains.parse_chain(json.dumps(restarted), "f")
    assert waiting is not None and (waiting.current_job_id, waiting.job_ids) == ("124", ["123", "124"])
    assert chains.progress(waiting) == "attempt 1 is submitted as job 124"
    assert chains.progress(ran) == "attempt 0 runs as job 123"


def test_the_first_job_finds_its_record_beside_its_output(logs: Path) -> None:
    plant_chain("hang_then_completed", logs)
    cluster = ChainCluster()
    chain = chains.find_chain(cluster, submitted("123", logs, RESILIENCE))
    assert chain is not None and chain.folder == str(logs / "clusterkit-123")
    folder = logs / "clusterkit-123"
    assert cluster.calls == [["id", "-u"], ["stat", "-c", "%u %a %F", "--", str(folder), str(folder / "attempts.json")],
                             ["cat", "--", str(folder / "attempts.json")]]


def test_a_record_another_user_could_have_written_is_not_read(logs: Path) -> None:
    plant_chain("hang_then_completed", logs)
    folder = logs / "clusterkit-123"
    os.chmod(folder, 0o777)
    cluster = ChainCluster()
    assert chains.find_chain(cluster, submitted("123", logs, RESILIENCE)) is None
    assert ["cat", "--", str(folder / "attempts.json")] not in cluster.calls
    os.chmod(folder, 0o700)
    os.chown(folder / "attempts.json", pwd.getpwnam("nobody").pw_uid, -1)
    assert chains.find_chain(cluster, submitted("123", logs, RESILIENCE)) is None


@pytest.mark.parametrize(("lines", "trusted"), [
    ("0 700 directory\n0 600 regular file\n", True),
    ("0 700 directory\n0 600 regular empty file\n", True),
    ("0 1777 directory\n0 600 regular file\n", False),
    ("0 720 directory\n0 600 regular file\n", False),
    ("0 700 directory\n0 604 regular file\n", True),
    ("0 700 directory\n0 602 regular file\n", False),
    ("0 700 directory\n1001 600 regular file\n", False),
    ("0 777 symbolic link\n0 600 regular file\n", False),
    ("0 700 directory\n0 600 fifo\n", False),
    ("0 700 directory\n", False),
])
def test_what_a_record_must_be_to_be_read(lines: str, trusted: bool) -> None:
    assert chains.owned_by(lines, "0", 2) is trusted

def test_a_job_without_resilience_reads_nothing(logs: Path) -> None:
    cluster = ChainCluster()
    assert chains.find_chain(cluster, submitted("40", logs)) is None
    assert chains.find_chain(cluster, "40") is None
    assert cluster.calls == []


def test_a_later_attempt_finds_its_chain_among_the_record_folders_beside_it(logs: Path) -> None:
    plant_chain("hang_then_completed", logs)
    plant_chain("crash_max_restarts", logs)  # clusterkit-130: above 124, not looked into
    decoy = json.loads((DATA / "attempts" / "crash_max_restarts.json").read_text())
    save_chain(logs, dict(decoy, job_id="100"))  # another chain, below 124, without it
    (logs / "clusterkit-notes").mkdir()
    cluster = ChainCluster()
    cluster.job("124", "completed", output=logs / "train-124.out")
    chain = chains.find_chain(cluster, "124")
    assert chain is not None and chain.chain_id == "123"
    grep = cluster.ran("grep")
    assert grep == [["grep", "-l", "-F", "-e", '"124"', "--", str(logs / "clusterkit-123" / "attempts.json"),
                     str(logs / "clusterkit-100" / "attempts.json")]]
    assert [argv[-1] for argv in cluster.ran("cat")] == [str(logs / "clusterkit-123" / "attempts.json")]
    assert chains.find_chain(ChainCluster(), "125", output=str(logs / "train-125.out")) is None


def test_the_search_is_bounded_to_the_nearest_folders() -> None:
    folders = [f"/o/clusterkit-{i}" for i in range(1, 40)] + ["/o/clusterkit-x", "/o/clusterkit-900"]
    assert chains.nearest_chain_ids(folders, 30) == [str(i) for i in range(30, 30 - chains.SEARCHED_FOLDERS, -1)]


def test_wait_follows_the_restart_and_exits_with_the_chains_code(logs: Path) -> None:
    data = plant_chain("hang_then_completed", logs)
    save_chain(logs, running(data, 1))  # the supervisor writes the end a moment after Slurm saw it
    submitted("123", logs, RESILIENCE)
    cluster = ChainCluster()
    cluster.job("123", "running", "killed", output=logs / "train-123.out", nodes="n[1-2]")
    cluster.job("124", "pending", "running", "completed", output=logs / "train-124.out", nodes="n[1,3]")
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            save_chain(logs, data)

    said: list[str] = []
    seen: list[str] = []
    result = lifecycle.wait(cluster, "123", on_status=lambda s: seen.append(f"{s.job_id} {s.state}"),
                            on_restart=said.append, how=lifecycle.Following(poll=0, sleep=sleep))
    assert said == [("attempt 0 ended (hang: rank 3 is not in all_reduce #11 that ranks 0-2 wait in; its stack: "
                     "supervised_job.py:43 in load_batch); restarted as job 124 without n2")]
    assert seen == ["123 RUNNING", "123 FAILED", "124 PENDING", "124 RUNNING", "124 COMPLETED"]
    assert (result.job_id, result.state, result.exit_status) == ("124", "COMPLETED", 0)
    assert result.explanation == ("job 124 finished with exit code 0: COMPLETED; "
                                  "after 2 attempts (jobs 123, 124): completed")
    doc = result.as_dict()
    assert [(a["slurm_job_id"], a["ended"]) for a in doc["attempts"]] == [("123", "hang"), ("124", "completed")]
    assert "stacks" not in doc["attempts"][0]
    first = records.find("123", "local")
    assert first is not None and first.ended == {"state": "COMPLETED", "exit_status": 0,
                                                 "explanation": result.explanation}
    restart = records.find("124", "local")  # remembered: `status 124` finds it after Slurm forgot it
    assert restart is not None and (restart.chain_id, restart.outputs) == ("123", {"124": str(logs / "train-124.out")})


def test_wait_follows_a_job_slurm_requeued_under_its_own_id_without_spinning(logs: Path) -> None:
    """Preempted, then requeued by Slurm as the same job: the end Slurm showed is not the
    chain's; the job is polled again (at the poll's pace), and the line said once."""
    preempted = {"attempt": 0, "slurm_job_id": "123", "nodes": "n[1-2]", "ended": "preempted",
                 "output": str(logs / "train-123.out"), "why": "preempted; Slurm requeues it"}
    data = {"format": record.FORMAT, "job_id": "123", "attempts": [preempted], "final": None,
            "resilience": RESILIENCE}
    save_chain(logs, data)
    submitted("123", logs, RESILIENCE)
    cluster = ChainCluster()
    cluster.job("123", "running", "cancelled", "cancelled", "pending", "running", "completed",
                output=logs / "train-123.out", nodes="n[1-2]")
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if cluster.jobs["123"].phase == "completed":
            done = dict(preempted, attempt=1, ended="completed", exit_code=0, why="completed")
            save_chain(logs, dict(data, attempts=[preempted, done],
                                  final={"ended": "completed", "exit_code": 0, "why": "completed"}))

    said: list[str] = []
    result = lifecycle.wait(cluster, "123", on_restart=said.append, how=lifecycle.Following(poll=7, sleep=sleep))
    assert said == ["attempt 0 ended (preempted); Slurm requeued it as the same job"]
    assert (result.job_id, result.state, result.exit_status) == ("123", "COMPLETED", 0)
    assert naps.count(7) >= 3 and len(naps) < 40


def test_a_chain_that_used_up_its_restarts_exits_with_the_records_code(logs: Path) -> None:
    plant_chain("crash_max_restarts", logs)
    submitted("130", logs, dict(RESILIENCE, max_restarts=1))
    cluster = ChainCluster()
    cluster.job("130", "failed", output=logs / "train-130.out")
    cluster.job("131", "failed", output=logs / "train-131.out")
    said: list[str] = []
    result = lifecycle.wait(cluster, "130", on_restart=said.append, how=lifecycle.Following(poll=0, sleep=lambda _s: None))
    assert said == [("attempt 0 ended (crash: rank 2 (n2) failed first: ValueError: batch 5 has no labels at "
                     "supervised_job.py:57 in bad_batch); restarted as job 131 without n2")]
    assert (result.job_id, result.exit_status) == ("131", 1)  # Slurm says 3: the supervisor's code counts
    assert result.explanation.endswith("; after 2 attempts (jobs 130, 131): a crash, and max_restarts (1) are used up")


def test_wait_for_a_job_without_resilience_is_as_before(logs: Path) -> None:
    submitted("40", logs)
    cluster = ChainCluster()
    cluster.job("40", "running", "failed", output=logs / "train-40.out")
    result = lifecycle.wait(cluster, "40", how=lifecycle.Following(poll=0, sleep=lambda _s: None))
    assert (result.exit_status, result.attempts) == (3, ())
    assert {argv[0] for argv in cluster.calls} == {"squeue", "scontrol", "tail"}


def test_a_record_that_never_says_the_end_leaves_the_word_to_slurm(logs: Path) -> None:
    data = plant_chain("hang_then_completed", logs)
    save_chain(logs, running(data, 1))  # the supervisor was killed with its job
    submitted("123", logs, RESILIENCE)
    cluster = ChainCluster()
    cluster.job("123", "killed", output=logs / "train-123.out")
    naps: list[float] = []
    result = lifecycle.wait(cluster, "123", how=lifecycle.Following(poll=0, sleep=naps.append))
    assert len(naps) == lifecycle.follow_loop.RECORD_READS
    assert (result.job_id, result.exit_status) == ("123", 143)
    assert "does not say how attempt 0 ended (its supervisor did not finish)" in result.explanation


def test_diagnose_a_chain_that_recovered_from_a_hang(logs: Path) -> None:
    plant_chain("hang_then_completed", logs)
    cluster = ChainCluster()
    cluster.job("123", "killed", output=logs / "train-123.out", nodes="n[1-2]")
    cluster.job("124", "completed", output=logs / "train-124.out", nodes="n[1,3]")
    doc = diagnose(cluster, "123")
    assert (doc["job_id"], doc["chain_id"], doc["state"]) == ("123", "123", "COMPLETED")
    hang, done = doc["attempts"]
    assert {k: hang[k] for k in ("attempt", "slurm_job_id", "nodes", "ended", "detected_after_s", "excluded")} == {
        "attempt": 0, "slurm_job_id": "123", "nodes": "n[1-2]", "ended": "hang", "detected_after_s": 61.4,
        "excluded": ["n2"]}
    assert hang["culprit"]["ranks"] == [3] and hang["culprit"]["hosts"] == ["n2"]
    assert "supervised_job.py\", line 43 in load_batch" in hang["stacks"]["3"]
    assert (done["slurm_job_id"], done["ended"], "culprit" in done) == ("124", "completed", False)
    assert doc["advice"] == [
        ("attempt 0 hung on n2: check n2 (clusterkit audit --nodes n2) before it runs jobs again; drain it if a "
         "check fails (audit --drain --apply)")]
    assert diagnose(cluster, "124")["job_id"] == "124"


def test_diagnose_a_chain_that_used_up_its_restarts(logs: Path) -> None:
    plant_chain("crash_max_restarts", logs)
    cluster = ChainCluster()
    cluster.job("130", "failed", output=logs / "train-130.out")
    cluster.job("131", "failed", output=logs / "train-131.out")
    doc = diagnose(cluster, "131")
    assert (doc["state"], doc["final"]["exit_code"]) == ("FAILED", 1)
    assert [a["ended"] for a in doc["attempts"]] == ["crash", "crash"]
    assert doc["advice"] == [
        ("the same failure on n2, n3 follows the script, not a node: fix it (clusterkit logs 131): rank 2 (n3) "
         "failed first: ValueError: batch 5 has no labels at supervised_job.py:57 in bad_batch"),
        ("the chain stopped: max_restarts (1) are used up after 2 failures: fix the culprit above, or raise "
         "resilience.max_restarts in the job file, and submit it again")]


def test_diagnose_a_running_chain_and_one_whose_supervisor_died(logs: Path) -> None:
    data = plant_chain("hang_then_completed", logs)
    save_chain(logs, running(data, 2))
    cluster = ChainCluster()
    cluster.job("123", "killed", output=logs / "train-123.out")
    cluster.job("124", "running", output=logs / "train-124.out", nodes="n[1,3]")
    doc = diagnose(cluster, "123")
    assert (doc["state"], doc["attempts"][-1]["ended"], "final" in doc) == ("RUNNING", "running", False)
    assert doc["advice"][-1] == "the job runs as job 124 (RUNNING): follow it with clusterkit logs -f 124"
    cluster.job("124", "cancelled", output=logs / "train-124.out")
    last = diagnose(cluster, "123")["attempts"][-1]
    assert last["ended"] == "cancelled" and "its supervisor did not record the end" in last["why"]


def test_a_node_blamed_twice_is_to_be_checked_and_drained() -> None:
    attempts = [{"attempt": 0, "slurm_job_id": "7", "ended": "hang", "culprit": {"ranks": [3], "hosts": ["n2"],
                                                                               "evidence": "..."}},
                {"attempt": 1, "slurm_job_id": "8", "ended": "node_failure",
                 "culprit": {"ranks": [], "hosts": ["n2"], "evidence": "Slurm reports node n2 failed"}}]
    chain = chains.Chain("f", "7", tuple(attempts), None, {"max_restarts": 3})
    assert chain_advice(chain, attempts, None) == [
        ("n2 was blamed by 2 attempts: check it (clusterkit audit --nodes n2) and keep jobs off it until it is "
         "fixed (drain it; audit --drain --apply drains a node that fails a check)")]


def test_output_files_of_the_attempts_in_order() -> None:
    attempts = ({"attempt": 0, "slurm_job_id": "7", "output": "/o/a.out"},
                {"attempt": 1, "slurm_job_id": "7", "output": "/o/a.out"},  # requeued by Slurm, same file
                {"attempt": 2, "slurm_job_id": "9", "output": "/o/b.out"}, {"attempt": 3, "slurm_job_id": "10"})
    chain = chains.Chain("f", "7", attempts, None, {})
    assert chains.attempt_outputs(chain) == [("attempts 0,1: job 7", "/o/a.out"), ("attempt 2: job 9", "/o/b.out")]


def test_cancel_of_a_chain_cancels_its_standby_job_first_then_the_jobs_it_runs_as(logs: Path) -> None:
    data = running(plant_chain("hang_then_completed", logs), 2)
    data["standby"] = {"job_id": "125", "after": "124"}
    save_chain(logs, data)
    cluster = ChainCluster()
    cluster.job("123", "killed", output=logs / "train-123.out")
    cluster.job("124", "running", output=logs / "train-124.out")
    assert lifecycle.cancel(cluster, "123") == [("125", True, "standby"), ("123", True, ""), ("124", True, "chain")]
    assert [argv[-1] for argv in cluster.ran("scancel")] == ["125", "123", "124"]


def test_the_restart_line_names_the_nodes_the_next_job_was_submitted_without() -> None:
    attempts = ({"attempt": 0, "slurm_job_id": "145", "ended": "hang", "excluded": ["n4"],
                 "culprit": {"evidence": "rank 3 ...", "hosts": ["n4"]}, "next_job_id": "146",
                 "without": ["n4"]},)
    chain = chains.Chain("f", "140", attempts, None, {})
    assert chains.restart_line(chain, "145") == "attempt 0 ended (hang: rank 3 ...); restarted as job 146 without n4"
    older = chains.Chain("f", "140", ({k: v for k, v in attempts[0].items() if k != "without"},), None, {})
    assert chains.restart_line(older, "145").endswith("restarted as job 146 without n4")  # a record from before


def test_a_hang_that_came_back_on_another_node_is_the_scripts_no_node_to_check() -> None:
    signature = "hang: is not in all_reduce ## that ranks #-# wait in at train.py:85 in load_batch"
    attempts = [{"attempt": 0, "slurm_job_id": "7", "ended": "hang", "culprit": {
                    "ranks": [3], "hosts": ["n2"], "evidence": "...", "kind": "node", "signature": signature}},
                {"attempt": 1, "slurm_job_id": "7", "ended": "hang", "culprit": {
                    "ranks": [3], "hosts": ["n3"], "evidence": "...", "kind": "program", "signature": signature}}]
    why = "the script hangs the same way on different nodes: rank 3 ... (attempt 0 on n2, attempt 1 on n3)"
    chain = chains.Chain("f", "7", tuple(attempts), {"ended": "hang", "exit_code": 1, "why": why},
                         {"max_restarts": 3})
    assert chain_advice(chain, attempts, None) == [
        (f"the chain stopped: {why}: no node is to blame; fix the script at that place (its stack is above), "
         "then submit the job again")]
