"""A collective timeout names the rank the others waited for, on a live 4-rank gloo job (no Slurm).

Rank 3 stays in `load_batch`; ranks 0-2 hit the process group's 10 s timeout and each
leaves its traceback and Flight Recorder. The diagnosis the supervisor runs blames rank 3,
not rank 0 whose timeout fired first. (tests/data/flight_recorder/timeout is a recording
of this run.)
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from supervised_job import WORLD_SIZE, run_timeout

from cluster_kit.analysis.culprit import first_failure
from cluster_kit.analysis.rank_files import read_exceptions, read_failure_files

pytestmark = pytest.mark.slow


def test_the_ranks_that_timed_out_name_the_one_they_waited_for(tmp_path: Path) -> None:
    job = run_timeout(tmp_path)
    control = str(job.control_dir)
    reports = read_exceptions(control)
    assert sorted(r.rank for r in reports) == [0, 1, 2]
    assert all("Timed out waiting 10000ms" in r.text for r in reports)
    crash = first_failure(reports, read_failure_files(control), WORLD_SIZE)
    assert crash is not None and (crash.ranks, crash.kind) == ((3,), "node")
    host = f" ({crash.host})" if crash.host else ""
    assert crash.evidence.startswith(
        f"rank 3{host} is not in all_reduce #11 that ranks 0-2 waited in: it wrote no exception and no Flight "
        "Recorder dump; ranks 0-2 failed waiting, rank "), crash.evidence
