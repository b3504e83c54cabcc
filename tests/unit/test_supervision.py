"""The trainer's side of a supervised job (cluster_kit/supervision.py), on the CPU.

A `Supervision` object is used directly where no hook is involved; whatever installs
process-wide hooks (excepthook, faulthandler, SIGUSR1, the watcher) runs in a fresh
interpreter, as a rank would.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from cluster_kit.analysis.culprit import first_failure
from cluster_kit.analysis.flight_recorder import parse_dump
from cluster_kit.analysis.rank_files import parse_stack, read_exceptions
from cluster_kit.trainer import supervision
from cluster_kit.trainer.contract import parse_heartbeat
from cluster_kit.trainer.supervision import Supervision

REPO = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_first_beat_writes_and_later_ones_wait_for_the_interval(tmp_path: Path) -> None:
    link = Supervision(str(tmp_path), rank=2, interval_s=3600, host="n7")
    link.beat()
    path = tmp_path / "heartbeat" / "rank-2"
    first = parse_heartbeat(path.read_text())
    assert (first.steps, first.host, first.pid) == (1, "n7", os.getpid())
    assert abs(first.time - time.time()) < 5
    assert mode(path) == 0o600 and mode(tmp_path / "heartbeat") == 0o700
    for _ in range(1000):
        link.beat()
    assert parse_heartbeat(path.read_text()).steps == 1 and link.steps == 1001


def test_every_beat_writes_once_the_interval_has_passed(tmp_path: Path) -> None:
    link = Supervision(str(tmp_path), rank=0, interval_s=0)
    for _ in range(3):
        link.beat()
    assert (tmp_path / "heartbeat" / "rank-0").read_text().startswith("3 ")
    assert len((tmp_path / "heartbeat" / "rank-0").read_text().splitlines()) == 1


def test_the_watcher_writes_the_last_count_with_the_time_of_the_last_step(tmp_path: Path) -> None:
    link = Supervision(str(tmp_path), rank=1, interval_s=0.05)
    link.flush_heartbeat()
    assert not (tmp_path / "heartbeat").exists()  # no step yet: nothing to say
    for _ in range(3):
        link.beat()
    ended = time.time()
    assert parse_heartbeat((tmp_path / "heartbeat" / "rank-1").read_text()).steps == 1
    time.sleep(0.3)  # the loop hangs
    link.flush_heartbeat()
    beat = parse_heartbeat((tmp_path / "heartbeat" / "rank-1").read_text())
    assert beat.steps == 3 and abs(beat.time - ended) < 0.1  # not the time of the write


def test_a_heartbeat_that_cannot_be_written_does_not_stop_training(tmp_path: Path) -> None:
    (tmp_path / "heartbeat").write_text("a file where the folder should be")
    link = Supervision(str(tmp_path), rank=0, interval_s=0)
    link.beat()
    link.beat()
    assert link.steps == 2


def test_a_dump_request_is_answered_once_with_stack_recorder_and_done_last(tmp_path: Path) -> None:
    link = Supervision(str(tmp_path), rank=3, host="n2")
    assert link.new_request() is None
    (tmp_path / "dump-request").write_text("hang-7\n")
    link.beat()
    link.poll_once()
    folder = tmp_path / "dumps" / "hang-7"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["rank-3.done", "rank-3.fr.json", "rank-3.stack"]
    assert mode(folder) == 0o700 and all(mode(folder / n) == 0o600 for n in names)
    done, stack = (folder / "rank-3.done").stat(), (folder / "rank-3.stack").stat()
    assert done.st_mtime_ns >= stack.st_mtime_ns and done.st_size == 0
    dump = parse_stack((folder / "rank-3.stack").read_text())
    assert dump.header["rank"] == "3" and dump.header["host"] == "n2" and dump.header["steps"] == "1"
    main = dump.main_thread()
    assert main is not None and any(f.function.startswith("test_a_dump_request") for f in main.frames)
    recorder = json.loads((folder / "rank-3.fr.json").read_text())
    assert recorder["format"] == "clusterkit.fr/1" and recorder["rank"] == 3
    assert parse_dump((folder / "rank-3.fr.json").read_text()).rank == 3
    link.poll_once()
    assert (folder / "rank-3.stack").stat().st_mtime_ns == stack.st_mtime_ns  # answered once


def test_a_restarted_rank_does_not_answer_an_old_request_again(tmp_path: Path) -> None:
    (tmp_path / "dump-request").write_text("hang-1")
    Supervision(str(tmp_path), rank=0).poll_once()
    again = Supervision(str(tmp_path), rank=0)
    assert again.new_request() is None
    assert Supervision(str(tmp_path), rank=1).new_request() == "hang-1"  # another rank still owes it


@pytest.mark.parametrize("request_id", ["../../etc", ".", "a b", "x" * 65, ""])
def test_a_request_id_that_is_not_a_plain_token_is_ignored(tmp_path: Path, request_id: str) -> None:
    (tmp_path / "dump-request").write_text(request_id)
    Supervision(str(tmp_path), rank=0).poll_once()
    assert not (tmp_path / "dumps").exists()


def test_the_stop_file_turns_stop_on(tmp_path: Path) -> None:
    link = Supervision(str(tmp_path), rank=0)
    link.poll_once()
    assert not link.stop
    (tmp_path / "stop").write_text("")
    link.poll_once()
    assert link.stop


def test_rank_and_interval_from_the_environment() -> None:
    assert supervision.rank_from_env({"RANK": "5", "SLURM_PROCID": "2"}) == 5
    assert supervision.rank_from_env({"SLURM_PROCID": "2"}) == 2
    assert supervision.rank_from_env({}) == 0
    assert supervision.interval_from_env({"CLUSTERKIT_HEARTBEAT_INTERVAL": "0.25"}) == 0.25
    assert supervision.interval_from_env({"CLUSTERKIT_HEARTBEAT_INTERVAL": "soon"}) == 1.0
    assert supervision.interval_from_env({}) == 1.0


def test_the_node_is_slurms_name_for_it_else_the_host_name() -> None:
    assert supervision.node_from_env({"SLURMD_NODENAME": "gpu001"}) == "gpu001"
    assert supervision.node_from_env({"SLURMD_NODENAME": " "}) == socket.gethostname()
    assert supervision.node_from_env({}) == socket.gethostname()


def test_ddp_exports_the_trainer_calls() -> None:
    pytest.importorskip("torch")
    from cluster_kit import ddp

    assert ddp.heartbeat is supervision.heartbeat and ddp.stop_requested is supervision.stop_requested
    assert ddp.enable_supervision is supervision.enable_supervision


# --- in a fresh interpreter, as a rank ------------------------------------------------------------
def run_rank(code: str, control: Path | None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERKIT_")}
    environ.update(env, PYTHONPATH=str(REPO))
    if control is not None:
        environ["CLUSTERKIT_CONTROL_DIR"] = str(control)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, check=False,
                          capture_output=True, text=True, timeout=60)


def test_without_a_control_folder_every_call_is_a_no_op(tmp_path: Path) -> None:
    out = run_rank("""
        import sys, threading
        from cluster_kit.trainer import supervision
        for _ in range(3):
            supervision.heartbeat()
        print(supervision.stop_requested(), supervision.enable_supervision(), threading.active_count(),
              sys.excepthook is sys.__excepthook__)
    """, None, RANK="1")
    assert out.stdout.split() == ["False", "None", "1", "True"], out.stderr


def test_an_uncaught_exception_leaves_its_traceback(tmp_path: Path) -> None:
    out = run_rank("""
        from cluster_kit.trainer import supervision
        def load(step):
            raise KeyError(f"sample {step}")
        supervision.heartbeat()
        load(4)
    """, tmp_path, RANK="6", SLURMD_NODENAME="gpu007")
    assert out.returncode == 1 and "KeyError: 'sample 4'" in out.stderr  # the usual hook still prints
    path = tmp_path / "exceptions" / "rank-6.txt"
    assert mode(path) == 0o600 and mode(tmp_path / "exceptions") == 0o700
    report = read_exceptions(str(tmp_path))[0]
    assert report.rank == 6 and report.host == "gpu007" and report.time is not None
    assert report.last_lines(1) == ("KeyError: 'sample 4'",)
    assert "Traceback (most recent call last):" in report.text and 'line 4, in load' in report.text
    # the Flight Recorder beside it: here torch was never loaded, and the file says so
    dump_path = tmp_path / "exceptions" / "rank-6.fr.json"
    assert mode(dump_path) == 0o600
    written = json.loads(dump_path.read_text())
    assert (written["rank"], written["host"], written["recorders"]) == (6, "gpu007", {})
    assert written["errors"] == {"torch": "torch.distributed is not loaded in this process"}
    assert parse_dump(dump_path.read_text()).host == "gpu007"


def test_a_forked_child_that_raises_leaves_no_file_under_the_ranks_name(tmp_path: Path) -> None:
    out = run_rank("""
        import os, sys
        from cluster_kit.trainer import supervision
        supervision.heartbeat()
        pid = os.fork()
        if pid == 0:
            sys.excepthook(ValueError, ValueError("in the worker"), None)
            os._exit(0)
        os.waitpid(pid, 0)
        supervision.heartbeat()
        print("parent done")
    """, tmp_path, RANK="1")
    assert out.stdout.strip() == "parent done" and "ValueError: in the worker" in out.stderr
    assert not (tmp_path / "exceptions").exists()


def test_a_fatal_signal_leaves_every_threads_stack(tmp_path: Path) -> None:
    out = run_rank("""
        import faulthandler
        from cluster_kit.trainer import supervision
        def step():
            faulthandler._sigsegv()
        supervision.heartbeat()
        step()
    """, tmp_path, RANK="2")
    assert out.returncode == -11
    text = (tmp_path / "faults" / "rank-2.txt").read_text()
    assert "Fatal Python error: Segmentation fault" in text
    crash = first_failure(read_exceptions(str(tmp_path)))
    assert crash is not None and crash.rank == 2
    assert crash.evidence == "rank 2 died of a fatal signal first: Fatal Python error: Segmentation fault at <string>:5 in step"


def test_sigusr1_and_the_stop_file_turn_stop_requested_on(tmp_path: Path) -> None:
    out = run_rank("""
        import os, signal, sys, time
        from cluster_kit.trainer import supervision
        print(supervision.stop_requested())
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        print(supervision.stop_requested())
    """, tmp_path)
    assert out.stdout.split() == ["False", "True"], out.stderr
    (tmp_path / "stop").write_text("")
    out = run_rank("""
        import time
        from cluster_kit.trainer import supervision
        deadline = time.monotonic() + 10
        while not supervision.stop_requested() and time.monotonic() < deadline:
            time.sleep(0.05)
        print(supervision.stop_requested(), round(time.monotonic() - deadline + 10, 1) <= 1.0)
    """, tmp_path)
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_a_first_sigterm_asks_the_rank_to_stop_and_a_second_ends_it(tmp_path: Path) -> None:
    out = run_rank("""
        import os, signal, time
        from cluster_kit.trainer import supervision
        print(supervision.stop_requested(), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        print(supervision.stop_requested(), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("still here")
    """, tmp_path)
    assert (out.returncode, out.stdout.split()) == (-15, ["False", "True"]), out.stderr


def test_a_sigterm_handler_of_the_script_keeps_running(tmp_path: Path) -> None:
    out = run_rank("""
        import os, signal, time
        signal.signal(signal.SIGTERM, lambda n, f: print("theirs", flush=True))
        from cluster_kit.trainer import supervision
        supervision.enable_supervision()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        print(supervision.stop_requested())
    """, tmp_path)
    assert (out.returncode, out.stdout.split()) == (0, ["theirs", "theirs", "True"]), out.stderr


def test_build_steps_beat_by_themselves_once_a_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = """
        import torch, torch.distributed as dist
        from cluster_kit import ddp
        dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
        model = ddp.wrap_ddp(torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        batch = (torch.randn(3, 4), torch.randn(3, 2))
        step = ddp.build_step(model, opt, torch.nn.functional.mse_loss, batch)
        for _ in range(7):
            step(*batch)
        print(type(step).__name__, open("{control}/heartbeat/rank-0").read().split()[0])
        dist.destroy_process_group()
    """
    plain = run_rank(code.format(store=tmp_path / "s1", control=tmp_path / "c1"), tmp_path / "c1",
                     CLUSTERKIT_HEARTBEAT_INTERVAL="0")
    assert plain.stdout.split() == ["GraphedStep", "7"], plain.stderr
    profiled = run_rank(code.format(store=tmp_path / "s2", control=tmp_path / "c2"), tmp_path / "c2",
                        CLUSTERKIT_HEARTBEAT_INTERVAL="0", CLUSTERKIT_PROFILE_STEPS="2",
                        CLUSTERKIT_PROFILE_DIR=str(tmp_path / "traces"))
    assert profiled.stdout.split() == ["ProfiledStep", "7"], profiled.stderr


def test_paused_writes_the_heartbeat_at_once_when_it_begins_and_ends(tmp_path: Path) -> None:
    link = Supervision(str(tmp_path), rank=1, interval_s=3600, host="n2")
    link.beat()
    path = tmp_path / "heartbeat" / "rank-1"
    before = time.time()
    link.pause("checkpoint")
    link.pause("nested")
    inside = parse_heartbeat(path.read_text())
    assert inside.steps == 1 and inside.paused_since is not None and inside.paused_since >= round(before, 3) - 0.001
    link.resume()
    assert parse_heartbeat(path.read_text()).paused_since == inside.paused_since  # still inside the outer one
    link.resume()
    after = parse_heartbeat(path.read_text())
    assert after.paused_since is None and after.resumed_at is not None and after.resumed_at >= inside.paused_since
    link.beat()  # later lines keep the end of the last pause
    assert parse_heartbeat(path.read_text()).resumed_at == after.resumed_at


def test_paused_is_a_no_op_without_supervision() -> None:
    script = textwrap.dedent("""
        import os
        os.environ.pop("CLUSTERKIT_CONTROL_DIR", None)
        from cluster_kit import ddp
        with ddp.paused("checkpoint"):
            print("inside")
        print("after")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120,
                          check=False)
    assert (done.returncode, done.stdout) == (0, "inside\nafter\n"), done.stderr


def test_the_recorders_together_get_the_time_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At an uncaught exception the dump must not hold the exit up: a recorder that
    hangs (its lock held by a stuck thread) is given up on within the bound."""
    def stuck() -> bytes:
        time.sleep(30)
        return b"{}"

    c10d = types.ModuleType("torch._C._distributed_c10d")
    c10d._dump_fr_trace_json = stuck  # type: ignore[attr-defined]
    c10d._dump_nccl_trace_json = stuck  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d", c10d)
    started = time.monotonic()
    out = Supervision(str(tmp_path), rank=1, host="n1").flight_recorder(timeout_s=0.5)
    assert time.monotonic() - started < 2.0
    assert out["recorders"] == {}
    assert out["errors"] == {"fr": "_dump_fr_trace_json: no answer in 0.5 s",
                             "nccl": "_dump_nccl_trace_json: no answer in 0 s"}


# --- stopped without finishing, and finished ------------------------------------------------------
def test_the_first_stop_a_rank_is_told_is_written_once_with_its_cause(tmp_path: Path) -> None:
    out = run_rank("""
        import os, signal, time
        from cluster_kit.trainer import supervision
        supervision.enable_supervision()
        os.kill(os.getpid(), signal.SIGTERM)  # Slurm's signal to the steps of a preempted job
        time.sleep(0.01)
        open(os.environ["CLUSTERKIT_CONTROL_DIR"] + "/stop", "w").close()
        time.sleep(1.2)  # the watcher sees the stop file too: the first cause stays
        print(supervision.stop_requested())
    """, tmp_path, RANK="2")
    assert out.stdout.split() == ["True"], out.stderr
    cause, when = (tmp_path / "stopped" / "rank-2").read_text().split()
    assert cause == "SIGTERM" and abs(float(when) - time.time()) < 60
    assert mode(tmp_path / "stopped" / "rank-2") == 0o600 and not (tmp_path / "finished").exists()


def test_the_stop_file_alone_is_a_stop_of_its_own_name(tmp_path: Path) -> None:
    link = Supervision(str(tmp_path), rank=0)
    (tmp_path / "stop").write_text("")
    link.poll_once()
    assert (tmp_path / "stopped" / "rank-0").read_text().split()[0] == "stop-file"


@pytest.mark.parametrize(("code", "finished"), [
    ("supervision.finished()", True),  # the script says so
    ("os.kill(os.getpid(), signal.SIGUSR1); time.sleep(0.01); supervision.finished()", True),  # it did all its steps
    ("pass", False),  # it just returned: whether it finished is not known
])
def test_a_rank_reports_that_training_finished_only_when_the_script_says_so(
        tmp_path: Path, code: str, finished: bool) -> None:
    out = run_rank(f"""
        import os, signal, time
        from cluster_kit.trainer import supervision
        supervision.enable_supervision()
        {code}
    """, tmp_path, RANK="1")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "finished" / "rank-1").exists() is finished


def test_a_checkpoint_wait_after_the_loop_reports_finished_unless_a_stop_was_asked(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = """
        import os, signal, time, torch
        from cluster_kit import checkpoint
        from cluster_kit.trainer import supervision
        supervision.enable_supervision()
        saver = checkpoint.configure("{ckpt}", every=1)
        {stop}
        saver.save(1, model=torch.nn.Linear(2, 2))
        saver.wait()
    """
    calm = run_rank(code.format(ckpt=tmp_path / "k1", stop=""), tmp_path / "c1")
    assert calm.returncode == 0, calm.stderr
    assert (tmp_path / "c1" / "finished" / "rank-0").read_text().split()[0] == "0"
    told = run_rank(code.format(ckpt=tmp_path / "k2", stop="os.kill(os.getpid(), signal.SIGUSR1); time.sleep(0.01)"),
                    tmp_path / "c2")
    assert told.returncode == 0, told.stderr
    assert not (tmp_path / "c2" / "finished").exists() and (tmp_path / "c2" / "stopped" / "rank-0").exists()


def test_a_pause_says_how_long_it_may_last_and_why(tmp_path: Path) -> None:
    link = Supervision(str(tmp_path), rank=0, interval_s=3600, host="n1")
    link.pause("checkpoint save: 3 shards", max_s=90)
    beat = parse_heartbeat((tmp_path / "heartbeat" / "rank-0").read_text())
    assert (beat.pause_max_s, beat.pause_reason) == (90.0, "checkpoint save: 3 shards")
    link.resume()
    link.pause("eval")
    assert parse_heartbeat((tmp_path / "heartbeat" / "rank-0").read_text()).pause_max_s == 1800.0
