"""One rank's link to its supervisor: the heartbeat, the stop signal, the answers to dump
requests and the crash files, and the watcher thread that polls the control folder."""
from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from cluster_kit.trainer import contract

from .dumps import FR_TIMEOUT_S, CrashFiles, DumpResponder, Rank, flight_recorder
from .environment import node_from_env
from .files import log_once, make_dir
from .heartbeat import DEFAULT_INTERVAL_S, DEFAULT_PAUSE_MAX_S, HeartbeatWriter
from .stop import StopSignal

POLL_S = 0.5  # the watcher's stat of `stop` and `dump-request`


class Supervision:
    """One rank's link to the supervisor through the control folder.

    Build it with :func:`cluster_kit.trainer.supervision.enable_supervision` (which reads
    the environment); :meth:`beat` is the hot path. :meth:`start` installs the hooks
    (exception file, faulthandler, SIGUSR1, SIGTERM) and the watcher thread.
    """

    def __init__(self, control_dir: str, rank: int, interval_s: float = DEFAULT_INTERVAL_S,
                 host: str | None = None, poll_s: float = POLL_S) -> None:
        self.control_dir = control_dir
        self.rank = rank
        self.poll_s = poll_s
        self.heartbeat = HeartbeatWriter(control_dir, rank, host or node_from_env(), interval_s)
        self.who = Rank(control_dir, rank, self.heartbeat.host, os.getpid(), lambda: self.heartbeat.steps)
        self.signal = StopSignal(self.who)
        self.dumps = DumpResponder(self.who)
        self.crash = CrashFiles(self.who)
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._exit_hooked = False

    # --- what the calls of the package reach -----------------------------------------
    @property
    def steps(self) -> int:
        return self.heartbeat.steps

    @property
    def stop(self) -> bool:
        return self.signal.stop

    def beat(self) -> None:
        self.heartbeat.beat()

    def pause(self, reason: str, max_s: float = DEFAULT_PAUSE_MAX_S) -> None:
        self.heartbeat.pause(reason, max_s)

    def resume(self) -> None:
        self.heartbeat.resume()

    def finish(self) -> None:
        self.signal.finish()

    def finish_at_exit(self) -> None:
        """At the process's normal exit, report finished unless a stop was asked (once)."""
        if not self._exit_hooked:
            self._exit_hooked = True
            atexit.register(lambda: None if self.stop else self.finish())

    def flight_recorder(self, timeout_s: float = FR_TIMEOUT_S) -> dict[str, Any]:
        return flight_recorder(self.who, timeout_s)

    def new_request(self) -> str | None:
        return self.dumps.new_request()

    def flush_heartbeat(self) -> None:
        self.heartbeat.flush()

    # --- the watcher ---------------------------------------------------------------------
    def start(self) -> None:
        """Install the exception, fault and signal hooks and start the watcher thread."""
        if self._thread is not None:
            return
        make_dir(self.control_dir)
        self.crash.install()
        self.signal.install()
        self._thread = threading.Thread(target=self._watch, name="clusterkit-watcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the watcher (tests; a training process just exits)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._closed.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any surprise
                log_once(f"supervision watcher of rank {self.rank}: {exc!r}")
            self._closed.wait(self.poll_s)

    def poll_once(self) -> None:
        """One look at the folder: the stop file, a new dump request, a stale heartbeat."""
        if not self.stop and os.path.exists(os.path.join(self.control_dir, contract.STOP)):
            self.signal.note_stop("stop-file")
        request = self.dumps.new_request()
        if request is not None:
            self.dumps.dump(request)
        self.heartbeat.flush()
