"""Which group hangs and why each rank is behind: the recorded hang of tests/data/flight_recorder
with a rank's entries changed, and hand-made dumps of several process groups."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from cluster_kit.analysis.culprit import Blame, find_culprit, find_stuck
from cluster_kit.analysis.flight_recorder import Collective, RankDump
from cluster_kit.analysis.rank_files import RankFiles, read_dump_folder

DATA = Path(__file__).resolve().parents[2] / "data" / "flight_recorder"


def recorded(scenario: str) -> dict[int, RankFiles]:
    return read_dump_folder(str(DATA / scenario), "hang-1")


def call(group: str, seq: int, op: str = "all_reduce", done: bool = False, desc: str = "") -> Collective:
    return Collective(group=group, group_desc=desc or f"pg{group}", seq=seq, op=op, backend="gloo",
                      state="scheduled", retired=done, is_p2p=False, input_sizes=((8,),), output_sizes=((8,),),
                      dtypes=("Float",), record_id=seq, created_ns=seq)


def dump(rank: int, *entries: Collective) -> RankDump:
    return RankDump(rank, "vm", tuple(entries), ())


def with_entries(files: RankFiles, *more: Collective) -> RankFiles:
    assert files.dump is not None
    return dataclasses.replace(files, dump=dataclasses.replace(files.dump, entries=files.dump.entries + more))


def test_of_groups_tied_the_lowest_numbered_hangs() -> None:
    finished = [call("0", 1, done=True)]
    dumps = {0: dump(0, *finished, call("10", 1)), 1: dump(1, *finished, call("10", 1)),
             2: dump(2, *finished, call("2", 1)), 3: dump(3, *finished, call("2", 1)),
             4: dump(4, *finished, call("d41d8cd98f", 1)), 5: dump(5, *finished, call("d41d8cd98f", 1))}
    stuck = find_stuck(dumps)
    assert stuck is not None
    assert (stuck.group, stuck.target, stuck.waiting, stuck.behind) == ("2", call("2", 1), (2, 3), {})


def test_a_subgroup_hangs_among_its_members_only() -> None:
    finished = [call("0", n, done=True) for n in (1, 2)]
    dumps = {0: dump(0, *finished, call("1", 1, done=True), call("1", 2, done=True), call("1", 3)),
             1: dump(1, *finished, call("1", 1, done=True), call("1", 2, done=True)),
             2: dump(2, *finished), 3: dump(3, *finished)}  # not in group 1
    stuck = find_stuck(dumps)
    assert stuck is not None
    assert (stuck.group, stuck.target, stuck.waiting) == ("1", call("1", 3), (0,))
    assert stuck.behind == {1: "is not in all_reduce #3 of group pg1 that rank 0 waits in"}


def test_on_a_tie_of_collectives_the_later_one_is_what_the_others_wait_in() -> None:
    finished = [call("0", n, done=True) for n in range(1, 11)]
    dumps = {0: dump(0, *finished, call("0", 11, "broadcast")), 1: dump(1, *finished, call("0", 11, "broadcast")),
             2: dump(2, *finished, call("0", 11, done=True), call("0", 12)),
             3: dump(3, *finished, call("0", 11, done=True), call("0", 12))}
    stuck = find_stuck(dumps)
    assert stuck is not None and (stuck.target, stuck.waiting) == (call("0", 12), (2, 3))
    assert stuck.behind == {0: "is in broadcast #11, not in all_reduce #12 that ranks 2-3 wait in",
                            1: "is in broadcast #11, not in all_reduce #12 that ranks 2-3 wait in"}


def test_a_rank_that_finished_the_collective_the_others_wait_in_holds_nobody_up() -> None:
    ranks = recorded("hang")
    assert ranks[3].dump is not None and ranks[3].dump.last_enqueued("0") == 10
    ranks[3] = with_entries(ranks[3], call("0", 11, done=True))
    culprit = find_culprit(ranks, world_size=4)
    assert (culprit.ranks, culprit.blames) == ((), ())
    assert culprit.evidence == "no rank is behind: ranks 0-2 wait in all_reduce #11"


def test_a_rank_behind_that_waits_in_another_groups_collective_says_which() -> None:
    ranks = recorded("hang")
    ranks[3] = with_entries(ranks[3], call("1", 1, done=True, desc="cpu_gloo"), call("1", 2, desc="cpu_gloo"))
    culprit = find_culprit(ranks, world_size=4)
    assert culprit.blames == (Blame(3, "vm", "is not in all_reduce #11 that ranks 0-2 wait in; "
                                            "it waits in all_reduce #2 of group cpu_gloo",
                                    "supervised_job.py:43 in load_batch"),)


def test_a_rank_with_a_stack_but_no_dump_is_not_silent() -> None:
    ranks = recorded("hang")
    ranks[1] = dataclasses.replace(ranks[1], dump=None)  # its recorder could not be dumped
    culprit = find_culprit(ranks, world_size=4)
    assert culprit.ranks == (3,)
    assert culprit.evidence == (
        "rank 3 is not in all_reduce #11 that ranks 0,2 wait in; its stack: supervised_job.py:43 in load_batch")


def test_every_blamed_rank_in_one_line() -> None:
    ranks = recorded("mismatch")
    del ranks[1]
    culprit = find_culprit(ranks, world_size=4)
    assert culprit.ranks == (1, 3) and culprit.hosts == ("vm",)
    assert culprit.blames == (
        Blame(1, "", "wrote no stack and no Flight Recorder dump (stuck outside Python, or gone)", ""),
        Blame(3, "vm", "is in broadcast #11, not in all_reduce #11 that ranks 0,2 wait in",
              "supervised_job.py:53 in sync_weights"))
    assert culprit.evidence == (
        "rank 1 wrote no stack and no Flight Recorder dump (stuck outside Python, or gone); "
        "rank 3 is in broadcast #11, not in all_reduce #11 that ranks 0,2 wait in; "
        "its stack: supervised_job.py:53 in sync_weights")


def test_without_dumps_and_with_the_same_steps_nobody_is_behind() -> None:
    ranks = {r: RankFiles(r, heartbeat=f.heartbeat) for r, f in recorded("hang").items()}  # heartbeats only
    culprit = find_culprit(ranks)
    assert (culprit.ranks, culprit.waiting_in) == ((), None)
    assert culprit.evidence == "no rank is behind: every rank finished 5 steps and no rank waits in a collective"
