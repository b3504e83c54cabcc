"""The failure rate `checkpoint_every: auto` learns from the user's earlier chains."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cluster_kit.supervisor import decide, record
from cluster_kit.trainer.checkpoint import interval


def write_record(folder: Path, attempts: list[dict[str, object]], final: object = None, mode: int = 0o700) -> Path:
    folder.mkdir(mode=mode)
    folder.chmod(mode)
    doc = {"format": record.FORMAT, "job_id": folder.name.split("-")[1], "attempts": attempts,
           "final": final if final is not None else {"ended": "completed", "exit_code": 0}}
    (folder / record.RECORD_NAME).write_text(json.dumps(doc))
    (folder / record.RECORD_NAME).chmod(0o600)
    return folder


def chain_of(attempts: list[dict[str, object]]) -> record.ChainRecord:
    return record.ChainRecord.from_dict({"format": record.FORMAT, "job_id": "9", "attempts": attempts})


HOUR_ON_4_NODES = [{"ended": "node_failure", "nodes": "n[1-4]", "started_at": 1000.0, "ended_at": 4600.0},
                   {"ended": "completed", "nodes": "n[1-4]", "started_at": 4610.0, "ended_at": 8210.0}]


def test_earlier_chains_count_in_node_seconds_at_this_size() -> None:
    run_s, failures = decide.earlier_history([chain_of(HOUR_ON_4_NODES)], nodes=2)
    assert (run_s, failures) == (2 * 7200.0, 1)  # 2 h on 4 nodes: 4 h of a 2-node job
    assert decide.earlier_history([chain_of([{"ended": "crash", "nodes": "bad[", "started_at": 1.0}])], 2) == (0, 0)


def test_only_the_users_own_ended_records_beside_the_chain_are_read(tmp_path: Path) -> None:
    own = tmp_path / "clusterkit-300"
    own.mkdir(mode=0o700)
    write_record(tmp_path / "clusterkit-100", HOUR_ON_4_NODES)
    write_record(tmp_path / "clusterkit-101", HOUR_ON_4_NODES, mode=0o777)  # anyone could have written it
    write_record(tmp_path / "clusterkit-102", HOUR_ON_4_NODES, final={})  # still running
    write_record(tmp_path / "clusterkit-103", [])
    corrupt = tmp_path / "clusterkit-103" / record.RECORD_NAME
    corrupt.write_text("{not json")
    os.symlink(tmp_path / "clusterkit-100", tmp_path / "clusterkit-104")
    found = record.earlier(str(own))
    assert [r.job_id for r in found] == ["100"]
    assert corrupt.read_text() == "{not json"  # another chain's record is never moved or changed
    assert record.earlier(str(tmp_path / "nowhere" / "clusterkit-1")) == []


def test_an_earlier_chains_failures_shorten_the_mtbf_auto_uses(tmp_path: Path) -> None:
    write_record(tmp_path / "clusterkit-100", HOUR_ON_4_NODES)
    run_s, failures = decide.earlier_history(record.earlier(str(tmp_path / "clusterkit-200")), nodes=4)
    assert interval.estimate_mtbf_s(run_s, failures, nodes=4) == pytest.approx(7200.0)
    assert interval.estimate_mtbf_s(0.0, 0, nodes=4) == pytest.approx(5000 * 3600 / 4)
