"""Ranks that failed only because they waited for another: the one they waited for is blamed.

On tests/data/flight_recorder/timeout (4 gloo ranks: rank 3 hangs in load_batch, ranks
0-2 hit a 10 s timeout and leave their traceback and Flight Recorder) and gpu/nccl-timeout
(NCCL's watchdog timing out, dumping and aborting a rank).
"""
from __future__ import annotations

from pathlib import Path

from cluster_kit.analysis.culprit import (
    WAITED_FOR,
    find_stuck_at_failure,
    first_failure,
)
from cluster_kit.analysis.flight_recorder import Collective, RankDump
from cluster_kit.analysis.rank_files import (
    ExceptionReport,
    RankFiles,
    read_exceptions,
    read_failure_files,
)
from cluster_kit.trainer.contract import nccl_dump_prefix

DATA = Path(__file__).resolve().parents[2] / "data" / "flight_recorder"
TIMEOUT = str(DATA / "timeout")
NCCL = str(DATA / "gpu" / "nccl-timeout")
GLOO_TIMEOUT = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] "
                "Timed out waiting 10000ms for send operation to complete")


def test_the_rank_the_others_timed_out_waiting_for_is_blamed_not_the_first_to_time_out() -> None:
    reports = read_exceptions(TIMEOUT)
    assert [(r.rank, r.time) for r in reports] == [(0, 1796487774.533), (1, 1796487774.535), (2, 1796487774.538)]
    crash = first_failure(reports, read_failure_files(TIMEOUT), world_size=4)
    assert crash is not None
    assert (crash.rank, crash.ranks, crash.host, crash.hosts) == (3, (3,), "vm", ("vm",))
    assert (crash.kind, crash.why, crash.signature) == ("node", WAITED_FOR, None)
    assert crash.time == 1796487774.533  # when rank 0 failed: the failure showed then
    assert crash.evidence == (
        "rank 3 (vm) is not in all_reduce #11 that ranks 0-2 waited in: it wrote no exception and no Flight "
        f"Recorder dump; ranks 0-2 failed waiting, rank 0 first: {GLOO_TIMEOUT}")


def test_gloo_retires_the_collective_that_timed_out_so_the_last_one_entered_counts() -> None:
    dumps = {r: f.dump for r, f in read_failure_files(TIMEOUT).items() if f.dump is not None}
    assert sorted(dumps) == [0, 1, 2]
    assert all(d.waiting_in("0") is None for d in dumps.values())  # nothing left unfinished
    stuck = find_stuck_at_failure(dumps)
    assert stuck is not None and (stuck.target.describe(), stuck.waiting, stuck.behind) == ("all_reduce #11", (0, 1, 2), {})


def test_without_dumps_the_first_to_time_out_is_named_as_before() -> None:
    crash = first_failure(read_exceptions(TIMEOUT), {}, world_size=4)
    assert crash is not None and (crash.rank, crash.kind) == (0, "node")
    assert crash.why == "timed out waiting for another rank in a collective; whom it waited for is not known"
    assert crash.evidence.startswith(f"rank 0 (vm) failed first: {GLOO_TIMEOUT} at supervised_job.py:90")


def test_without_the_world_size_a_rank_that_wrote_nothing_at_all_is_not_counted() -> None:
    files = read_failure_files(TIMEOUT)
    assert first_failure(read_exceptions(TIMEOUT), files) == first_failure(read_exceptions(TIMEOUT), files, 4)
    no_heartbeat = {r: f for r, f in files.items() if r != 3}  # rank 3 left no file at all
    crash = first_failure(read_exceptions(TIMEOUT), no_heartbeat)
    assert crash is not None and crash.rank == 0 and crash.why.endswith("whom it waited for is not known")


def test_an_nccl_watchdog_abort_is_a_victim_and_the_silent_peer_is_blamed() -> None:
    """NCCL's own dump (a pickle, taken at the timeout) shows the rank still waiting:
    its abort (SIGABRT, a fault file) is the watchdog's, not the node's."""
    files = read_failure_files(NCCL)
    reports = read_exceptions(NCCL)
    assert [r.fault for r in reports] == [True]
    dump = files[0].dump
    assert dump is not None and dump.waiting_in("0") is not None and dump.waiting_in("0").describe() == "all_reduce #4"
    # world size 1: nobody else to wait for, so the victim is named, with why
    crash = first_failure(reports, files, world_size=1)
    assert crash is not None and (crash.rank, crash.kind) == (0, "node")
    assert crash.why == "aborted while waiting in all_reduce #4 (its watchdog); whom it waited for is not known"
    # as one of two ranks, the other one (silent) is blamed
    crash = first_failure(reports, files, world_size=2)
    assert crash is not None and (crash.ranks, crash.hosts, crash.kind) == ((1,), (), "node")
    assert crash.evidence == (
        "rank 1 is not in all_reduce #4 that rank 0 waited in: it wrote no exception and no Flight Recorder "
        "dump; rank 0 failed waiting, rank 0 first: Fatal Python error: Aborted")


def test_a_fault_without_a_dump_that_waits_stays_a_fatal_signal() -> None:
    reports = read_exceptions(NCCL)
    crash = first_failure(reports, {}, world_size=2)
    assert crash is not None and (crash.rank, crash.why) == (0, "died of a fatal signal (Fatal Python error: Aborted)")


def call(seq: int, op: str = "all_reduce", created_s: float = 0.0) -> Collective:
    return Collective(group="0", group_desc="default_pg", seq=seq, op=op, backend="gloo", state="scheduled",
                      retired=True, is_p2p=False, input_sizes=((8,),), output_sizes=((8,),), dtypes=("Float",),
                      record_id=seq, created_ns=int(created_s * 1e9))


def failed(rank: int, *entries: Collective) -> RankFiles:
    return RankFiles(rank, dump=RankDump(rank, f"n{rank}", tuple(entries), ()))


def timed_out(rank: int, when: float) -> ExceptionReport:
    return ExceptionReport(rank, f"n{rank}", when, f"{GLOO_TIMEOUT}\n")


def test_a_rank_in_another_collective_or_an_older_one_is_behind() -> None:
    files = {0: failed(0, call(10), call(11)), 1: failed(1, call(10), call(11)),
             2: failed(2, call(10), call(11, "broadcast")), 3: failed(3, call(10))}
    crash = first_failure([timed_out(r, 100.0 + r) for r in range(4)], files, world_size=4)
    assert crash is not None and (crash.ranks, crash.hosts) == ((2, 3), ("n2", "n3"))
    assert crash.evidence == (
        "rank 2 (n2) is in broadcast #11, not in all_reduce #11 that ranks 0-1 waited in; rank 3 (n3) is not in "
        "all_reduce #11 that ranks 0-1 waited in; its last collective was all_reduce #10; ranks 0-3 failed "
        f"waiting, rank 0 first: {GLOO_TIMEOUT}")


def test_a_rank_that_entered_after_the_others_had_failed_kept_them_waiting() -> None:
    """Every rank reached #11, but rank 3 only once rank 0 had already timed out in it."""
    files = {r: failed(r, call(11, created_s=90.0)) for r in range(3)}
    files[3] = failed(3, call(11, created_s=102.5))
    crash = first_failure([timed_out(r, 100.0) for r in range(3)] + [timed_out(3, 103.0)], files, world_size=4)
    assert crash is not None and crash.ranks == (3,)
    assert crash.evidence.startswith("rank 3 (n3) entered all_reduce #11 2.5 s after rank 0 failed waiting in it; ")
    # entered in time: nobody is behind, and the first to fail is named
    files[3] = failed(3, call(11, created_s=99.0))
    crash = first_failure([timed_out(r, 100.0) for r in range(4)], files, world_size=4)
    assert crash is not None and crash.rank == 0 and crash.why.endswith("whom it waited for is not known")


def test_a_rank_that_failed_by_itself_is_blamed_before_any_waiting() -> None:
    files = read_failure_files(TIMEOUT)
    own = ExceptionReport(3, "vm", 1796487780.0, 'Traceback (most recent call last):\n'
                          '  File "/job/train.py", line 43, in load_batch\nOSError: [Errno 5] Input/output error\n')
    crash = first_failure(list(read_exceptions(TIMEOUT)) + [own], files, world_size=4)
    assert crash is not None and (crash.rank, crash.kind) == (3, "program")


def test_the_nccl_dump_prefix_is_in_the_control_folder(tmp_path: Path) -> None:
    assert nccl_dump_prefix("/ctl/attempt-2") == "/ctl/attempt-2/nccl-dumps/rank-"
    # a dump torch could not parse is a problem of that rank's files, the exception hook's dump is read instead
    (tmp_path / "nccl-dumps").mkdir()
    (tmp_path / "nccl-dumps" / "rank-0").write_bytes(b"\x80\x02garbage")
    (tmp_path / "exceptions").mkdir()
    (tmp_path / "exceptions" / "rank-0.fr.json").write_text(
        (DATA / "timeout" / "exceptions" / "rank-0.fr.json").read_text())
    files = read_failure_files(str(tmp_path))
    assert files[0].dump is not None and files[0].dump.host == "vm"
    assert len(files[0].problems) == 1 and files[0].problems[0].startswith(f"{tmp_path}/nccl-dumps/rank-0: ")
