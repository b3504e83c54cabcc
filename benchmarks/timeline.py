"""Where a fan-out's wall time goes: per-connection timelines, summarised.

Pure logic, no SSH: `benchmarks/fanout.py` records each host's marks through
`cluster_kit.ssh.fanout.set_timeline_recorder` (monotonic clock, shared by every
process on the machine) and hands them here with the times the client process
was started and ended.

A host's timeline is its attempt's start and the marks it reached, in order:
tcp (socket connected, or channel opened through the jump host), kex (banner,
key exchange and host key check done), auth, channel (session open), sent
(command and stdin sent, EOF given), first_byte, done (exit status in),
closed (transport closed). A step's duration is from the previous mark reached
to its own; a step that repeats (a jump host connected by the same attempt)
counts from its last occurrence.
"""
from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

STEPS = ("tcp", "kex", "auth", "channel", "sent", "first_byte", "done", "closed")
# what each step's duration is spent on, for the report
STEP_LABELS = {
    "tcp": "TCP connect", "kex": "banner + key exchange", "auth": "public-key auth",
    "channel": "session channel open", "sent": "exec + stdin sent",
    "first_byte": "command running, to first byte", "done": "rest of output, exit status",
    "closed": "transport close",
}


@dataclass(frozen=True)
class Timeline:
    host: str
    started: float
    marks: tuple[tuple[str, float], ...]

    @property
    def end(self) -> float:
        return self.marks[-1][1] if self.marks else self.started

    def durations(self) -> dict[str, float]:
        """Seconds spent reaching each step, keyed by step name."""
        last: dict[str, int] = {}
        for index, (step, _) in enumerate(self.marks):
            last[step] = index
        out: dict[str, float] = {}
        previous = self.started
        for index, (step, at) in enumerate(self.marks):
            if last[step] == index:
                out[step] = at - previous
            previous = at
        return out


@dataclass
class Summary:
    """The window's story: set-up, the full window, the tail, and the steps."""

    fanout: int
    hosts: int
    wall_s: float
    startup_s: float  # client process start to the first attempt
    exit_s: float  # last transport closed to the client's exit
    window_s: float  # first attempt to the last attempt's start (hosts still queued)
    tail_s: float  # last attempt's start to the last transport closed
    window_idle_slot_s: float  # free slots while hosts were still queued
    tail_idle_slot_s: float
    busy_slot_s: float
    refill_gap_ms: float  # median gap between one host closing and the next starting
    step_slot_s: dict[str, float] = field(default_factory=dict)
    step_median_ms: dict[str, float] = field(default_factory=dict)
    step_p90_ms: dict[str, float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        cap = self.fanout * self.wall_s
        out = [
            (f"timeline, {self.hosts} hosts, fan-out {self.fanout}, wall {self.wall_s:.2f} s "
            f"= start-up {self.startup_s:.2f} + window full {self.window_s:.2f} + tail "
            f"{self.tail_s:.2f} + exit {self.exit_s:.2f}"),
            (f"  slots: {cap:.1f} slot-s in all; busy {self.busy_slot_s:.1f} "
            f"({_pct(self.busy_slot_s, cap)}), idle while hosts queued "
            f"{self.window_idle_slot_s:.1f} ({_pct(self.window_idle_slot_s, cap)}), idle in "
            f"the tail {self.tail_idle_slot_s:.1f} ({_pct(self.tail_idle_slot_s, cap)}); "
            f"refill gap median {self.refill_gap_ms:.2f} ms"),
            f"  {'step':<32} {'median ms':>9} {'p90 ms':>8} {'slot-s':>7} {'of busy':>7}",
        ]
        for step in STEPS:
            if step in self.step_slot_s:
                out.append(f"  {STEP_LABELS[step]:<32} {self.step_median_ms[step]:>9.1f} "
                           f"{self.step_p90_ms[step]:>8.1f} {self.step_slot_s[step]:>7.1f} "
                           f"{_pct(self.step_slot_s[step], self.busy_slot_s):>7}")
        return out


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def percentile(values: Sequence[float], fraction: float) -> float:
    """The value at `fraction` (0..1) of the sorted values, nearest rank."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * fraction // 1))  # ceil, at least the first
    return ordered[int(min(rank, len(ordered))) - 1]


def occupancy(timelines: Iterable[Timeline], start: float, end: float) -> float:
    """Slot-seconds in [start, end] during which an attempt was in progress."""
    return sum(max(0.0, min(t.end, end) - max(t.started, start)) for t in timelines)


def summarise(timelines: Sequence[Timeline], fanout: int, process_start: float,
              process_end: float) -> Summary:
    """Summary of one fan-out run's timelines (all times on one monotonic clock)."""
    if not timelines:
        wall = process_end - process_start
        return Summary(fanout, 0, wall, wall, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    first = min(t.started for t in timelines)
    last_start = max(t.started for t in timelines)
    last_end = max(t.end for t in timelines)
    busy_window = occupancy(timelines, first, last_start)
    busy_tail = occupancy(timelines, last_start, last_end)
    window_s, tail_s = last_start - first, last_end - last_start
    width = min(fanout, len(timelines))
    per_step: dict[str, list[float]] = {}
    for timeline in timelines:
        for step, seconds in timeline.durations().items():
            per_step.setdefault(step, []).append(seconds)
    return Summary(
        fanout=fanout, hosts=len(timelines), wall_s=process_end - process_start,
        startup_s=first - process_start, exit_s=max(0.0, process_end - last_end),
        window_s=window_s, tail_s=tail_s,
        window_idle_slot_s=max(0.0, width * window_s - busy_window),
        tail_idle_slot_s=max(0.0, width * tail_s - busy_tail),
        busy_slot_s=busy_window + busy_tail,
        refill_gap_ms=1000 * statistics.median(refill_gaps(timelines)) if len(timelines) > width else 0.0,
        step_slot_s={s: sum(v) for s, v in per_step.items()},
        step_median_ms={s: 1000 * statistics.median(v) for s, v in per_step.items()},
        step_p90_ms={s: 1000 * percentile(v, 0.9) for s, v in per_step.items()},
    )


def refill_gaps(timelines: Sequence[Timeline]) -> list[float]:
    """For each attempt after the first `fanout`: the time since the latest
    earlier end, i.e. how long a freed slot waited for its next host."""
    ends = sorted(t.end for t in timelines)
    gaps = []
    for timeline in sorted(timelines, key=lambda t: t.started):
        index = bisect.bisect_right(ends, timeline.started)
        if index:
            gaps.append(timeline.started - ends[index - 1])
    return gaps or [0.0]
