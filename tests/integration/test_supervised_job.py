"""A real 4-rank gloo job on localhost, supervised through its control folder (no Slurm).

The test plays the supervisor: it asks the ranks for a dump as the batch script
does on a hang, waits for their `.done` files and runs the diagnosis; it writes the
stop file; it reads a failed rank's exception file.
"""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

pytest.importorskip("torch")

from supervised_job import (
    START_DEADLINE_S,
    WORLD_SIZE,
    dump_hang,
    start_job,
)

from cluster_kit.analysis.culprit import find_culprit, first_failure
from cluster_kit.analysis.rank_files import read_dump_folder, read_exceptions

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scenario, reason, where", [
    ("hang", "is not in all_reduce #11 that ranks 0-2 wait in", "supervised_job.py"),
    ("mismatch", "is in broadcast #11, not in all_reduce #11 that ranks 0-2 wait in", "in sync_weights"),
])
def test_a_dump_request_names_the_rank_that_holds_the_others_up(
        tmp_path: Path, scenario: str, reason: str, where: str) -> None:
    folder = dump_hang(scenario, tmp_path, request="hang-1")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    culprit = find_culprit(read_dump_folder(str(folder.parents[1]), "hang-1"), world_size=WORLD_SIZE)
    assert culprit.ranks == (3,), culprit.evidence
    assert culprit.evidence.startswith(f"rank 3 {reason}; its stack: ") and where in culprit.evidence
    if scenario == "hang":
        assert culprit.evidence.endswith(" in load_batch")


def test_the_stop_file_reaches_every_rank(tmp_path: Path) -> None:
    with start_job("stop", tmp_path) as job:
        job.wait_for_steps(3)
        (job.control_dir / "stop").write_text("")
        results = job.wait(60)
    assert [code for code, _ in results] == [0] * WORLD_SIZE, results
    for rank, (_, out) in enumerate(results):
        assert f"rank {rank} stop_requested=True steps=" in out, out


def test_a_rank_that_raises_leaves_its_traceback_and_is_named_first(tmp_path: Path) -> None:
    with start_job("crash", tmp_path) as job:
        results = job.wait(START_DEADLINE_S)
    assert results[2][0] == 1 and "ValueError: batch 5 has no labels" in results[2][1]
    path = job.control_dir / "exceptions" / "rank-2.txt"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "Traceback (most recent call last):" in text and 'in bad_batch\n    raise ValueError' in text
    crash = first_failure(read_exceptions(str(job.control_dir)))
    assert crash is not None and crash.rank == 2
    assert " failed first: ValueError: batch 5 has no labels at supervised_job.py:" in crash.evidence
    assert crash.evidence.endswith(" in bad_batch")
