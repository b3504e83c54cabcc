"""A rank's process groups, their counters and what is not a dump, on the recorded dumps of
tests/data/flight_recorder/nccl (some with a field changed) and on hand-written recorders."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.analysis.flight_recorder import (
    DumpError,
    GroupStatus,
    RankDump,
    parse_dump,
)

NCCL = Path(__file__).resolve().parents[2] / "data" / "flight_recorder" / "nccl"


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((NCCL / f"{name}.json").read_text())
    return data


def entry(group: str, seq: int, op: str = "all_reduce", **more: Any) -> dict[str, Any]:
    return {"process_group": [group, f"pg{group}"], "collective_seq_id": seq, "profiling_name": f"nccl:{op}",
            "state": "completed", "retired": True, **more}


def test_every_counter_of_a_groups_status() -> None:
    done = recorded("nccl-done")
    # NCCL with TORCH_NCCL_ENABLE_TIMING=1 also counts the collectives that started
    done["pg_status"]["0"]["last_started_collective"] = "4"
    assert parse_dump(json.dumps(done)).groups == (GroupStatus("0", 5, 4, 4),)
    done["pg_status"]["0"] = {"last_enqueued_collective": None, "last_completed_collective": "x"}
    assert parse_dump(json.dumps(done)).groups == (GroupStatus("0", -1, -1, -1),)


def test_groups_are_named_in_number_order_then_by_name() -> None:
    dump = parse_dump(json.dumps({"entries": [entry(name, 1) for name in ("tp", "10", "2", "dp", "0")]}))
    assert dump.groups == ()  # no pg_status: the groups are their entries'
    assert dump.group_names() == ("0", "2", "10", "dp", "tp")


def test_a_group_without_a_status_is_not_asked_for_one() -> None:
    dump = parse_dump(json.dumps(recorded("nccl-pending")))
    assert dump.status("0") == GroupStatus("0", 5, -1, -1)
    assert dump.status("1") is None


def test_the_last_collective_entered_counts_the_groups_own_collectives_and_its_status() -> None:
    dump = parse_dump(json.dumps({
        "entries": [
            entry("0", 3),
            entry("1", 9),  # another group's
            entry("0", 0, "send", is_p2p=True, p2p_seq_id=8),  # p2p ops count apart
            entry("2", 4, pg_id=2),
        ],
        # the ring buffer dropped group 2's later entries; its status still counts them
        "pg_status": {"2": {"last_enqueued_collective": "7"}},
    }))
    assert dump.last_enqueued("0") == 3
    assert dump.last_enqueued("1") == 9
    assert dump.last_enqueued("2") == 7
    assert dump.last_enqueued("5") == -1  # none at all


def test_a_status_older_than_the_entries_gives_way_to_them() -> None:
    pending = recorded("nccl-pending")
    pending["pg_status"]["0"]["last_enqueued_collective"] = "2"
    assert parse_dump(json.dumps(pending)).last_enqueued("0") == 5


def test_statuses_whose_group_no_entry_names_are_left_out() -> None:
    pending = recorded("nccl-pending")
    pending["pg_status"]["3"] = {"last_enqueued_collective": "9"}
    pending["pg_status"]["0"] = "not an object"
    assert parse_dump(json.dumps(pending)).groups == ()
    # an entry without a process group names its pg_id's status ""
    dump = parse_dump(json.dumps({"entries": [{"pg_id": 4, "collective_seq_id": 2}],
                                  "pg_status": {"4": {"last_enqueued_collective": 2}}}))
    assert dump.groups == (GroupStatus("", 2, -1, -1),)


def test_a_dump_with_statuses_only_is_a_dump() -> None:
    assert parse_dump('{"pg_status": {}}', rank=1) == RankDump(1, "", (), ())


def test_torchs_own_json_has_no_host_and_the_callers_rank() -> None:
    dump = parse_dump(json.dumps(recorded("nccl-pending")), rank=2)
    assert (dump.rank, dump.host, dump.errors) == (2, "", ())


def test_a_ranks_file_without_its_rank_or_host_takes_the_callers_rank() -> None:
    wrapped = {"format": "clusterkit.fr/1", "rank": None, "recorders": {"nccl": recorded("nccl-pending")}}
    dump = parse_dump(json.dumps(wrapped), rank=6)
    assert (dump.rank, dump.host) == (6, "")
    assert parse_dump(json.dumps({**wrapped, "rank": 1}), rank=6).rank == 1


@pytest.mark.parametrize("data, message", [
    ({"version": "2.10"}, "no 'entries' and no 'pg_status': not a Flight Recorder dump"),
    ({"format": "clusterkit.fr/1", "recorders": {"nccl": []}}, "a recorder's dump is a JSON object"),
])
def test_what_is_not_a_dump_is_said_whole(data: dict[str, Any], message: str) -> None:
    with pytest.raises(DumpError) as raised:
        parse_dump(json.dumps(data))
    assert str(raised.value) == message
