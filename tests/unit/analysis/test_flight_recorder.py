"""Flight Recorder dumps, stacks and heartbeats as the ranks wrote them (tests/data/flight_recorder)."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from cluster_kit.analysis.flight_recorder import (
    DumpError,
    GroupStatus,
    parse_dump,
    parse_dump_bytes,
)
from cluster_kit.analysis.rank_files import parse_stack, rank_paths, read_dump_folder
from cluster_kit.trainer.contract import parse_heartbeat

DATA = Path(__file__).resolve().parents[2] / "data" / "flight_recorder"


def dump(scenario: str, rank: int) -> str:
    return (DATA / scenario / "dumps" / "hang-1" / f"rank-{rank}.fr.json").read_text()


def test_a_waiting_rank_is_in_the_collective_it_entered_last() -> None:
    rank0 = parse_dump(dump("hang", 0))
    assert rank0.rank == 0 and rank0.host
    waiting = rank0.waiting_in("0")
    assert waiting is not None
    assert (waiting.op, waiting.seq, waiting.backend, waiting.state) == ("all_reduce", 11, "gloo", "scheduled")
    assert waiting.input_sizes == ((676,),) and waiting.dtypes == ("Float",)
    assert waiting.describe() == "all_reduce #11"
    status = rank0.status("0")
    assert status is not None and (status.last_enqueued, status.last_completed) == (11, 10)


def test_the_hung_rank_never_entered_it() -> None:
    rank3 = parse_dump(dump("hang", 3))
    assert rank3.waiting_in("0") is None
    assert rank3.last_enqueued("0") == 10
    assert [e.op for e in rank3.entries[:3]] == ["all_gather", "broadcast", "broadcast"]  # DDP's set-up
    assert all(e.finished for e in rank3.entries)


def test_a_mismatched_rank_waits_in_another_op_with_the_same_sequence_id() -> None:
    waiting = parse_dump(dump("mismatch", 3)).waiting_in("0")
    assert waiting is not None and (waiting.op, waiting.seq) == ("broadcast", 11)
    assert waiting.input_sizes == ((32, 16),)


def test_nccl_marks_collectives_completed_and_retires_them_later() -> None:
    pending = parse_dump((DATA / "nccl" / "nccl-pending.json").read_text(), rank=0)
    waiting = pending.waiting_in("0")
    assert waiting is not None and (waiting.op, waiting.seq, waiting.backend) == ("all_reduce", 5, "nccl")
    assert [e.state for e in pending.entries] == ["completed"] * 4 + ["scheduled"]
    assert [e.op for e in pending.entries[:4]] == ["all_reduce"] * 3 + ["broadcast"]
    done = parse_dump((DATA / "nccl" / "nccl-done.json").read_text(), rank=0)
    assert done.waiting_in("0") is None
    assert [e.retired for e in done.entries] == [True] * 4 + [False]  # #5 completed, not retired yet


def test_a_groups_status_is_named_by_its_entries_not_by_the_local_pg_id() -> None:
    gloo = parse_dump((DATA / "nccl" / "gloo-subgroup.json").read_text())
    assert [(g.group, g.last_completed) for g in gloo.groups] == [("1", 1)]  # pg_id "0" there
    assert gloo.entries[0].describe() == "all_reduce #1 of group cpu_gloo"


def test_a_ranks_file_merges_its_nccl_and_gloo_recorders() -> None:
    wrapped = json.dumps({
        "format": "clusterkit.fr/1", "rank": 0, "host": "gpu001", "pid": 1, "steps": 3,
        "recorders": {name: json.loads((DATA / "nccl" / f"{file}.json").read_text())
                      for name, file in (("nccl", "nccl-pending"), ("fr", "gloo-subgroup"))},
        "errors": {},
    })
    both = parse_dump(wrapped)
    assert (both.rank, both.host) == (0, "gpu001")
    assert both.group_names() == ("0", "1")
    default = both.status("0")
    assert default is not None and default.last_enqueued == 5  # NCCL's pg_id 0, not gloo's
    waiting = both.waiting_in("0")
    assert waiting is not None and waiting.seq == 5
    assert both.waiting_in("1") is None


def test_a_recorder_that_failed_is_reported() -> None:
    text = json.dumps({"format": "clusterkit.fr/1", "rank": 2, "recorders": {},
                       "errors": {"nccl": "_dump_nccl_trace_json: no answer in 20 s"}})
    assert parse_dump(text).errors == ("nccl: _dump_nccl_trace_json: no answer in 20 s",)


@pytest.mark.parametrize("text, message", [
    ("rank-3.stack", "not JSON"),
    ("[]", "JSON object, not list"),
    ('{"traceEvents": []}', "not a Flight Recorder dump"),
])
def test_what_is_not_a_dump_is_refused_with_what_it_is(text: str, message: str) -> None:
    with pytest.raises(DumpError, match=message):
        parse_dump(text)


def test_stacks_name_the_training_threads_frames() -> None:
    stack = parse_stack((DATA / "hang" / "dumps" / "hang-1" / "rank-3.stack").read_text())
    assert stack.header["rank"] == "3" and stack.header["steps"] == "5"
    main = stack.main_thread()
    assert main is not None and not main.current and main.ident == stack.header["main_thread"]
    assert [t.current for t in stack.threads] == [True, False]  # the watcher wrote it
    where = stack.where()
    assert where is not None and where.short() == "supervised_job.py:43 in load_batch"


def test_the_users_frame_skips_torch_and_clusterkit() -> None:
    stack = parse_stack((DATA / "hang" / "dumps" / "hang-1" / "rank-0.stack").read_text())
    main = stack.main_thread()
    assert main is not None and main.frames[0].path.endswith("torch/autograd/graph.py")
    assert any(f.path.endswith("cluster_kit/ddp.py") for f in main.frames)
    where = stack.where()
    assert where is not None and where.short() == "supervised_job.py:86 in rank_main"


def test_heartbeat_lines() -> None:
    beat = parse_heartbeat((DATA / "hang" / "heartbeat" / "rank-2").read_text())
    assert beat.steps == 5 and beat.time > 1.7e9 and beat.pid > 0 and beat.host
    with pytest.raises(ValueError, match="4 or 5 fields"):
        parse_heartbeat("5 1796357326.8\n")


def test_a_control_folder_is_read_rank_by_rank() -> None:
    ranks = read_dump_folder(str(DATA / "hang"), "hang-1")
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(r.stack and r.dump and r.heartbeat and not r.problems for r in ranks.values())
    assert ranks[3].steps == 5 and ranks[3].host == ranks[3].stack.header["host"]  # type: ignore[union-attr]
    assert read_dump_folder(str(DATA / "hang"), "no-such-request")[1].stack is None
    assert sorted(rank_paths(str(DATA / "hang" / "dumps" / "hang-1"), ".stack")) == [0, 1, 2, 3]


def test_an_unreadable_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "dumps" / "r1").mkdir(parents=True)
    (tmp_path / "dumps" / "r1" / "rank-1.fr.json").write_text("{truncated")
    (tmp_path / "heartbeat").mkdir()
    (tmp_path / "heartbeat" / "rank-1").write_text("")
    files = read_dump_folder(str(tmp_path), "r1")[1]
    assert files.dump is None and files.heartbeat is None
    assert [p.split(": ", 1)[1] for p in files.problems] == [
        "a heartbeat line has 4 or 5 fields (steps time host pid [pause]), not ''", ("not JSON: Expecting property name "
        "enclosed in double quotes: line 1 column 2 (char 1)")]


# --- NCCL's own dump on a timeout: torch's pickle ------------------------------------------------
NCCL_TIMEOUT_DUMP = DATA / "gpu" / "nccl-timeout" / "nccl-dumps" / "rank-0"


def test_nccls_timeout_dump_is_read_from_its_pickle() -> None:
    dump = parse_dump_bytes(NCCL_TIMEOUT_DUMP.read_bytes(), rank=0)
    assert (dump.rank, dump.host, dump.errors) == (0, "", ())
    assert [(e.seq, e.op, e.backend, e.state, e.retired) for e in dump.entries] == [
        (1, "all_reduce", "nccl", "completed", True), (2, "all_reduce", "nccl", "completed", True),
        (3, "all_reduce", "nccl", "completed", True), (4, "all_reduce", "nccl", "scheduled", False)]
    assert dump.groups == (GroupStatus("0", 4, -1, 3),)
    waiting = dump.waiting_in("0")
    assert waiting is not None and waiting.describe() == "all_reduce #4" and waiting.input_sizes == ((1048576,),)
    last = dump.last_entered("0")
    assert last is not None and last.seq == 4 and dump.last_entered("1") is None


def test_a_pickle_that_names_a_function_is_refused_before_anything_runs() -> None:
    with pytest.raises(DumpError, match=r"^a Flight Recorder pickle names posix\.system; only plain data is read$"):
        parse_dump_bytes(pickle.dumps(os.system, protocol=2))
    with pytest.raises(DumpError, match=r"names builtins\.eval"):
        parse_dump_bytes(pickle.dumps({"entries": [eval]}, protocol=4))


def test_a_dump_files_bytes_may_be_json_and_a_broken_pickle_is_no_dump() -> None:
    text = (DATA / "hang" / "dumps" / "hang-1" / "rank-0.fr.json").read_text()
    assert parse_dump_bytes(text.encode()) == parse_dump(text)
    with pytest.raises(DumpError, match=r"^not a readable pickle: "):
        parse_dump_bytes(NCCL_TIMEOUT_DUMP.read_bytes()[:200])
    with pytest.raises(DumpError, match=r"JSON object, not list"):
        parse_dump_bytes(pickle.dumps([1, 2], protocol=2))
