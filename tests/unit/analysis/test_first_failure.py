"""Which rank failed first, and the one line a user reads about it, on hand-written exception files."""
from __future__ import annotations

from cluster_kit.analysis.culprit import Crash, first_failure
from cluster_kit.analysis.faults import Signature
from cluster_kit.analysis.rank_files import ExceptionReport

TRACEBACK = """Traceback (most recent call last):
  File "/job/train.py", line 88, in load_batch
    batch = next(it)
ValueError: bad shard 7
"""
PEER = """Traceback (most recent call last):
  File "/job/train.py", line 120, in step
    dist.all_reduce(t)
RuntimeError: Connection reset by peer
"""
FAULT = """Fatal Python error: Segmentation fault

Current thread 0x00007f (most recent call first):
  File "/job/model.py", line 12 in forward
"""


def test_no_reports_no_culprit() -> None:
    assert first_failure([]) is None


def test_a_rank_failing_by_itself_wins_over_an_earlier_one_that_lost_a_peer() -> None:
    crash = first_failure([
        ExceptionReport(3, "node-b", 100.0, PEER),
        ExceptionReport(5, "node-c", 200.0, TRACEBACK),
    ])
    assert crash == Crash(5, "node-c", 200.0, tuple(TRACEBACK.strip().splitlines()[-4:]),
                          "rank 5 (node-c) failed first: ValueError: bad shard 7 at train.py:88 in load_batch",
                          "program", "a Python exception raised by the script (a program error: the same on any node)",
                          Signature("ValueError: bad shard 7", "train.py:88", "ValueError: bad shard # at train.py:88"),
                          (5,), ("node-c",))


def test_earliest_time_then_lowest_rank_and_a_time_not_known_goes_last() -> None:
    reports = [ExceptionReport(1, "", None, TRACEBACK), ExceptionReport(4, "a", 50.0, TRACEBACK),
               ExceptionReport(2, "b", 50.0, TRACEBACK), ExceptionReport(0, "c", 60.0, TRACEBACK)]
    crash = first_failure(reports)
    assert crash is not None and (crash.rank, crash.time) == (2, 50.0)
    # no time at all: the lowest rank; no host: no parentheses
    crash = first_failure([ExceptionReport(6, "", None, TRACEBACK), ExceptionReport(1, "", None, TRACEBACK)])
    assert crash is not None and crash.rank == 1 and crash.time is None
    assert crash.evidence == "rank 1 failed first: ValueError: bad shard 7 at train.py:88 in load_batch"


def test_fault_headline_is_its_first_line() -> None:
    crash = first_failure([ExceptionReport(0, "n", 1.0, FAULT, fault=True)])
    assert crash is not None
    assert crash.evidence == ("rank 0 (n) died of a fatal signal first: "
                              "Fatal Python error: Segmentation fault at model.py:12 in forward")
    assert (crash.kind, crash.why, crash.signature) == (
        "node", "died of a fatal signal (Fatal Python error: Segmentation fault)", None)


def test_a_fault_after_the_ranks_own_exception_is_its_aftermath() -> None:
    """A process that aborts on its way out after raising (as after a CUDA error):
    its exception, not the later fault, says what happened."""
    crash = first_failure([ExceptionReport(0, "n", 2.0, FAULT, fault=True), ExceptionReport(0, "n", 1.0, TRACEBACK)])
    assert crash is not None and (crash.kind, crash.time) == ("program", 1.0)
    # a fault at the same moment as the exception still comes second
    crash = first_failure([ExceptionReport(0, "n", 1.0, FAULT, fault=True), ExceptionReport(0, "n", 1.0, TRACEBACK)])
    assert crash is not None and crash.kind == "program"


def test_headlines_without_frames_or_text() -> None:
    def evidence(text: str, fault: bool = False) -> str:
        crash = first_failure([ExceptionReport(0, "", 1.0, text, fault)])
        assert crash is not None
        return crash.evidence
    assert evidence("", fault=True) == "rank 0 died of a fatal signal first: no output"
    assert evidence("\n  \n") == "rank 0 failed first: no traceback"
    # only indented lines: the last of them
    assert evidence("  first\n  second\n  third\n") == "rank 0 failed first:   third"
    # the exception line is the last unindented one, not "Traceback ..." nor a later indented note
    assert evidence("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n") == \
        "rank 0 failed first:   File \"x.py\", line 1, in f at x.py:1 in f"
    assert evidence("KeyError: 'a'\n\ntraceback noted\n    detail\n") == "rank 0 failed first: traceback noted"
    # a one-character line, and one whose second character is a space, are unindented too
    assert evidence("KeyError: 'a'\nE x\n") == "rank 0 failed first: E x"
    assert evidence("KeyError: 'a'\nE\n") == "rank 0 failed first: E"
    # cut at 300 characters
    assert evidence("E" * 400) == "rank 0 failed first: " + "E" * 300
