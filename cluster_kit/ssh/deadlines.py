"""Deadlines: one budget per host attempt, spent by every SSH step."""
from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from contextlib import suppress

import paramiko  # after ssh/deferred.py (ssh/__init__.py)

from cluster_kit.ssh.settings import (
    Endpoint,
    SshSettings,
)
from cluster_kit.ssh.timeline import timeline_recorder

GRACE_S = 2.0


# ----------------------------------------------------------------------------
# Deadlines


def _close_quietly(resource: object) -> None:
    # closing on the way out must not mask the real error
    with suppress(OSError, EOFError, paramiko.SSHException):
        resource.close()  # type: ignore[attr-defined]


def host_budget(endpoint: Endpoint, settings: SshSettings) -> float:
    """Overall per-host deadline: connect + auth per hop, then the command."""
    hops = 1 + len(endpoint.proxy_jump)
    return 2 * endpoint.connect_timeout * hops + settings.command_timeout + GRACE_S


class Attempt:
    """One host's try: the phase it is in, its overall deadline, and what to
    close when that deadline passes (closing unblocks any paramiko wait)."""

    def __init__(self, budget: float) -> None:
        self.started = time.monotonic()
        self.budget = budget
        self.phase = "resolving the host"
        self.aborted = False
        self._held: list[object] = []
        self._lock = threading.Lock()
        self._alarm: Alarm | None = None
        self.marks: list[tuple[str, float]] | None = [] if timeline_recorder() is not None else None

    def mark(self, step: str) -> None:
        """Note that this attempt reached `step` (a TIMELINE_STEPS name), if recording."""
        if self.marks is not None:
            self.marks.append((step, time.monotonic()))

    @property
    def deadline(self) -> float:
        return self.started + self.budget

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def arm(self, budget: float) -> None:
        """Start the watchdog that aborts this attempt after `budget` seconds."""
        self.budget = budget
        self.disarm()
        self._alarm = WATCHDOG.call_at(self.deadline, self.abort)

    def disarm(self) -> None:
        if self._alarm is not None:
            self._alarm.cancel()

    def hold(self, resource: object) -> None:
        with self._lock:
            self._held.append(resource)
        if self.aborted:
            _close_quietly(resource)

    def release(self, resource: object) -> None:
        with self._lock:
            if resource in self._held:
                self._held.remove(resource)

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            held = list(self._held)
        for resource in held:
            _close_quietly(resource)

    def overrun_message(self) -> str:
        return f"no answer within {self.budget:g}s (overall deadline, while {self.phase})"


class Alarm:
    """One armed deadline of the `Watchdog`; `cancel` before it fires and it never does."""

    __slots__ = ("callback", "deadline")

    def __init__(self, deadline: float, callback: Callable[[], object]) -> None:
        self.deadline = deadline
        self.callback: Callable[[], object] | None = callback

    def cancel(self) -> None:
        """Never fire; let go of the callback now (it holds a host's whole attempt,
        and a cancelled alarm stays in the heap until its deadline or a compaction)."""
        self.callback = None

    @property
    def cancelled(self) -> bool:
        return self.callback is None


class Watchdog:
    """One thread that calls each alarm's callback once its deadline (monotonic) passes.

    In place of a timer thread per host attempt, started and cancelled for every
    host: a fan-out over 2,000 hosts started 2,000 of them. A callback runs in a
    thread of its own, so one that blocks (closing a stuck connection) delays no
    other host's deadline.
    """

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):  # a forked worker has the heap but not the thread
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._wakeup = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._compact_at = 1024
        self._thread: threading.Thread | None = None

    def call_at(self, deadline: float, callback: Callable[[], object]) -> Alarm:
        alarm = Alarm(deadline, callback)
        with self._wakeup:
            if len(self._heap) >= self._compact_at:  # cancelled alarms wait for their deadline
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._compact_at = max(1024, 2 * len(self._heap))
            heapq.heappush(self._heap, (deadline, next(self._order), alarm))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="clusterkit-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is alarm:
                self._wakeup.notify()
        return alarm

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                wait = self._heap[0][0] - time.monotonic() if self._heap else None
                if wait is None or wait > 0:
                    self._wakeup.wait(wait)
                    continue
                callback = heapq.heappop(self._heap)[2].callback
            if callback is not None:  # cancelled since the check above
                threading.Thread(target=callback, name="clusterkit-deadline", daemon=True).start()


WATCHDOG = Watchdog()
