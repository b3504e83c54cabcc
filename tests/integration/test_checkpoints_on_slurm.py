"""cluster_kit.checkpoint inside jobs that keep training, on the dev cluster's real Slurm.

A finished run's newest checkpoint is corrupted on disk; the same job submitted again
(more steps, the same checkpoint folder) sets it aside, says so in its log and in the
attempts record, resumes from the one before, and ends with the weights of a run that
was never interrupted; nobody is blamed. The interval it saved at is in `diagnose`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jobcli import clusterkit, write_yaml
from keeptrain import assert_same_weights, chain_record, job, log_of, submit, yaml_of

pytestmark = pytest.mark.integration


def test_a_corrupted_latest_checkpoint_is_set_aside_and_the_one_before_loads(
        dev_cluster: Any, keep_folder: Path, reference_weights: Path) -> None:
    first = job(keep_folder, "ck-corrupt", step_seconds=0)
    data = yaml_of(first)
    data["args"][1] = "24"  # half the steps: checkpoints at 20 and 24
    write_yaml(first, data)
    record = chain_record(keep_folder, submit(dev_cluster, first))
    assert record["final"]["exit_code"] == 0, record
    ckpt = keep_folder / "ck-corrupt.ckpt"
    latest = ckpt / (ckpt / "latest").read_text().strip()
    assert latest.name == "step-24", sorted(p.name for p in ckpt.iterdir())
    model = next(p for p in latest.iterdir() if p.name.startswith("model"))
    model.write_bytes(model.read_bytes()[:-16] + b"\0" * 16)  # a torn write of its last bytes

    data["args"][1] = "48"  # the whole run, resumed
    write_yaml(first, data)
    job_id = submit(dev_cluster, first)
    record = chain_record(keep_folder, job_id)
    attempt = record["attempts"][0]
    assert (attempt["ended"], record["final"]["exit_code"]) == ("completed", 0), record
    assert "culprit" not in attempt and not record.get("exclude")
    assert "rank 0: attempt 0 starts at step 20 of 48" in log_of(attempt)  # the one before
    assert any(line.startswith("set aside step-24 as ") for line in attempt["checkpoints"]), attempt
    assert (ckpt / "step-24.corrupt").is_dir()
    diagnosed = json.loads(clusterkit(dev_cluster, "diagnose", job_id, "--json").stdout)
    assert diagnosed["attempts"][0]["checkpoints"] == attempt["checkpoints"]
    assert_same_weights(keep_folder / "ck-corrupt.weights", reference_weights)
