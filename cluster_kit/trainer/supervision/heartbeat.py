"""A rank's heartbeat file: how many steps it finished, when the last one ended, and its pauses.

:meth:`HeartbeatWriter.beat` is the hot path: a clock read and a compare almost always;
the line (:func:`cluster_kit.trainer.contract.heartbeat_line`) is written at offset 0 at
most once per interval, and at once when a pause begins or ends.
"""
from __future__ import annotations

import os
import threading
import time

from cluster_kit.trainer import contract

from .files import log_once, make_dir, open_private

DEFAULT_INTERVAL_S = 1.0
DEFAULT_PAUSE_MAX_S = 1800.0  # paused() longer than this is a hang after all (a save stuck on a hung file system)


class HeartbeatWriter:
    """One rank's ``heartbeat/rank-<R>``; the main thread beats, the watcher flushes."""

    def __init__(self, control_dir: str, rank: int, host: str, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.path = contract.rank_path(control_dir, contract.HEARTBEAT, rank)
        self.rank = rank
        self.host = host
        self.interval_s = interval_s
        self.pid = os.getpid()
        self.steps = 0
        self.pause_reason = ""
        self._next_write = 0.0  # monotonic time of the next write; 0 = at the next beat
        self._last_beat = 0.0
        self._written_steps = -1
        self._pauses = 0  # nesting depth of paused()
        self._mark = ""  # the pause mark of the line (contract.pause_mark / resume_mark)
        self._fd: int | None = None
        self._length = 0
        self._lock = threading.Lock()  # the main thread and the watcher both write

    def beat(self) -> None:
        """Count one step; write the heartbeat when the interval has passed."""
        self.steps += 1
        now = time.monotonic()
        self._last_beat = now
        if now >= self._next_write:
            self.write()

    def write(self) -> None:
        """Write the line at offset 0 of the rank's file. The time is when the counted
        step ended, so a line the watcher writes after the loop stopped still says when
        progress stopped. Never raises: a missing folder must not stop the training."""
        with self._lock:
            now = time.monotonic()
            self._next_write = now + self.interval_s
            if os.getpid() != self.pid:  # a forked child (a data loader worker) is no rank
                self._next_write = float("inf")
                return
            steps, when = self.steps, time.time() - (now - self._last_beat)
            line = contract.heartbeat_line(steps, when, self.host, self.pid, self._mark).encode()
            try:
                self._pwrite(line)
            except OSError as exc:
                log_once(f"cannot write the heartbeat of rank {self.rank}: {exc}")
                return
            self._written_steps = steps

    def _pwrite(self, line: bytes) -> None:
        if self._fd is None:
            make_dir(os.path.dirname(self.path))
            self._fd = open_private(self.path)
        os.pwrite(self._fd, line, 0)
        if len(line) < self._length:
            os.ftruncate(self._fd, len(line))
        self._length = len(line)

    def pause(self, reason: str, max_s: float = DEFAULT_PAUSE_MAX_S) -> None:
        """The hang clock stops from now until :meth:`resume` (pauses nest), for at most
        `max_s` seconds: a pause that lasts longer is a hang, named with its reason."""
        with self._lock:
            self._pauses += 1
            if self._pauses == 1:
                self._mark = contract.pause_mark(time.time(), max_s, reason)
                self.pause_reason = reason
        self._write_now()

    def resume(self) -> None:
        """The pause begun last ends; the clock starts again when the outermost one does."""
        with self._lock:
            self._pauses = max(0, self._pauses - 1)
            if self._pauses == 0:
                self._mark = contract.resume_mark(time.time())
        self._write_now()

    def _write_now(self) -> None:
        self._next_write = 0.0
        self.write()

    def flush(self) -> None:
        """Write the last counted steps once the loop has stopped beating (watcher side)."""
        if 0 < self.steps != self._written_steps and time.monotonic() >= self._next_write:
            self.write()
