"""When the next save is due: the interval, and the step and save times it is chosen from.

Rank 0 measures (the mean step time since the last save, the save's stall and its
background write) and decides when the next save is due; every rank gets that step
from it, so that :meth:`Pace.due` answers alike everywhere. Stdlib only.
"""
from __future__ import annotations

import time
from typing import Any

from .interval import Every, Interval, choose_interval
from .settings import Settings


class Pace:
    """The checkpoint interval of one process and what it is measured from."""

    def __init__(self, every: Every, settings: Settings) -> None:
        self.every = every
        self.settings = settings
        self.step_s: float | None = None
        self.save_s: float | None = None
        self.write_s: float | None = None
        self.last_step: int | None = None  # the step of the last save of this process
        self.next_due: int | None = None
        self.start_step: int | None = None
        self._tick: tuple[float, int] | None = None
        self._ticked = [0.0, 0]  # seconds and steps seen by due() since the last save
        self._last_end: tuple[float, int] | None = None  # when and at which step the last save returned

    @property
    def interval(self) -> Interval:
        """The interval this process would choose now, with its why."""
        return choose_interval(self.every, step_s=self.step_s, save_s=self.save_s, write_s=self.write_s,
                               mtbf_s=self.settings.mtbf_s, restart_s=self.settings.restart_s,
                               nodes=self.settings.nodes)

    def doc(self) -> dict[str, Any]:
        """The interval as the status file keeps it."""
        interval = self.interval
        return {"steps": interval.steps, "seconds": interval.seconds, "why": interval.why}

    def due(self, step: int) -> bool:
        """Whether to save after ``step`` finished steps; the same answer on every rank.

        Call it once a step: it also measures the step time that ``auto`` and a
        duration need.
        """
        now = time.monotonic()
        if self._tick is not None and step > self._tick[1]:
            self._ticked[0] += now - self._tick[0]
            self._ticked[1] += step - self._tick[1]
        self._tick = (now, step)
        if step == self.last_step:
            return False
        if self.every.kind == "steps":
            return step > 0 and step % int(self.every.value) == 0
        if self.next_due is None:
            base = self.start_step if self.start_step is not None else step
            self.next_due = base + self.interval.steps
        return step >= self.next_due

    def measure_step(self, step: int, began: float) -> None:
        """The mean step time since the last save: from due()'s calls, else from the saves' times."""
        seconds, steps = self._ticked
        if steps == 0 and self._last_end is not None and step > self._last_end[1]:
            seconds, steps = began - self._last_end[0], step - self._last_end[1]
        if steps > 0:
            self.step_s = seconds / steps

    def saved(self, step: int, agreed_next: int) -> None:
        """A save of ``step`` returned on every rank; rank 0 said when the next is due."""
        self.next_due = agreed_next if self.every.kind != "steps" else None
        self.last_step = step
        self._tick, self._ticked = None, [0.0, 0]
        self._last_end = (time.monotonic(), step)

    def resumed(self, step: int, manifest: dict[str, Any]) -> None:
        """Resumed from the checkpoint of ``step``: the save cost and step time the
        writing attempt measured, so that auto needs no early save."""
        self.start_step = self.last_step = step
        measured = manifest.get("measured") or {}
        for key in ("step_s", "save_s", "write_s"):
            if isinstance(measured.get(key), (int, float)):
                setattr(self, key, float(measured[key]))
