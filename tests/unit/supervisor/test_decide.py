"""The supervisor's decisions: when a rank hangs, how an attempt ended, what comes next."""
from __future__ import annotations

from pathlib import Path

import pytest
from supervised import attempt, end_of, observe, step
from supervised import chain as chain_of

from cluster_kit.analysis.culprit import first_failure
from cluster_kit.analysis.rank_files import parse_exception
from cluster_kit.slurm.outcome import parse_job_output
from cluster_kit.supervisor import decide
from cluster_kit.supervisor.record import ChainRecord

RESILIENCE = {"max_restarts": 2, "hang_timeout": 20.0, "exclude": "blamed", "grace": 20,
              "max_time_requeues": 1, "checkpoint_dir": None}
DATA = Path(__file__).resolve().parents[2] / "data"


def test_a_rank_that_stops_stepping_stalls_after_hang_timeout() -> None:
    clock = decide.HangClock(world_size=4, hang_timeout=20, started=1000.0)
    for rank in range(4):
        observe(clock, rank, 5, 1010.0)
    for rank in (0, 1, 2):
        observe(clock, rank, 6, 1011.0)  # rank 3 never finishes step 6
    assert clock.stalled(1030.5) == [3]
    assert clock.stalled(1031.5) == [0, 1, 2, 3]  # the others wait for it, in the end
    assert clock.stalled_since([3]) == 1010.0


def test_the_same_step_count_again_is_no_progress() -> None:
    clock = decide.HangClock(world_size=1, hang_timeout=20, started=0.0)
    observe(clock, 0, 5, 10.0)
    observe(clock, 0, 5, 25.0)  # the watcher rewrote the same count
    assert clock.stalled(31.0) == [0]


def test_startup_gets_more_time_than_a_step_and_a_silent_rank_counts_from_the_first_beat() -> None:
    clock = decide.HangClock(world_size=2, hang_timeout=20, started=0.0)
    assert clock.stalled(decide.STARTUP_S - 1) == []
    assert clock.stalled(decide.STARTUP_S + 1) == [0, 1]
    clock = decide.HangClock(world_size=2, hang_timeout=20, started=0.0)
    observe(clock, 0, 1, 100.0)
    assert clock.stalled(119.0) == [] and clock.stalled(121.0) == [0, 1]


def test_how_an_attempt_ended() -> None:
    hang = decide.culprit_of([3], ["n2"], "rank 3 is not in all_reduce #9")
    assert end_of(1, hang=hang) == ("hang", hang)
    assert end_of(0, grace=True) == ("time_limit", None)
    assert end_of(143, cancelled=True, hang=hang) == ("cancelled", None)
    assert end_of(0) == ("completed", None)
    ended, blamed = end_of(137, failed_nodes=["n2"])
    assert (ended, blamed["hosts"], blamed["ranks"]) == ("node_failure", ["n2"], [])


def test_a_crash_blames_the_rank_that_raised_and_srun_names_its_node() -> None:
    traceback = ("rank: 3\nhost: n2\npid: 9\nsteps: 8\ntime: 5.0\n\nTraceback (most recent call last):\n"
                 '  File "/w/train.py", line 88, in main\n    raise RuntimeError("planted")\n'
                 "RuntimeError: planted\n")
    crash = first_failure([parse_exception(traceback, 3, 5.0)])
    srun = parse_job_output("srun: error: n2: task 3: Exited with exit code 1\n"
                            "srun: error: n1: tasks 0-1: Terminated\n")
    ended, blamed = end_of(1, crash=crash, first_task=srun.first_failure)
    assert (ended, blamed["ranks"], blamed["hosts"]) == ("crash", [3], ["n2"])
    assert "RuntimeError: planted" in blamed["evidence"] and "train.py:88" in blamed["evidence"]
    ended, blamed = end_of(1, first_task=srun.first_failure)  # no exception file
    assert blamed == {"ranks": [3], "hosts": ["n2"], "evidence": "rank 3 on n2 exited with exit code 1",
                      "kind": "program",
                      "why": "exited with exit code 1 without a Python traceback: the script's own exit"}


def chain(*endings: tuple[str, list[str]]) -> ChainRecord:
    return chain_of(RESILIENCE, *endings)


def test_failures_restart_without_the_blamed_nodes_until_max_restarts() -> None:
    hang = decide.culprit_of([3], ["n2"], "...")
    made = step(chain(("hang", [])), "hang", hang, RESILIENCE, 1)
    assert (made["action"], made["exclude"]) == ("restart", ["n2"])
    assert made["why"] == "a hang: restart 1 of max_restarts 2 without n2"
    rec = chain(("hang", ["n2"]), ("crash", []))
    made = step(rec, "crash", decide.culprit_of([0], ["n1"], "..."), RESILIENCE, 1)
    assert made["exclude"] == ["n2", "n1"]
    rec = chain(("hang", ["n2"]), ("crash", ["n1"]), ("node_failure", []))
    made = step(rec, "node_failure", decide.culprit_of([], ["n3"], "..."), RESILIENCE, 137)
    assert made == {"action": "finish", "exclude": [], "exit_code": 1,
                    "why": "a node failure, and max_restarts (2) are used up"}


def test_exclude_never_restarts_on_the_same_nodes() -> None:
    made = step(chain(("hang", [])), "hang", decide.culprit_of([3], ["n2"], "..."),
                            dict(RESILIENCE, exclude="never"), 1)
    assert (made["action"], made["exclude"]) == ("restart", [])


def test_the_time_limit_requeues_without_blame_and_does_not_use_max_restarts() -> None:
    rec = chain(("hang", ["n2"]), ("hang", []), ("time_limit", []))
    made = step(rec, "time_limit", None, RESILIENCE, 0)
    assert (made["action"], made["exclude"], made["exit_code"]) == ("restart", ["n2"], 0)
    assert made["why"] == "the time limit: requeued without blame (1 of max_time_requeues 1)"
    rec.attempts.append(attempt(3, "time_limit"))
    assert step(rec, "time_limit", None, RESILIENCE, 0)["why"] == \
        "the time limit, and max_time_requeues (1) are used up"


def test_a_requeue_by_slurm_goes_on_as_the_same_job_within_max_time_requeues() -> None:
    """Preemption or `scontrol requeue`: Slurm runs the job again itself, so nothing is
    submitted; it counts with the time-limit requeues, without blame."""
    rec = chain(("hang", ["n2"]), ("preempted", []))
    made = step(rec, "preempted", None, RESILIENCE, 143)
    assert made == {"action": "requeued", "exclude": ["n2"], "exit_code": 143,
                    "why": "preemption (or scontrol requeue): Slurm requeued the job, which runs again as "
                           "itself (1 of max_time_requeues 1)"}
    rec.attempts.append(attempt(2, "time_limit"))
    assert step(rec, "preempted", None, RESILIENCE, 143) == {
        "action": "finish", "exclude": [], "exit_code": 1,
        "why": "preemption (or scontrol requeue), and max_time_requeues (1) are used up"}


@pytest.mark.parametrize("how, code", [("completed", 0), ("cancelled", 143)])
def test_completed_and_cancelled_end_the_chain(how: str, code: int) -> None:
    made = step(chain((how, [])), how, None, RESILIENCE, code)
    assert (made["action"], made["exit_code"]) == ("finish", code)


def test_the_nodes_excluded_first_come_back_when_too_few_would_be_left() -> None:
    rec = chain(("hang", ["n2"]), ("crash", []))
    made = step(rec, "crash", decide.culprit_of([0], ["n1"], "..."), RESILIENCE, 1,
                            partition=["n1", "n2", "n3"], needed=2)
    assert made["exclude"] == ["n1"]
    assert made["why"] == "a crash: restart 2 of max_restarts 2 without n1 (n2 back in: a 2-node job needs them)"
    enough = step(rec, "crash", decide.culprit_of([0], ["n1"], "..."), RESILIENCE, 1,
                              partition=["n1", "n2", "n3", "n4"], needed=2)
    assert enough["exclude"] == ["n2", "n1"]


def test_only_allocated_nodes_can_be_excluded() -> None:
    told = decide.culprit_of([3], ["n2", "--partition=evil"], "what a rank wrote")
    assert decide.excludable(told, ["n1", "n2"])["hosts"] == ["n2"]
    assert decide.excludable(None, ["n1"]) is None
