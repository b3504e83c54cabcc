"""Checkpoints of a real 2-rank gloo job on localhost (no Slurm): faults, fallbacks, fencing, exactness.

Each test plays the supervisor: it starts the ranks of an attempt (checkpoint_job.py)
with the variables a supervised job exports, does to them what a fault would, and
starts the next attempt. Every resumed run must end with the weights of the run that
was never interrupted, bit for bit: dropout, the LR schedule and the shuffled
sampler's position all come back with the checkpoint.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from checkpoint_job import STEPS, Attempt, start_attempt
from supervised_job import wait_until

from cluster_kit.trainer.checkpoint import store

pytestmark = pytest.mark.slow


def finished(attempt: Attempt) -> list[str]:
    """The ranks' outputs once they all exited 0."""
    results = attempt.wait()
    assert [code for code, _ in results] == [0, 0], results
    return [out for _, out in results]


def weights(workdir: Path, attempt: int) -> dict[str, torch.Tensor]:
    return torch.load(workdir / f"weights-{attempt}.pt", weights_only=True)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), "the weights differ"


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final weights of the run nothing interrupts."""
    workdir = tmp_path_factory.mktemp("clean")
    outputs = finished(start_attempt(workdir, 0))
    assert f"rank 0: trained to step {STEPS}" in outputs[0]
    assert [n for _, n in store.committed(str(workdir / "ckpt"))] == ["step-24", "step-20", "step-16"]
    return weights(workdir, 0)


def test_a_run_resumed_mid_epoch_ends_bit_identical(tmp_path: Path, clean: dict[str, torch.Tensor]) -> None:
    """Attempt 0 is lost after step 14 (asynchronous saves at 4, 8, 12); attempt 1 goes on from the last.

    The write of step 12 may die with the process that made it (that is the price of
    writing behind): then step 8 is the last one, at an epoch's end instead of mid-epoch.
    It may also die between its folder's rename and ``latest``'s update: the next
    attempt loads the newest committed folder, so that is the one to expect.
    """
    finished(start_attempt(tmp_path, 0, "--exit-after", "14", "--async"))
    latest = store.committed(str(tmp_path / "ckpt"))[0][1]
    assert latest in ("step-12", "step-8")
    assert store.read_latest(str(tmp_path / "ckpt")) in ("step-12", "step-8")
    outputs = finished(start_attempt(tmp_path, 1, "--async"))
    assert f"rank 1: attempt 1 starts at step {latest[5:]}" in outputs[1]
    assert_same(weights(tmp_path, 1), clean)
    status = json.loads((tmp_path / "attempt-1" / "checkpoint.json").read_text())
    assert status["loaded"] == {"step": int(latest[5:]), "name": latest} and status["mode"] == "async"
    assert status["last"]["step"] == 24 and status["save_s"] > 0 and status["write_s"] > 0


def test_rank_0_killed_in_the_middle_of_a_save_leaves_the_previous_checkpoint(
        tmp_path: Path, clean: dict[str, torch.Tensor]) -> None:
    lost = start_attempt(tmp_path, 0, "--hold-save", "16")
    try:
        wait_until(lambda: (tmp_path / "held").exists(), 120, "rank 0 inside the save of step 16")
        os.kill(lost.processes[0].pid, signal.SIGKILL)
    finally:
        lost.kill()  # rank 1 waits for rank 0: the supervisor ends the attempt
    assert lost.processes[0].returncode == -signal.SIGKILL
    partial = tmp_path / "ckpt" / store.partial_name(16, "4711", 0)
    assert (partial / "model.pt").is_file() and not (partial / "manifest.json").exists()
    assert store.read_latest(str(tmp_path / "ckpt")) == "step-12"

    outputs = finished(start_attempt(tmp_path, 1))
    assert "rank 0: attempt 1 starts at step 12" in outputs[0]  # mid-epoch: 8 batches an epoch
    assert not partial.exists()  # the lost attempt's debris is gone
    assert_same(weights(tmp_path, 1), clean)


def test_a_corrupt_latest_checkpoint_falls_back_and_says_so(tmp_path: Path, clean: dict[str, torch.Tensor]) -> None:
    finished(start_attempt(tmp_path, 0, "--exit-after", "10"))
    model_file = tmp_path / "ckpt" / "step-8" / "model.pt"
    data = bytearray(model_file.read_bytes())
    data[-100] ^= 0x01  # one bit, as a bad disk or a torn copy would leave
    model_file.write_bytes(bytes(data))

    outputs = finished(start_attempt(tmp_path, 1))  # exit 0: nothing here is any node's fault
    assert "rank 0: attempt 1 starts at step 4" in outputs[0] and "rank 1: attempt 1 starts at step 4" in outputs[1]
    assert "step-8 failed verification (model.pt: sha256" in outputs[0]
    assert "set aside as step-8.corrupt" in outputs[0]
    assert (tmp_path / "ckpt" / "step-8.corrupt" / "set-aside.json").is_file()
    status = json.loads((tmp_path / "attempt-1" / "checkpoint.json").read_text())
    assert [(e["name"], e["as"]) for e in status["set_aside"]] == [("step-8", "step-8.corrupt")]
    assert_same(weights(tmp_path, 1), clean)


def test_a_late_write_from_a_lost_attempt_is_refused(tmp_path: Path, clean: dict[str, torch.Tensor]) -> None:
    go = tmp_path / "go"
    lost = start_attempt(tmp_path, 0, "--wait-for", str(go))
    try:
        wait_until(lambda: store.read_latest(str(tmp_path / "ckpt")) == "step-4", 120, "attempt 0's step 4")
        finished(start_attempt(tmp_path, 1))  # the next attempt resumes and trains to the end
        before = {p.name: (p / "manifest.json").read_text() for p in (tmp_path / "ckpt").glob("step-*")}
        go.touch()  # the lost attempt's ranks come back and save
        results = lost.wait()
    finally:
        lost.kill()
    assert [code for code, _ in results] == [3, 3], results
    for _, out in results:
        assert "refused: checkpoint refused: this rank belongs to attempt 0 of job 4711, but attempt 1" in out
    after = {p.name: (p / "manifest.json").read_text() for p in (tmp_path / "ckpt").glob("step-*")}
    assert after == before and sorted(after) == ["step-16", "step-20", "step-24"]
    refused = json.loads((tmp_path / "attempt-0" / "checkpoint.json").read_text())["refused"]
    assert [e["step"] for e in refused] == [8]
    assert_same(weights(tmp_path, 1), clean)
