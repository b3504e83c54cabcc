"""A bug in the script is not a node: whose fault a crash is decides what the next attempt runs without.

The crashes come from the recorded exception files of tests/data/flight_recorder read
as the supervisor reads them (culprit.first_failure), and the chain is played as
supervisor/job.py plays it: attempt_end, the record, next_step.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from supervised import end_of
from supervised import step as next_step

from cluster_kit.analysis.culprit import WAITED_FOR, Crash, first_failure
from cluster_kit.analysis.rank_files import (
    ExceptionReport,
    read_exceptions,
    read_failure_files,
)
from cluster_kit.slurm.outcome import parse_job_output
from cluster_kit.supervisor import decide, record
from cluster_kit.supervisor.record import AttemptRecord

DATA = Path(__file__).resolve().parents[2] / "data" / "flight_recorder"
RESILIENCE = {"max_restarts": 3, "hang_timeout": 20.0, "exclude": "blamed", "grace": 20,
              "max_time_requeues": 1, "checkpoint_dir": None}
PYTHON_EXCEPTION = "a Python exception raised by the script (a program error: the same on any node)"


def crash_of(folder: str, world_size: int = 4) -> Crash:
    crash = first_failure(read_exceptions(str(DATA / folder)), read_failure_files(str(DATA / folder)), world_size)
    assert crash is not None
    return crash


def test_a_python_exception_is_a_program_error_with_its_signature_and_detection_time() -> None:
    crash = crash_of("crash")
    ended, blamed = end_of(1, crash=crash, now=crash.time + 4)  # type: ignore[operator]
    assert ended == "crash"
    assert blamed == {
        "ranks": [2], "hosts": ["vm"], "kind": "program", "why": PYTHON_EXCEPTION,
        "evidence": "rank 2 (vm) failed first: ValueError: batch 5 has no labels at supervised_job.py:57 in bad_batch",
        "signature": "ValueError: batch # has no labels at supervised_job.py:57",
        "error": "ValueError: batch 5 has no labels", "where": "supervised_job.py:57", "detected_after_s": 4.0}
    assert decide.recorded_culprit(blamed) == {k: v for k, v in blamed.items() if k != "detected_after_s"}


def test_detection_time_is_never_negative_and_absent_without_a_time() -> None:
    crash = crash_of("crash")
    assert end_of(1, crash=crash, now=crash.time - 30)[1]["detected_after_s"] == 0.0  # type: ignore[operator,index]
    assert "detected_after_s" not in end_of(1, crash=crash)[1]  # type: ignore[operator]
    assert "detected_after_s" not in end_of(1, crash=dataclasses.replace(crash, time=None), now=5.0)[1]  # type: ignore[operator]


def test_the_rank_the_others_waited_for_is_a_node_fault_on_its_own_node() -> None:
    crash = crash_of("timeout")
    ended, blamed = end_of(1, crash=crash, now=crash.time + 1.26)  # type: ignore[operator]
    assert (ended, blamed["ranks"], blamed["hosts"], blamed["kind"], blamed["why"]) == (
        "crash", [3], ["vm"], "node", WAITED_FOR)
    assert "signature" not in blamed and blamed["detected_after_s"] == 1.3


def test_a_blamed_rank_that_named_no_node_gets_its_placement_never_a_victims_node() -> None:
    silent = dataclasses.replace(crash_of("timeout"), host="", hosts=())
    srun = parse_job_output("srun: error: n1: task 0: Exited with exit code 1\n").first_failure
    assert end_of(1, crash=silent, first_task=srun)[1]["hosts"] == []  # type: ignore[index]
    placed = end_of(1, crash=silent, first_task=srun, node_of_rank={3: "n2"}.get)[1]
    assert placed is not None and placed["hosts"] == ["n2"]
    own = parse_job_output("srun: error: n2: task 3: Exited with exit code 1\n").first_failure
    assert end_of(1, crash=silent, first_task=own)[1]["hosts"] == ["n2"]  # type: ignore[index]


def test_srun_alone_a_signal_is_the_nodes_and_an_exit_code_the_programs() -> None:
    for line, kind, why in [
        ("srun: error: n2: task 3: Segmentation fault (core dumped)", "node", "killed by a signal"),
        ("srun: error: n2: task 3: Exited with exit code 2", "program",
         "exited with exit code 2 without a Python traceback: the script's own exit"),
    ]:
        ended, blamed = end_of(139, first_task=parse_job_output(line + "\n").first_failure)
        assert (ended, blamed["hosts"], blamed["kind"], blamed["why"]) == ("crash", ["n2"], kind, why)  # type: ignore[index]


def test_hangs_and_failed_nodes_are_node_faults() -> None:
    hang = {"ranks": [3], "hosts": ["n2"], "evidence": "rank 3 is not in all_reduce #9"}  # as job.py builds it
    assert end_of(1, hang=hang)[1] == dict(hang, kind="node")
    assert end_of(137, failed_nodes=["n3"])[1]["kind"] == "node"  # type: ignore[index]


# --- the chain ---------------------------------------------------------------------------------
ZERO_DIVISION = ('Traceback (most recent call last):\n  File "/home/alice/train.py", line 41, in <module>\n'
                 '    main()\n  File "/home/alice/train.py", line 4, in scale\n    return total / count\n'
                 'ZeroDivisionError: division by zero\n')


class Chain:
    """The attempts of one job as job.py records them, each on its nodes."""

    def __init__(self, resilience: dict[str, Any]) -> None:
        self.record = record.new_record("7", resilience)

    def attempt(self, nodes: list[str], crash: Crash) -> dict[str, Any]:
        attempt = AttemptRecord(len(self.record.attempts), "7", ",".join(nodes))
        self.record.attempts.append(attempt)
        ended, blamed = end_of(1, crash=crash)
        attempt.ended, attempt.culprit = ended, decide.recorded_culprit(blamed or {})
        step = next_step(self.record, ended, decide.excludable(blamed, nodes), self.record.resilience, 1)
        if step["action"] == "restart":
            attempt.excluded = [n for n in step["exclude"] if n not in self.record.excluded_nodes()]
            self.record.exclude = step["exclude"]
        return step


def raised_on(node: str, text: str = ZERO_DIVISION) -> Crash:
    crash = first_failure([ExceptionReport(1, node, 100.0, text)])
    assert crash is not None
    return crash


def test_the_same_bug_on_another_node_ends_the_chain_without_excluding_anyone() -> None:
    """Issue 36: a ZeroDivisionError in every attempt had n1, then n2 excluded and used up max_restarts."""
    chain = Chain(RESILIENCE)
    first = chain.attempt(["n1", "n2"], raised_on("n1"))
    assert first == {"action": "restart", "exclude": [], "exit_code": 1,
                     "why": "a crash: restart 1 of max_restarts 3; a program error excludes no node "
                            "(exclude_on: node_faults)"}
    second = chain.attempt(["n1", "n2"], raised_on("n2"))
    assert second == {"action": "finish", "exclude": [], "exit_code": 1,
                      "why": "the script fails the same way on different nodes: ZeroDivisionError: division by "
                             "zero at train.py:4 (attempt 0 on n1, attempt 1 on n2)"}


def test_the_same_bug_on_the_same_node_is_said_as_it_is() -> None:
    chain = Chain(RESILIENCE)
    chain.attempt(["n1"], raised_on("n1"))
    assert chain.attempt(["n1"], raised_on("n1"))["why"] == (
        "the script fails the same way twice: ZeroDivisionError: division by zero at train.py:4 "
        "(attempts 0 and 1 on n1)")


def test_numbers_in_the_message_do_not_make_another_error_and_another_line_does() -> None:
    chain = Chain(RESILIENCE)
    shard = ZERO_DIVISION.replace("ZeroDivisionError: division by zero", "KeyError: 'shard 7'")
    chain.attempt(["n1", "n2"], raised_on("n1", shard))
    elsewhere = shard.replace("line 4, in scale", "line 9, in scale")
    assert chain.attempt(["n1", "n2"], raised_on("n2", elsewhere))["action"] == "restart"
    last = chain.attempt(["n1", "n2"], raised_on("n2", shard.replace("shard 7", "shard 12")))
    assert last["action"] == "finish" and last["why"].startswith(
        "the script fails the same way on different nodes: KeyError: 'shard 12' at train.py:4 (attempt 0 on n1, "
        "attempt 2 on n2)")


def test_any_failure_excludes_the_node_of_a_program_error_too() -> None:
    chain = Chain(dict(RESILIENCE, exclude_on="any_failure"))
    step = chain.attempt(["n1", "n2"], raised_on("n1"))
    assert (step["exclude"], step["why"]) == (["n1"], "a crash: restart 1 of max_restarts 3 without n1")
    # the same error again still ends the chain
    assert chain.attempt(["n2", "n3"], raised_on("n2"))["action"] == "finish"


def test_a_node_fault_excludes_its_node_and_a_program_error_keeps_the_earlier_exclusions() -> None:
    chain = Chain(RESILIENCE)
    ecc = ZERO_DIVISION.replace("ZeroDivisionError: division by zero",
                                "torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered")
    step = chain.attempt(["n1", "n2"], raised_on("n2", ecc))
    assert (step["exclude"], step["why"]) == (["n2"], "a crash: restart 1 of max_restarts 3 without n2")
    step = chain.attempt(["n1", "n3"], raised_on("n3"))
    assert (step["exclude"], step["why"]) == (
        ["n2"], ("a crash: restart 2 of max_restarts 3 without n2; a program error excludes no node "
                "(exclude_on: node_faults)"))


def test_exclude_never_says_nothing_of_exclude_on() -> None:
    chain = Chain(dict(RESILIENCE, exclude="never"))
    assert chain.attempt(["n1"], raised_on("n1"))["why"] == "a crash: restart 1 of max_restarts 3"


def test_an_earlier_record_without_kinds_counts_as_node_faults() -> None:
    rec = record.new_record("7", RESILIENCE)
    rec.attempts = [AttemptRecord.from_dict({"attempt": 0, "ended": "crash", "culprit": {"ranks": [1], "hosts": ["n1"], "evidence": "x"}})]
    assert decide.excludes(rec.attempts[0].culprit, RESILIENCE)
    assert decide.same_program_error(rec, rec.attempts[0].culprit) is None
    assert decide.same_program_error(record.new_record("7", RESILIENCE), {"kind": "program", "signature": "s"}) is None
