"""Per-connection timelines (benchmarks/fanout.py): off unless a recorder is set."""
from __future__ import annotations

from collections.abc import Callable

# Called once per host as it finishes, from its worker thread, with the host, the
# monotonic time its attempt started and the (step, monotonic time) marks of
# TIMELINE_STEPS it reached, in order.
TimelineRecorder = Callable[[str, float, list[tuple[str, float]]], None]


TIMELINE_STEPS = ("tcp", "kex", "auth", "channel", "sent", "first_byte", "done", "closed")


_recorder: TimelineRecorder | None = None  # None, the default, records nothing


def set_timeline_recorder(recorder: TimelineRecorder | None) -> None:
    """Record every later host's timeline with `recorder` (None: stop recording)."""
    global _recorder
    _recorder = recorder


def timeline_recorder() -> TimelineRecorder | None:
    """The recorder set now, or None when timelines are not recorded."""
    return _recorder
