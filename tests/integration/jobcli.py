"""Helpers for the job tests that drive the real `clusterkit` process on the dev cluster.

Every command runs as its own process from the repository root (the examples'
paths are relative to it), with the dev cluster's SLURM_CONF and none of the
user's CLUSTERKIT_* settings. `start` launches one without waiting, so that
slow Slurm jobs of a module overlap.
"""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240

# Prints one line per rank, then sleeps or exits as asked:
#   ranks.py [--sleep SECONDS] [--exit CODE]
# stdlib only, so that ckuser's /usr/bin/python3 runs it too.
RANKS_PY = """\
import os, pwd, sys, time
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "SLURMD_NODENAME")
print("ck-rank " + " ".join("%s=%s" % (k, os.environ.get(k, "?")) for k in keys)
      + " user=" + pwd.getpwuid(os.getuid()).pw_name, flush=True)
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
time.sleep(float(args.get("--sleep", 0)))
sys.exit(int(args.get("--exit", 0)))
"""


def clusterkit_argv() -> list[str]:
    """The installed console script next to this Python, else `python -m cluster_kit`."""
    script = Path(sys.executable).with_name("clusterkit")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cluster_kit"]


def cli_env(dev_cluster: Any, **extra: str) -> dict[str, str]:
    """The environment of a clusterkit process: the dev cluster's Slurm, no user settings."""
    env = {k: v for k, v in dev_cluster.slurm_env().items() if not k.startswith("CLUSTERKIT_")}
    env.update(extra)
    return env


def start(dev_cluster: Any, *args: str, env: dict[str, str] | None = None,
          cwd: Path = REPO) -> subprocess.Popen[str]:
    """`clusterkit ARGS...` running in the background (stdout/stderr captured).

    A suite started in the background of a shell without job control inherits
    SIGINT ignored, which exec passes on and under which Python never raises
    KeyboardInterrupt; a handled SIGINT is reset to the default by exec instead.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return subprocess.Popen(clusterkit_argv() + list(args), cwd=cwd, text=True,
                            env=env or cli_env(dev_cluster), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[str], timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Wait for a process from `start`; its CompletedProcess."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"{proc.args!r} still running after {timeout} s\n{stdout}{stderr}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def read_until(proc: subprocess.Popen[str], stream: IO[str] | None, pattern: str,
               timeout: float = 60) -> str:
    """What a running `start` process wrote to `stream` up to a line matching `pattern`.

    The event a test waits for before acting (a poll has begun, a node is being
    probed), within a deadline: AssertionError, the process killed, if the line
    does not come or the process ends first. Reads the pipe's file descriptor
    directly, so `finish` then returns the rest: prepend this text to it.
    """
    assert stream is not None
    fd, data = stream.fileno(), b""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, data.decode(errors="replace"), re.MULTILINE):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            why = "timed out" if not ready else f"ended (rc {proc.wait()})"
            proc.kill()
            raise AssertionError(f"{proc.args!r} {why} before a line matching {pattern!r}:\n"
                                 f"{data.decode(errors='replace')}")
        data += chunk
    return data.decode(errors="replace")


def clusterkit(dev_cluster: Any, *args: str, env: dict[str, str] | None = None,
               cwd: Path = REPO, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run `clusterkit ARGS...` to the end."""
    return finish(start(dev_cluster, *args, env=env, cwd=cwd), timeout)


def job_id_of(done: subprocess.CompletedProcess[str]) -> str:
    """The job id `submit` printed: its whole stdout, one line."""
    assert re.fullmatch(r"\d+\n", done.stdout), (done.stdout, done.stderr)
    return done.stdout.strip()


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rank_lines(log: str, marker: str = "ck-rank") -> dict[int, dict[str, str]]:
    """{rank: {key: value}} of the `key=value` lines that start with `marker`."""
    out = {}
    for line in log.splitlines():
        if line.startswith(marker):
            fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
            rank = int(fields.get("RANK", fields.get("rank", "-1")))
            assert rank not in out, f"rank {rank} printed twice:\n{log}"
            out[rank] = fields
    return out


@contextmanager
def shared_dir(prefix: str) -> Iterator[Path]:
    """A world-writable folder under /tmp: jobs run as ckuser can use it, and it is
    outside root's private pytest folders."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_ranks_script(folder: Path) -> Path:
    script = folder / "ranks.py"
    script.write_text(RANKS_PY)
    script.chmod(0o644)
    return script


def scancel(dev_cluster: Any, job_id: str) -> None:
    """Best-effort cleanup of a job a test started."""
    subprocess.run(["scancel", job_id], env=dev_cluster.slurm_env(), check=False,
                   capture_output=True, timeout=30)


def ssh_section(dev_cluster: Any, **settings: Any) -> dict[str, Any]:
    """A profile's `ssh` section that reaches the dev cluster's nodes, plus `settings`."""
    return {"user": dev_cluster.user, "identity_file": str(dev_cluster.ssh_key),
            "known_hosts": str(dev_cluster.known_hosts), **settings}


# Two Slurm nodes of each of the dev cluster's partitions, for the profiles of tests.
PARTITION_NODES = {"debug": "n[1-2]", "side": "s[1-2]"}


def cpu_profile(dev_cluster: Any, partition: str = "debug", **extra: Any) -> dict[str, Any]:
    """A profile for the dev cluster that asks for no GPUs (one task per node), so its
    jobs never queue behind the examples that hold the fake GPUs; on two nodes of
    `partition` (side: the tests marked side_partition)."""
    return {
        "name": "ck-cpu",
        "nodes": PARTITION_NODES[partition],
        "ssh": ssh_section(dev_cluster, connect_timeout=5),
        "slurm": {"partition": partition, "time": "00:03:00", "exclusive": False},
        "environment": {"python": "python3"},
        **extra,
    }
