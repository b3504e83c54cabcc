"""Job records: where they live, who may read them, how a job id finds its record."""
from __future__ import annotations

import stat
from pathlib import Path

from cluster_kit.lifecycle import records


def test_records_live_under_xdg_state_home_else_home() -> None:
    assert records.records_dir({"XDG_STATE_HOME": "/s", "HOME": "/h"}) == Path("/s/clusterkit/jobs")
    assert records.records_dir({"HOME": "/h"}) == Path("/h/.local/state/clusterkit/jobs")


def test_a_record_is_private_and_found_again_by_id_and_where(tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    rec = records.JobRecord(job_id="40", where="local", name="train", script="#!/bin/bash\nexport KEY=v\n",
                            outputs={"40": "/scratch/logs/train-40.out"}, submitted_at=100.0)
    path = records.save(rec, folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert records.find("40", "local", folder) == rec
    assert records.find("40", "login01", folder) is None
    assert records.find("41", None, folder) is None


def test_the_newest_record_of_an_id_wins_and_a_task_finds_its_array(tmp_path: Path) -> None:
    old = records.JobRecord(job_id="7", where="login01", submitted_at=1.0)
    new = records.JobRecord(job_id="7", where="login02", submitted_at=2.0)
    for rec in (old, new):
        records.save(rec, tmp_path)
    assert records.find("7", None, tmp_path) == new
    assert records.find("7_3", "login01", tmp_path) == old
    assert [r.where for r in records.all_records(tmp_path)] == ["login02", "login01"]


def test_a_damaged_record_is_skipped_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "9@local.json").write_text("{not json")
    assert records.find("9", None, tmp_path) is None
    assert records.all_records(tmp_path) == []
