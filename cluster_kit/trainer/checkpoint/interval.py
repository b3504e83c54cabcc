"""How often to save: Young/Daly's interval from the save cost, the restart time and the MTBF.

The time a fault costs is its detection, the restart and the work since the last
checkpoint. Saving often shortens the last part and costs a save each time; Young
(1974) and Daly (2006) put the best interval of work between two saves at

    tau = sqrt(2 * C * (MTBF + R))

with C the time a save takes from training, R the time a restart takes and MTBF the
job's mean time between failures (every node can fail, so a job of N nodes fails N
times as often as one node). Here tau never exceeds the MTBF (Daly's rule for a save
as long as half the MTBF), and it is turned into whole steps with the measured time of
a step.

Stdlib only and Python 3.8+: the supervisor imports this module too, from a zip app
on the job's Python, to say the interval and why in ``status`` and ``diagnose``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

AUTO = "auto"
FIRST_SAVE_STEPS = 10  # before anything is measured: save early, then adapt
DEFAULT_MTBF_HOURS = 5000.0  # per node: resilience.mtbf_hours's default (SPEC)
DEFAULT_RESTART_S = 300.0  # without the supervisor's figure: a hang alone is hang_timeout (300 s) to detect
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])\Z")
EVERY_FORMS = "auto, a number of steps (500) or a duration (90s, 30m, 2h)"


@dataclass(frozen=True)
class Every:
    """``resilience.checkpoint_every`` read: ``auto``, a number of steps, or seconds."""

    kind: str  # "auto" | "steps" | "seconds"
    value: float = 0.0

    def __str__(self) -> str:
        if self.kind == "steps":
            return str(int(self.value))
        if self.kind == "seconds":
            return _compact(self.value)
        return AUTO


@dataclass(frozen=True)
class Interval:
    """Save every ``steps`` steps (about ``seconds`` of training, when known), and why."""

    steps: int
    seconds: float | None
    why: str
    measured: bool = True  # False: the early first save that measures what auto needs


def parse_every(value: str | float) -> Every:
    """``auto``, ``500`` / ``"500"`` (steps) or ``"30m"`` / ``"90s"`` / ``"2h"`` / ``"1d"``.

    Raises ValueError naming the accepted forms for anything else, zero and
    negative values included.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # True is no step count
        return _steps(value, value)
    text = str(value).strip().lower()
    if text == AUTO:
        return Every(AUTO)
    if text.isdigit():
        return _steps(int(text), value)
    match = DURATION.match(text)
    if match is None:
        raise ValueError(f"checkpoint_every: {value!r} is not {EVERY_FORMS}")
    seconds = float(match.group(1)) * UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"checkpoint_every: {value!r} is no time at all; give {EVERY_FORMS}")
    return Every("seconds", seconds)


def _steps(number: float, shown: object) -> Every:
    if number != int(number) or number < 1:
        raise ValueError(f"checkpoint_every: {shown!r} is not a whole number of steps >= 1; "
                         f"give {EVERY_FORMS}")
    return Every("steps", float(int(number)))


def job_mtbf_s(nodes: int, mtbf_hours_per_node: float = DEFAULT_MTBF_HOURS) -> float:
    """The job's MTBF from one node's: N nodes fail N times as often as one."""
    return mtbf_hours_per_node * 3600.0 / max(1, nodes)


def estimate_mtbf_s(run_s: float, failures: int, nodes: int,
                    mtbf_hours_per_node: float = DEFAULT_MTBF_HOURS) -> float:
    """The job's MTBF from ``failures`` seen in ``run_s`` seconds of running at this size.

    No failure yet: the per-node figure over the nodes (SPEC: ``mtbf_hours`` counts
    "before the chain has seen failures"), or the time already run without one when
    that is longer. Then the failures seen: ``run_s / failures``. ``run_s`` and
    ``failures`` sum this chain and the user's earlier chains (their job records),
    counting the attempts that ended in a hang, a crash or a node failure.
    """
    if failures <= 0:
        return max(job_mtbf_s(nodes, mtbf_hours_per_node), run_s)
    return max(run_s, 1.0) / failures


def young_daly_s(save_s: float, mtbf_s: float, restart_s: float) -> float:
    """Seconds of training between two saves: ``sqrt(2 C (MTBF + R))``, at most the MTBF."""
    return min(math.sqrt(2.0 * max(0.0, save_s) * (mtbf_s + max(0.0, restart_s))), mtbf_s)


def choose_interval(every: Every, *, step_s: float | None, save_s: float | None,
                    mtbf_s: float, restart_s: float, nodes: int,
                    write_s: float | None = None) -> Interval:
    """The interval to save at, in steps, with the one line that says why.

    ``step_s`` is the measured time of a training step, ``save_s`` the time a save
    took from training (the whole save when it blocks, the copy to host memory when
    it is asynchronous) and ``write_s`` an asynchronous save's background write: the
    next save must not start before it ends. Before ``step_s`` (or, for ``auto``,
    ``save_s``) is known, a first save comes after FIRST_SAVE_STEPS steps to measure it.
    """
    if every.kind == "steps":
        steps = int(every.value)
        seconds = steps * step_s if step_s else None
        return Interval(steps, seconds, f"every {_steps_text(steps, seconds)}: checkpoint_every {every}")
    if not step_s or (every.kind == AUTO and save_s is None):
        wanted = "the step time" if every.kind == "seconds" else "the save cost"
        return Interval(FIRST_SAVE_STEPS, None,
                        f"a first save after {FIRST_SAVE_STEPS} steps measures {wanted}", measured=False)
    if every.kind == "seconds":
        steps = max(1, round(every.value / step_s))
        return Interval(steps, steps * step_s,
                        f"every {_steps_text(steps, steps * step_s)}: checkpoint_every {every}, "
                        f"step {duration_text(step_s)}")
    assert save_s is not None
    tau = young_daly_s(save_s, mtbf_s, restart_s)
    bound = ""
    if write_s is not None and write_s > tau:
        tau, bound = write_s, f"; no sooner than the {duration_text(write_s)} background write"
    steps = max(1, round(tau / step_s))
    return Interval(steps, steps * step_s,
                    f"every {_steps_text(steps, steps * step_s)}: save {duration_text(save_s)}, "
                    f"restart {duration_text(restart_s)}, MTBF {mtbf_s / 3600.0:.1f} h at "
                    f"{nodes} node{'s' if nodes != 1 else ''}{bound}")


def _compact(seconds: float) -> str:
    """``2h``, ``30m``, ``90s``: a duration as checkpoint_every spells it."""
    for unit in ("d", "h", "m"):
        if seconds >= UNITS[unit] and seconds % UNITS[unit] == 0:
            return f"{int(seconds // UNITS[unit])}{unit}"
    return f"{seconds:g}s"


def _steps_text(steps: int, seconds: float | None) -> str:
    text = f"{steps} step{'s' if steps != 1 else ''}"
    return text if seconds is None else f"{text} ({duration_text(seconds)})"


def duration_text(seconds: float) -> str:
    """``0.25 s``, ``3.1 s``, ``8 s``, ``45 s``, ``9.6 min``, ``7.9 h``: as people read them."""
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 10 and round(seconds, 1) != round(seconds):
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
