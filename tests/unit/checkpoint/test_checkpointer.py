"""Saving and resuming a real CPU training run through cluster_kit.checkpoint (one process).

The multi-rank cases (rank 0 killed mid-save, a late write from a lost attempt, resume
of a DDP run) are in tests/integration/test_checkpoint_ranks.py.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
numpy = pytest.importorskip("numpy")

from checkpoint_trainer import Trainer, make_trainer

from cluster_kit import checkpoint
from cluster_kit.checkpoint import Checkpointer, CheckpointError, Fenced, store
from cluster_kit.trainer import supervision

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def trainer() -> Trainer:
    return make_trainer()


def env(attempt: int = 0, control: Path | None = None, **more: str) -> dict[str, str]:
    """What the supervisor exports to a rank (without a checkpoint folder: the tests pass one)."""
    out = {"CLUSTERKIT_ATTEMPT": str(attempt), "CLUSTERKIT_CHAIN_ID": "4711", **more}
    if control is not None:
        control.mkdir(mode=0o700, exist_ok=True)
        out["CLUSTERKIT_CONTROL_DIR"] = str(control)
    return out


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def optimizer_tensors(optimizer: Any) -> list[Any]:
    return [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]


# --- save and load -----------------------------------------------------------------------
def test_load_restores_every_object_in_place(tmp_path: Path, trainer: Trainer) -> None:
    saver = Checkpointer(str(tmp_path), environ={})
    assert saver.load(**trainer.objects()) is None  # nothing yet: start from step 0
    for step in range(3):
        trainer.step(step)
    saver.save(3, **trainer.objects(), note={"best": 0.25, "tags": ("a", 1)})
    fresh = make_trainer(seed=1)
    loaded = Checkpointer(str(tmp_path), environ={}).load(**fresh.objects())
    assert loaded is not None and (loaded.step, loaded.name, loaded.attempt) == (3, "step-3", 0)
    assert loaded["note"] == {"best": 0.25, "tags": ("a", 1)}
    assert same(fresh.weights(), trainer.weights())
    assert same(optimizer_tensors(fresh.optimizer), optimizer_tensors(trainer.optimizer))
    assert fresh.scheduler.state_dict()["last_epoch"] == 3
    assert fresh.optimizer.param_groups[0]["lr"] == trainer.optimizer.param_groups[0]["lr"] == 0.01 * 0.9 ** 3
    assert fresh.scaler.state_dict() == trainer.scaler.state_dict()
    assert loaded.manifest["contents"] == {"model": "module", "note": "value", "optimizer": "optimizer",
                                           "scaler": "state_dict", "scheduler": "state_dict"}


def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path: Path) -> None:
    """Dropout, the LR schedule, the scaler and the Python and numpy generators all go on as before."""
    random.seed(0), numpy.random.seed(0)  # as each run's script would at its start
    clean = make_trainer()
    for step in range(6):
        clean.step(step)
    clean_draws = (random.random(), numpy.random.rand(), torch.rand(1))

    random.seed(0), numpy.random.seed(0)
    first = make_trainer()
    for step in range(3):
        first.step(step)
    Checkpointer(str(tmp_path), environ={}).save(3, **first.objects())
    random.seed(99), numpy.random.seed(99), torch.manual_seed(99)  # the next process starts elsewhere

    resumed = make_trainer(seed=5)
    loaded = Checkpointer(str(tmp_path), environ=env(attempt=1)).load(**resumed.objects())
    assert loaded is not None
    for step in range(loaded.step, 6):
        resumed.step(step)
    assert same(resumed.weights(), clean.weights())
    assert (random.random(), numpy.random.rand()) == clean_draws[:2]
    assert torch.equal(torch.rand(1), clean_draws[2])


def test_a_wrapped_model_saves_as_the_bare_one(tmp_path: Path, trainer: Trainer) -> None:
    wrapper = torch.nn.Module()
    wrapper._orig_mod = trainer.model  # what torch.compile's wrapper holds
    Checkpointer(str(tmp_path), environ={}).save(1, model=wrapper)
    saved = torch.load(tmp_path / "step-1" / "model.pt", weights_only=True)
    assert list(saved) == list(trainer.model.state_dict())


def test_load_names_what_the_checkpoint_lacks(tmp_path: Path, trainer: Trainer) -> None:
    Checkpointer(str(tmp_path), environ={}).save(1, model=trainer.model)
    with pytest.raises(CheckpointError, match=r"step-1 has no optimizer, scheduler \(it holds model\)"):
        Checkpointer(str(tmp_path), environ={}).load(model=trainer.model, optimizer=trainer.optimizer,
                                                     scheduler=trainer.scheduler)


def test_reserved_names_and_a_missing_folder_are_refused(tmp_path: Path, trainer: Trainer) -> None:
    with pytest.raises(ValueError, match="rng: reserved names"):
        Checkpointer(str(tmp_path), environ={}).save(1, rng=1)
    with pytest.raises(CheckpointError, match="no checkpoint folder: pass one"):
        Checkpointer(environ={}).load()


def test_the_same_step_is_saved_once(tmp_path: Path, trainer: Trainer) -> None:
    saver = Checkpointer(str(tmp_path), environ={})
    saver.save(4, model=trainer.model)
    before = (tmp_path / "step-4" / "manifest.json").read_text()
    saver.save(4, model=trainer.model)  # the stop signal right after a periodic save
    assert (tmp_path / "step-4" / "manifest.json").read_text() == before
    assert [name for _, name in store.committed(str(tmp_path))] == ["step-4"]


def test_only_the_last_n_are_kept(tmp_path: Path, trainer: Trainer) -> None:
    saver = Checkpointer(str(tmp_path), keep=2, environ={})
    for step in (1, 2, 3, 4):
        saver.save(step, model=trainer.model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fence", "latest", "step-3", "step-4"]
    from_env = Checkpointer(str(tmp_path), environ={"CLUSTERKIT_KEEP_CHECKPOINTS": "1"})
    from_env.save(5, model=trainer.model)
    assert [name for _, name in store.committed(str(tmp_path))] == ["step-5"]


# --- verified ------------------------------------------------------------------------------
def test_a_corrupt_latest_is_set_aside_and_the_one_before_loads(
        tmp_path: Path, trainer: Trainer, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "ckpt"
    saver = Checkpointer(str(folder), environ={})
    saver.save(5, **trainer.objects())
    at_five = trainer.weights()
    trainer.step(5)
    saver.save(6, **trainer.objects())
    data = bytearray((folder / "step-6" / "model.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit of the weights: still a loadable file
    (folder / "step-6" / "model.pt").write_bytes(bytes(data))

    fresh = make_trainer(seed=1)
    with caplog.at_level(logging.WARNING, logger="cluster_kit.checkpoint"):
        loaded = Checkpointer(str(folder), environ=env(1, tmp_path / "control")).load(**fresh.objects())
    assert loaded is not None and loaded.step == 5 and same(fresh.weights(), at_five)
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("step-")) == ["step-5", "step-6.corrupt"]
    assert f"checkpoint {folder}/step-6 failed verification (model.pt: sha256 " in caplog.text
    assert "set aside as step-6.corrupt; trying the one before" in caplog.text
    status = json.loads((tmp_path / "control" / "checkpoint.json").read_text())
    assert [(e["name"], e["as"]) for e in status["set_aside"]] == [("step-6", "step-6.corrupt")]
    assert status["loaded"] == {"step": 5, "name": "step-5"}


def test_with_every_checkpoint_corrupt_load_starts_afresh(tmp_path: Path, trainer: Trainer) -> None:
    Checkpointer(str(tmp_path), environ={}).save(5, model=trainer.model)
    (tmp_path / "step-5" / "manifest.json").write_text("{")
    assert Checkpointer(str(tmp_path), environ={}).load(model=trainer.model) is None
    assert (tmp_path / "step-5.corrupt").is_dir()


# --- fenced --------------------------------------------------------------------------------
def test_a_save_from_an_older_attempt_is_refused(tmp_path: Path, trainer: Trainer,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "ckpt"
    old = Checkpointer(str(folder), environ=env(0, tmp_path / "attempt-0"))
    old.save(5, model=trainer.model)
    assert Checkpointer(str(folder), environ=env(1)).load(model=make_trainer().model) is not None
    with caplog.at_level(logging.WARNING, logger="cluster_kit.checkpoint"), \
            pytest.raises(Fenced, match="belongs to attempt 0 of job 4711, but attempt 1 of job 4711 has started"):
        old.save(10, model=trainer.model)
    assert "checkpoint refused" in caplog.text
    assert [name for _, name in store.committed(str(folder))] == ["step-5"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".partial")]
    refused = json.loads((tmp_path / "attempt-0" / "checkpoint.json").read_text())["refused"]
    assert [e["step"] for e in refused] == [10]


class Gate:
    """A value whose pickling waits for ``opened``: it holds a background write where it is."""

    def __init__(self) -> None:
        self.reached, self.opened = threading.Event(), threading.Event()

    def __reduce__(self) -> tuple[Any, ...]:
        self.reached.set()
        self.opened.wait()
        return (int, (0,))


def test_an_asynchronous_write_overtaken_by_the_next_attempt_is_refused_at_its_commit(
        tmp_path: Path, trainer: Trainer) -> None:
    old = Checkpointer(str(tmp_path), environ=env(0))
    old.save(5, model=trainer.model)
    gate = Gate()
    old.save(6, async_=True, model=trainer.model, gate=gate)
    assert gate.reached.wait(60) and old.in_flight
    Checkpointer(str(tmp_path), environ=env(1)).load(model=make_trainer().model)  # the next attempt starts
    gate.opened.set()
    with pytest.raises(Fenced, match="attempt 1 of job 4711 has started since"):
        old.wait()
    assert [name for _, name in store.committed(str(tmp_path))] == ["step-5"]
    assert store.read_latest(str(tmp_path)) == "step-5"


# --- asynchronous --------------------------------------------------------------------------
def test_an_asynchronous_save_copies_in_the_step_and_writes_behind(tmp_path: Path, trainer: Trainer) -> None:
    saver = Checkpointer(str(tmp_path), async_=True, environ=env(0, tmp_path / "control"))
    saver.save(1, model=trainer.model, optimizer=trainer.optimizer)
    saved = trainer.weights()
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(1.0)  # training goes on while the write runs
    saver.wait()
    assert not saver.in_flight
    fresh = make_trainer(seed=3)
    Checkpointer(str(tmp_path), environ={}).load(model=fresh.model)
    assert same(fresh.weights(), saved)
    status = json.loads((tmp_path / "control" / "checkpoint.json").read_text())
    assert status["mode"] == "async" and status["last"]["step"] == 1
    assert status["save_s"] > 0 and status["write_s"] > 0
    assert saver.save_s == status["save_s"] and saver.write_s == status["write_s"]
    manifest = json.loads((tmp_path / "step-1" / "manifest.json").read_text())
    assert manifest["measured"]["write_s"] == status["write_s"]


def test_a_failed_background_write_is_raised_by_the_next_call(tmp_path: Path, trainer: Trainer) -> None:
    saver = Checkpointer(str(tmp_path), async_=True, environ={})
    saver.save(1, model=trainer.model, bad=[lambda: 0])  # torch.save cannot pickle a lambda
    with pytest.raises(Exception, match="lambda"):
        saver.wait()
    saver.wait()  # raised once
    saver.save(2, model=trainer.model, bad=[lambda: 0])
    with pytest.raises(Exception, match="lambda"):
        saver.save(3, model=trainer.model)
    assert store.committed(str(tmp_path)) == []


RANK_SCRIPT = textwrap.dedent("""
    import os, signal, sys, torch
    from cluster_kit import checkpoint
    from cluster_kit.trainer import supervision
    folder, how = sys.argv[1], sys.argv[2]
    saver = checkpoint.Checkpointer(folder, async_=True)
    state = {"weights": torch.arange(16 << 20, dtype=torch.float32)}
    if how == "stop":
        supervision.enable_supervision()
        os.kill(os.getpid(), signal.SIGUSR1)  # what the supervisor's grace signal becomes
        while not supervision.stop_requested():
            signal.sigtimedwait([], 0.05)
    saver.save(1, **state)
    print("in flight" if saver.in_flight else "committed", os.path.isdir(os.path.join(folder, "step-1")))
    if how == "stop":  # the heartbeat's last field: the hang clock ran again after the save
        print(open(os.path.join(os.environ["CLUSTERKIT_CONTROL_DIR"], "heartbeat", "rank-0")).read().split()[-1][:8])
""")


@pytest.mark.parametrize("how, printed", [("exit", "in flight False"), ("stop", "committed True\nresumed:")])
def test_a_save_in_flight_completes_before_the_process_exits(tmp_path: Path, how: str, printed: str) -> None:
    """At a stop signal the save blocks; without one the interpreter waits for the writer at exit."""
    control = tmp_path / "control"
    control.mkdir(mode=0o700)
    run = subprocess.run([sys.executable, "-c", RANK_SCRIPT, str(tmp_path / "ckpt"), how],
                         env=dict(os.environ, PYTHONPATH=str(REPO), CLUSTERKIT_CONTROL_DIR=str(control)),
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == printed
    assert store.verify(str(tmp_path / "ckpt"), "step-1") is None


# --- the hang clock ------------------------------------------------------------------------
def test_a_blocking_save_pauses_the_hang_clock_and_an_asynchronous_one_does_not(
        tmp_path: Path, trainer: Trainer, monkeypatch: pytest.MonkeyPatch) -> None:
    reasons: list[str] = []
    gate = Gate()

    @contextlib.contextmanager
    def recording(reason: str) -> Iterator[None]:
        reasons.append(reason)
        gate.opened.set()  # the write in flight may end once its waiter has paused the clock
        yield

    monkeypatch.setattr(supervision, "paused", recording)
    saver = Checkpointer(str(tmp_path), environ={})
    saver.save(1, model=trainer.model)
    assert reasons == ["checkpoint save"]
    reasons.clear()
    gate.opened.clear()
    saver.save(2, async_=True, model=trainer.model, gate=gate)
    assert reasons == []  # the copy to host memory is all the step waits for
    assert gate.reached.wait(60) and saver.in_flight
    saver.wait()
    assert reasons == ["waiting for the last checkpoint write"]
    assert store.verify(str(tmp_path), "step-2") is None


# --- the graphed step ----------------------------------------------------------------------
def test_a_plain_optimizers_checkpoint_loads_into_a_capturable_one(tmp_path: Path) -> None:
    """build_step needs capturable=True and step counts on the parameters' device after a resume."""
    plain = make_trainer()
    plain.step(0)
    Checkpointer(str(tmp_path), environ={}).save(1, optimizer=plain.optimizer)
    graphed = make_trainer(capturable=True)
    Checkpointer(str(tmp_path), environ={}).load(optimizer=graphed.optimizer)
    group = graphed.optimizer.param_groups[0]
    assert group["capturable"] is True and group["fused"] is None
    for param, state in graphed.optimizer.state.items():
        assert state["step"].device == param.device and state["step"].dtype == torch.float32
    assert same(optimizer_tensors(graphed.optimizer), optimizer_tensors(plain.optimizer))


# --- sharded (DCP) -------------------------------------------------------------------------
def test_a_sharded_state_goes_through_dcp_and_back(tmp_path: Path, trainer: Trainer) -> None:
    trainer.step(0)
    Checkpointer(str(tmp_path), sharded=True, environ={}).save(1, **trainer.objects())
    manifest = json.loads((tmp_path / "step-1" / "manifest.json").read_text())
    assert manifest["contents"]["model"] == manifest["contents"]["optimizer"] == "sharded"
    assert ".metadata" in {name.split("/")[1] for name in manifest["files"] if name.startswith("dcp/")}
    assert not (tmp_path / "step-1" / "model.pt").exists()
    fresh = make_trainer(seed=7)
    Checkpointer(str(tmp_path), sharded=True, environ={}).load(**fresh.objects())
    assert same(fresh.weights(), trainer.weights())
    assert same(optimizer_tensors(fresh.optimizer), optimizer_tensors(trainer.optimizer))
    assert fresh.scheduler.state_dict()["last_epoch"] == 1
    shard = next((tmp_path / "step-1" / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-1])
    assert (store.verify(str(tmp_path), "step-1") or "").startswith(f"dcp/{shard.name}: sha256")


# --- when to save --------------------------------------------------------------------------
def test_a_fixed_step_count_is_due_at_its_multiples(tmp_path: Path, trainer: Trainer) -> None:
    saver = Checkpointer(str(tmp_path), every=5, environ={})
    assert [s for s in range(1, 13) if saver.due(s)] == [5, 10]
    saver.save(10, model=trainer.model)
    assert not saver.due(10)  # just saved
    from_env = Checkpointer(str(tmp_path), environ={"CLUSTERKIT_CHECKPOINT_EVERY": "3"})
    assert [s for s in range(1, 8) if from_env.due(s)] == [3, 6]


def test_auto_saves_early_first_then_at_the_interval_it_measured(tmp_path: Path, trainer: Trainer) -> None:
    saver = Checkpointer(str(tmp_path), environ=env(0, tmp_path / "control", CLUSTERKIT_MTBF_S="3600",
                                                    CLUSTERKIT_RESTART_S="60"))
    assert saver.load(model=trainer.model) is None
    due = [s for s in range(1, 11) if saver.due(s)]
    assert due == [10] and not saver.interval.measured
    saver.save(10, model=trainer.model)
    interval = saver.interval
    assert interval.measured and interval.why.startswith(f"every {interval.steps} step")
    assert interval.why.endswith("restart 60 s, MTBF 1.0 h at 1 node")
    next_due = 10 + interval.steps
    assert not saver.due(next_due - 1) and saver.due(next_due)
    status = json.loads((tmp_path / "control" / "checkpoint.json").read_text())
    assert status["interval"]["why"] == interval.why


def test_a_resumed_run_knows_its_interval_from_the_checkpoint(tmp_path: Path, trainer: Trainer) -> None:
    first = Checkpointer(str(tmp_path), environ=env(0))
    for step in range(1, 11):
        first.due(step)
    first.save(10, model=trainer.model)
    resumed = Checkpointer(str(tmp_path), environ=env(1))
    resumed.load(model=trainer.model)
    assert (resumed.step_s, resumed.save_s) == (first.step_s, first.save_s)
    steps = resumed.interval.steps
    assert resumed.interval.measured and not resumed.due(10 + steps - 1) and resumed.due(10 + steps)


# --- the module-level calls ----------------------------------------------------------------
def test_the_module_level_calls_use_one_configured_checkpointer(tmp_path: Path, trainer: Trainer) -> None:
    checkpoint.configure(str(tmp_path), every=2)
    try:
        assert checkpoint.load(model=trainer.model) is None
        assert [s for s in range(1, 5) if checkpoint.due(s)] == [2, 4]
        checkpoint.save(4, async_=True, model=trainer.model)
        checkpoint.wait()
        loaded = checkpoint.load(model=make_trainer(seed=2).model)
        assert loaded is not None and loaded.step == 4
        assert checkpoint.default().directory == str(tmp_path)
    finally:
        checkpoint.configure(str(tmp_path / "unused"))
