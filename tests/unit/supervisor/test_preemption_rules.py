"""Preemption is not completion, a hang or an OOM kill can be the script's, a node's state
decides only when Slurm has decided: the supervisor's rules on recorded Slurm text and
recorded rank files (tests/data/slurm, tests/data/flight_recorder)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from supervised import end_of
from supervised import step as next_step

from cluster_kit.analysis.culprit import find_culprit, first_failure
from cluster_kit.analysis.rank_files import (
    read_dump_folder,
    read_exceptions,
    read_failure_files,
)
from cluster_kit.slurm.outcome import parse_job_output
from cluster_kit.supervisor import decide, lock, record, slurmctl
from cluster_kit.supervisor.record import AttemptRecord

DATA = Path(__file__).resolve().parents[2] / "data"
RESILIENCE = {"max_restarts": 3, "hang_timeout": 20.0, "exclude": "blamed", "grace": 20, "max_time_requeues": 2}


def fields(name: str) -> dict[str, str]:
    """`scontrol show job -o` as slurmctl.show_job reads it."""
    out: dict[str, str] = {}
    for token in (DATA / "slurm" / name).read_text().split():
        key, sep, value = token.partition("=")
        if sep:
            out.setdefault(key, value)
    return out


# --- preemption ------------------------------------------------------------------------
def test_a_job_whose_steps_were_signalled_for_preemption_still_runs_with_its_preempt_time_set() -> None:
    job = fields("scontrol_show_job_preempting.stdout")  # GraceTime=30: recorded 2 s into the grace time
    assert (job["JobState"], job["Reason"]) == ("RUNNING", "None")
    assert decide.preempting(job)
    assert not decide.preempting(fields("scontrol_show_job_running.stdout"))
    assert decide.term_cause({"Restarts": "0"}, job) == "preempted"


def test_a_preemption_slurm_did_not_requeue_goes_on_as_a_new_job_without_blame() -> None:
    rec = record.new_record("7", RESILIENCE)
    rec.attempts.append(AttemptRecord.from_dict({"attempt": 0, "ended": "preempted"}))
    step = next_step(rec, "preempted", None, RESILIENCE, 0, requeued=False)
    assert step == {"action": "restart", "exclude": [], "exit_code": 0,
                    "why": "preemption: requeued without blame (1 of max_time_requeues 2)"}
    assert next_step(rec, "preempted", None, RESILIENCE, 0)["action"] == "requeued"


# --- a hang or an OOM kill that is the script's -----------------------------------------------
def hang_culprit(folder: str) -> dict[str, Any]:
    verdict = find_culprit(read_dump_folder(str(DATA / "flight_recorder" / folder), "hang-1"), 4)
    culprit = decide.culprit_of(verdict.ranks, ["n2"], verdict.evidence)
    signature = verdict.signature()
    assert signature is not None
    return dict(culprit, signature=signature.key, error=signature.error, where=signature.where)


def test_a_hangs_signature_is_the_culprits_place_and_the_collective_without_its_numbers() -> None:
    culprit = hang_culprit("hang")
    assert culprit["signature"] == ("hang: is not in all_reduce ## that ranks #-# wait in at "
                                    "supervised_job.py:43 in load_batch")
    assert culprit["error"] == "rank 3 is not in all_reduce #11 that ranks 0-2 wait in"
    assert hang_culprit("mismatch")["signature"] != culprit["signature"]  # broadcast where the others all_reduce


def test_the_same_hang_in_a_second_attempt_is_the_scripts_and_ends_the_chain_excluding_nothing_more() -> None:
    first = hang_culprit("hang")
    rec = record.new_record("7", RESILIENCE)
    rec.attempts.append(AttemptRecord.from_dict({"attempt": 0, "ended": "hang", "culprit": decide.recorded_culprit(first)}))
    assert decide.as_the_scripts(rec, first) is first  # once: a node's fault, as before
    step = next_step(rec, "hang", first, RESILIENCE, 137)
    assert step["action"] == "restart" and step["exclude"] == ["n2"]
    rec.exclude = ["n2"]
    again = dict(first, hosts=["n3"])
    rec.attempts.append(AttemptRecord.from_dict({"attempt": 1, "ended": "hang"}))
    scripts = decide.as_the_scripts(rec, again)
    assert scripts["kind"] == "program" and "attempt 0 hung the same way" in scripts["why"]
    step = next_step(rec, "hang", scripts, RESILIENCE, 137)
    assert step["action"] == "finish" and step["exit_code"] == 1
    assert step["why"] == ("the script hangs the same way on different nodes: rank 3 is not in all_reduce #11 "
                           "that ranks 0-2 wait in at supervised_job.py:43 in load_batch (attempt 0 on n2, "
                           "attempt 1 on n3)")


def test_a_hang_without_a_stack_of_the_blamed_rank_has_no_signature() -> None:
    files = read_dump_folder(str(DATA / "flight_recorder" / "hang"), "hang-1")
    files.pop(3)  # rank 3 wrote nothing: stuck outside Python, which may be its node's driver
    assert find_culprit(files, 4).signature() is None


def test_a_task_the_oom_killer_ended_is_a_program_error_with_the_jobs_memory() -> None:
    control = str(DATA / "flight_recorder" / "oom")
    crash = first_failure(read_exceptions(control), read_failure_files(control), 4)
    assert crash is not None and crash.kind == "node"  # the ranks alone blame the one that went silent
    verdict = parse_job_output((DATA / "slurm" / "output_oom_kill.out").read_text())
    assert verdict.oom_kills == 1
    ended, blamed = end_of(1, crash=crash, first_task=verdict.first_failure, memory="1500M per node")
    assert ended == "crash" and blamed is not None
    assert (blamed["kind"], blamed["ranks"], blamed["hosts"]) == ("program", [3], ["n2"])
    assert blamed["evidence"] == "rank 3 on n2 died: Out Of Memory (the job's memory: 1500M per node)"
    assert next_step(_one(ended, blamed), ended, blamed, RESILIENCE, 1)["exclude"] == []
    assert next_step(_one(ended, blamed), ended, blamed, dict(RESILIENCE, exclude_on="any_failure"),
                            1)["exclude"] == ["n2"]


def _one(ended: str, culprit: dict[str, Any]) -> dict[str, Any]:
    rec = record.new_record("7", RESILIENCE)
    rec.attempts.append(AttemptRecord.from_dict({"attempt": 0, "ended": ended, "culprit": culprit}))
    return rec


def test_an_exit_nobody_explained_is_the_scripts_and_twice_ends_the_chain() -> None:
    ended, blamed = end_of(3)
    assert ended == "crash" and blamed is not None and blamed["kind"] == "program" and blamed["hosts"] == []
    rec = _one(ended, blamed)
    rec.attempts.append(AttemptRecord.from_dict({"attempt": 1, "ended": ended}))
    step = next_step(rec, ended, blamed, RESILIENCE, 3)
    assert step["action"] == "finish"
    assert step["why"].startswith("the script fails the same way twice: the launch exited with 3")


# --- node states ---------------------------------------------------------------------------------
def verdicts(name: str) -> dict[str, str]:
    """{node: verdict} of `sinfo -h -N -o '%N|%T|%E|%H'` lines as the supervisor reads them."""
    states = slurmctl.parse_node_states((DATA / "slurm" / name).read_text())
    return {node: slurmctl.node_verdict(state, why) for node, (state, why, _) in states.items()}


def test_only_slurms_verdict_or_the_health_gates_drain_is_a_fault_of_the_node() -> None:
    # n2 drains for an admin's maintenance (its job runs on), n3 was drained by clusterkit's health gate
    assert verdicts("sinfo_states_drained.stdout") == {"n1": "ok", "n2": "drained", "n3": "fault",
                                                        "n4": "drained"}
    assert verdicts("sinfo_states_down.stdout") == {"n4": "fault"}
    assert slurmctl.node_verdict("idle*", "none") == "silent"  # sinfo_nodes_not_responding's n2
    assert slurmctl.node_verdict("allocated*", "none") == "silent"
    assert slurmctl.node_verdict("down*", "Not responding") == "fault"


def test_slurmd_timeout_is_read_from_scontrol_show_config() -> None:
    text = (DATA / "slurm" / "scontrol_show_config.stdout").read_text()
    assert slurmctl.parse_slurmd_timeout(text) == 30.0
    assert slurmctl.parse_slurmd_timeout("KillWait = 5 sec\n") is None


# --- the lock ------------------------------------------------------------------------------------
def test_one_supervisor_per_chain_a_fresh_lock_of_another_job_is_waited_for(tmp_path: Path) -> None:
    folder = str(tmp_path / "clusterkit-7")
    record.make_private_dir(folder)
    lock.take_lock(folder, "7")
    with pytest.raises(lock.Held, match="the supervisor of job 7 runs this chain"):
        lock.take_lock(folder, "9", wait_s=0.0)
    lock.take_lock(folder, "7", wait_s=0.0)  # a requeue of the holder's own job
    lock.release_lock(folder, "9")  # not its lock: kept
    with pytest.raises(lock.Held):
        lock.take_lock(folder, "9", wait_s=0.0)
    lock.release_lock(folder, "7")
    lock.take_lock(folder, "9", wait_s=0.0)


def test_a_lock_its_supervisor_stopped_refreshing_is_taken_over(tmp_path: Path) -> None:
    folder = str(tmp_path / "clusterkit-7")
    record.make_private_dir(folder)
    lock.take_lock(folder, "7")
    later = time.time() + lock.LOCK_STALE_S + 1
    lock.take_lock(folder, "9", wait_s=0.0, now=lambda: later)
    assert (Path(folder) / lock.LOCK_NAME).read_text() == "9\n"


# --- how an attempt whose ranks were told to stop ended --------------------------------------------
def note(control: Path, kind: str, rank: int, text: str) -> None:
    (control / kind).mkdir(exist_ok=True)
    (control / kind / f"rank-{rank}").write_text(text)


@pytest.mark.parametrize(("notes", "grace", "scontrol", "told"), [
    ([], False, "scontrol_show_job_running.stdout", (False, "")),  # nothing asked: exit 0 is completion
    ([("stopped", "SIGTERM 5.0")], False, "scontrol_show_job_preempting.stdout", (True, "preempted")),
    # srun's SIGTERM to the other tasks once one failed is no stop: the crash is read as a crash
    ([("stopped", "SIGTERM 5.0")], False, "scontrol_show_job_running.stdout", (False, "")),
    ([], True, "scontrol_show_job_running.stdout", (True, "time_limit")),  # the supervisor's grace signal
    ([("stopped", "SIGUSR1 5.0")], False, "scontrol_show_job_running.stdout", (True, "time_limit")),
    ([("stopped", "SIGTERM 5.0"), ("finished", "48 6.0")], False, "scontrol_show_job_preempting.stdout",
     (False, "")),  # training was done before the stop came
])
def test_an_attempt_stopped_without_finishing_is_requeued_never_completed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, notes: list[tuple[str, str]], grace: bool,
        scontrol: str, told: tuple[bool, str]) -> None:
    from types import SimpleNamespace

    from cluster_kit.supervisor import ending

    for kind, text in notes:
        note(tmp_path, kind, 0, text)
    monkeypatch.setattr(slurmctl, "show_job", lambda job_id: fields(scontrol))
    watched = SimpleNamespace(control=str(tmp_path), grace=grace, job_id="22")
    assert ending.stop_of(watched) == told  # type: ignore[arg-type]
