"""Every field of a Flight Recorder entry as torch writes it, read back whole, from hand-written entries."""
from __future__ import annotations

import json

from cluster_kit.analysis.flight_recorder import Collective, parse_dump


def entries(*raw: dict[str, object]) -> tuple[Collective, ...]:
    return parse_dump(json.dumps({"entries": list(raw)})).entries


def test_a_collective_entry() -> None:
    assert entries({
        "process_group": ["1", "tp"], "profiling_name": "nccl:all_reduce", "collective_seq_id": 12,
        "p2p_seq_id": 0, "is_p2p": False, "state": "started", "retired": False,
        "input_sizes": [[4, 256], "x", [3]], "output_sizes": [[4, 256]], "input_dtypes": ["Float", "BFloat16"],
        "record_id": 30, "time_created_ns": 1700000000123456789,
    }) == (Collective(group="1", group_desc="tp", seq=12, op="all_reduce", backend="nccl", state="started",
                      retired=False, is_p2p=False, input_sizes=((4, 256), (3,)), output_sizes=((4, 256),),
                      dtypes=("Float", "BFloat16"), record_id=30, created_ns=1700000000123456789),)


def test_a_p2p_entry_counts_by_its_p2p_sequence() -> None:
    (entry,) = entries({
        "process_group": ["0", "default_pg"], "profiling_name": "gloo:send", "collective_seq_id": 9,
        "p2p_seq_id": 3, "is_p2p": True, "state": "completed", "retired": True,
        "input_sizes": [[8]], "output_sizes": "none", "record_id": "7", "time_created_ns": 5,
    })
    assert (entry.seq, entry.is_p2p, entry.op, entry.backend, entry.state, entry.retired) == \
        (3, True, "send", "gloo", "completed", True)
    assert (entry.input_sizes, entry.output_sizes, entry.record_id, entry.created_ns) == (((8,),), (), 7, 5)


def test_an_entry_with_nothing_in_it() -> None:
    assert entries({}) == (Collective(group="", group_desc="", seq=-1, op="?", backend="", state="",
                                      retired=False, is_p2p=False, input_sizes=(), output_sizes=(),
                                      dtypes=(), record_id=-1, created_ns=-1),)


def test_names_groups_and_numbers_not_quite_as_expected() -> None:
    first, second, third = entries(
        # the op is what follows the last colon; no colon: no backend
        {"profiling_name": "a:b:all_gather", "process_group": ["5"]},
        {"profiling_name": "broadcast", "process_group": [], "collective_seq_id": "x"},
        {"profiling_name": "nccl:", "is_p2p": True, "p2p_seq_id": None, "collective_seq_id": 4},
    )
    assert (first.op, first.backend, first.group, first.group_desc) == ("all_gather", "a:b", "5", "")
    assert (second.op, second.backend, second.group, second.group_desc, second.seq) == ("broadcast", "", "", "", -1)
    assert (third.op, third.backend, third.seq) == ("?", "nccl", -1)
