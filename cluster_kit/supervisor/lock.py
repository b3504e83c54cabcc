"""One supervisor per chain: a lock in the record folder, refreshed while its supervisor lives
(stdlib only, Python 3.8+).

Whichever job of a chain starts a supervisor (a requeue, the standby job, a restart),
it takes `supervisor.lock` (`<job id>`) first. A lock of another job refreshed within
LOCK_STALE_S belongs to a supervisor still alive (a batch script on a node cut off,
say): it is waited for, and this one does not run beside it.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from . import private

LOCK_NAME = "supervisor.lock"
LOCK_REFRESH_S = 10.0
LOCK_STALE_S = 60.0  # a lock not refreshed for this long belongs to a supervisor that is gone


class Held(RuntimeError):
    """Another job's supervisor of the same chain is alive: this one must not run."""


def take_lock(folder: str, job_id: str, wait_s: float = LOCK_STALE_S,
              now: Callable[[], float] = time.time) -> threading.Thread:
    """Hold the chain's lock as `job_id`, and refresh it from a daemon thread while this
    process lives. A lock of another job refreshed within LOCK_STALE_S is waited for, at
    most `wait_s`; Held when it stays fresh."""
    path = os.path.join(folder, LOCK_NAME)
    deadline = now() + wait_s
    while True:
        holder, age = _lock_state(path, now())
        if holder in (None, job_id) or age > LOCK_STALE_S:
            break
        if now() >= deadline:
            raise Held(f"the supervisor of job {holder} runs this chain ({path} was refreshed {age:.0f} s ago): "
                       f"job {job_id} does not train beside it")
        time.sleep(min(5.0, LOCK_STALE_S))
    private.write(path, f"{job_id}\n".encode())
    thread = threading.Thread(target=_refresh, args=(path, job_id), name="clusterkit-lock", daemon=True)
    thread.start()
    return thread


def release_lock(folder: str, job_id: str) -> None:
    """Give the lock up (when `job_id` holds it): the supervisor is done."""
    path = os.path.join(folder, LOCK_NAME)
    try:
        if _lock_state(path, time.time())[0] == job_id:
            os.unlink(path)
    except (OSError, private.Untrusted):
        pass


def _lock_state(path: str, now: float) -> tuple[str | None, float]:
    """(holder job id or None, seconds since it was refreshed) of the lock at `path`."""
    data = private.read(path)
    if data is None:
        return None, 0.0
    return data.decode("utf-8", "replace").strip() or None, max(0.0, now - os.stat(path).st_mtime)


def _refresh(path: str, job_id: str) -> None:
    while True:
        time.sleep(LOCK_REFRESH_S)
        try:
            if _lock_state(path, time.time())[0] != job_id:
                return  # released, or taken over by a supervisor that found it stale
            private.write(path, f"{job_id}\n".encode())
        except (OSError, private.Untrusted):
            pass
