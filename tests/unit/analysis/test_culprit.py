"""Who holds a job up, or failed first, on the recorded dumps of tests/data/flight_recorder."""
from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_kit.analysis.culprit import (
    find_culprit,
    find_stuck,
    first_failure,
    format_ranks,
)
from cluster_kit.analysis.flight_recorder import parse_dump
from cluster_kit.analysis.rank_files import RankFiles, read_dump_folder, read_exceptions
from cluster_kit.trainer.contract import Heartbeat

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "flight_recorder"


def recorded(scenario: str) -> dict[int, RankFiles]:
    return read_dump_folder(str(DATA / scenario), "hang-1")


def test_the_rank_that_never_entered_the_all_reduce_is_blamed() -> None:
    culprit = find_culprit(recorded("hang"), world_size=4)
    assert culprit.ranks == (3,) and culprit.hosts == (recorded("hang")[3].host,)
    assert culprit.evidence == (
        "rank 3 is not in all_reduce #11 that ranks 0-2 wait in; its stack: supervised_job.py:43 in load_batch")
    assert culprit.waiting_in is not None and culprit.waiting_in.seq == 11


def test_a_rank_in_another_collective_is_blamed() -> None:
    culprit = find_culprit(recorded("mismatch"), world_size=4)
    assert culprit.ranks == (3,)
    assert culprit.evidence == ("rank 3 is in broadcast #11, not in all_reduce #11 that ranks 0-2 wait in; "
                                "its stack: supervised_job.py:53 in sync_weights")


def test_a_rank_that_wrote_nothing_is_blamed_beside_the_collective_evidence() -> None:
    ranks = recorded("hang")
    del ranks[3]
    culprit = find_culprit(ranks, world_size=4)
    assert culprit.ranks == (3,)
    assert culprit.evidence == "rank 3 wrote no stack and no Flight Recorder dump (stuck outside Python, or gone)"
    assert find_culprit(ranks).ranks == ()  # without the world size nobody is missing


def test_without_flight_recorder_the_ranks_with_fewer_steps_are_behind() -> None:
    ranks = {r: dataclasses.replace(f, dump=None, stack=None,
                                    heartbeat=Heartbeat(41 if r == 2 else 42, 0.0, f"n{r}", 1))
             for r, f in recorded("hang").items()}
    culprit = find_culprit(ranks)
    assert (culprit.ranks, culprit.hosts) == ((2,), ("n2",))
    assert culprit.evidence == "rank 2 finished 41 steps, ranks 0-1,3 42"


def test_nobody_is_blamed_when_every_rank_is_in_the_same_collective() -> None:
    ranks = {0: RankFiles(0, dump=parse_dump((DATA / "nccl" / "nccl-pending.json").read_text(), rank=0))}
    culprit = find_culprit(ranks)
    assert culprit.ranks == ()
    assert culprit.evidence == "no rank is behind: rank 0 waits in all_reduce #5"
    done = {0: RankFiles(0, dump=parse_dump((DATA / "nccl" / "nccl-done.json").read_text(), rank=0))}
    assert find_culprit(done).evidence == "no rank is behind: no step counts and no rank waits in a collective"


def test_the_hanging_group_is_the_one_most_ranks_wait_in() -> None:
    dumps = {r: f.dump for r, f in recorded("mismatch").items() if f.dump}
    stuck = find_stuck(dumps)
    assert stuck is not None
    assert (stuck.group, stuck.waiting, list(stuck.behind)) == ("0", (0, 1, 2), [3])
    assert find_stuck({r: d for r, d in dumps.items() if r == 3}) is not None  # one rank: its own
    assert find_stuck({}) is None


@pytest.mark.parametrize("ranks, text", [
    ([3], "3"), ([0, 1, 2], "0-2"), ([0, 1, 2, 3, 4, 6, 7, 31], "0-4,6-7,31"), ([5, 1, 1, 2], "1-2,5"), ([], "")])
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


def test_the_rank_that_raised_failed_first_not_those_that_lost_it() -> None:
    reports = read_exceptions(str(DATA / "crash"))
    assert sorted(r.rank for r in reports) == [0, 1, 2, 3]
    crash = first_failure(reports)
    assert crash is not None and crash.rank == 2
    assert crash.evidence == (f"rank 2 ({crash.host}) failed first: ValueError: batch 5 has no labels "
                              "at supervised_job.py:57 in bad_batch")
    assert crash.last_lines[-1] == "ValueError: batch 5 has no labels"
    assert "Traceback (most recent call last):" not in crash.last_lines


def test_a_lost_peer_comes_after_a_rank_that_failed_by_itself_even_when_earlier() -> None:
    reports = list(read_exceptions(str(DATA / "crash")))
    rank2 = next(r for r in reports if r.rank == 2)
    earlier = [dataclasses.replace(r, time=rank2.time - 5) if r.rank != 2 else r for r in reports]  # type: ignore[operator]
    crash = first_failure(earlier)
    assert crash is not None and crash.rank == 2
    peers_only = first_failure([r for r in reports if r.rank != 2])
    assert peers_only is not None and "Connection closed by peer" in peers_only.evidence
    assert first_failure([]) is None


def python38() -> str | None:
    found = glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8"))
    return found[0] if found else None


@pytest.mark.skipif(python38() is None, reason="no Python 3.8 interpreter here")
def test_the_diagnosis_runs_on_python_38_with_the_stdlib_only() -> None:
    """The supervisor runs these modules from a zip app on the job's Python."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from cluster_kit.analysis import culprit, rank_files\n"
        "print(culprit.find_culprit(rank_files.read_dump_folder(sys.argv[2], 'hang-1'), 4).evidence)\n"
        "for folder in sys.argv[3:]:\n"
        "    crash = culprit.first_failure(rank_files.read_exceptions(folder), rank_files.read_failure_files(folder), 4)\n"
        "    print(crash.kind, crash.ranks, crash.signature.key if crash.signature else None)\n"
        "print(sorted(m.split('.')[0] for m in sys.modules if m.startswith(('cluster_kit', 'yaml', 'torch')))[-1])\n"
    )
    folders = [str(DATA / name) for name in ("hang", "timeout", "crash", "gpu/nccl-timeout")]
    out = subprocess.run([python38() or "", "-I", "-c", code, str(REPO), *folders],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].startswith("rank 3 is not in all_reduce #11")
    assert out[1:4] == ["node (3,) None", "program (2,) ValueError: batch # has no labels at supervised_job.py:57",
                        "node (1, 2, 3) None"]  # NCCL's pickle read too: rank 0 aborted waiting for 1-3
    assert out[4] == "cluster_kit"
    assert sys.version_info >= (3, 9)  # this interpreter is another one
