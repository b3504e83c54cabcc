"""When a rank is told to stop, and when it says training is done.

SIGUSR1, SIGTERM (the time limit, preemption, scancel: Slurm's SIGKILL follows after
KillWait or GraceTime) and the supervisor's ``stop`` file turn :attr:`StopSignal.stop`
on, so that the rank can still checkpoint and return; the first of them is noted once
in ``stopped/rank-<R>``. ``finished/rank-<R>`` says training is done: an attempt whose
ranks stopped without it is requeued, never counted as completed.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from cluster_kit.trainer import contract

from .dumps import Rank
from .files import write_note


class StopSignal:
    """A rank's stop flag and its notes to the supervisor."""

    def __init__(self, who: Rank) -> None:
        self.who = who
        self.stop = False
        self._noted = False
        self._finished = False

    def note_stop(self, cause: str) -> None:
        """Turn the stop flag on, and tell the supervisor once why (``stopped/rank-R``)."""
        self.stop = True
        if self._noted or os.getpid() != self.who.pid:
            return
        self._noted = True
        write_note(self.who.path(contract.STOPPED), contract.note_line(cause, time.time()))

    def finish(self) -> None:
        """Tell the supervisor that training is done (``finished/rank-R``), once."""
        if self._finished or os.getpid() != self.who.pid:
            return
        self._finished = True
        write_note(self.who.path(contract.FINISHED), contract.note_line(str(self.who.steps()), time.time()))

    def install(self) -> None:
        """SIGUSR1 and SIGTERM stop the rank; a handler the script set before keeps
        running, and a second SIGTERM ends the rank as the default would."""
        self._on_signal(signal.SIGUSR1)
        self._on_signal(signal.SIGTERM, second_ends=True)

    def _on_signal(self, signum: int, second_ends: bool = False) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        previous = signal.getsignal(signum)
        seen: list[int] = []

        def handler(number: int, frame: Any) -> None:
            self.note_stop(signal.Signals(number).name)
            seen.append(number)
            if callable(previous):
                previous(number, frame)
            elif second_ends and len(seen) > 1 and previous == signal.SIG_DFL:
                signal.signal(number, signal.SIG_DFL)
                os.kill(os.getpid(), number)

        signal.signal(signum, handler)
