"""The fan-out timeline summary (benchmarks/timeline.py): exact figures on small
hand-checked timelines, and a real one recorded by benchmarks/fanout.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from timeline import Timeline, percentile, refill_gaps, summarise

STEPS = ("tcp", "kex", "auth", "channel", "sent", "first_byte", "done", "closed")


def host(name: str, start: float, *deltas: float) -> Timeline:
    marks, at = [], start
    for step, delta in zip(STEPS, deltas):
        at += delta
        marks.append((step, at))
    return Timeline(name, start, tuple(marks))


def test_durations_are_from_the_previous_mark() -> None:
    t = host("a", 10.0, 0.001, 0.2, 0.05, 0.01, 0.002, 1.5, 0.003, 0.004)
    d = t.durations()
    assert list(d) == list(STEPS)
    assert d["kex"] == pytest.approx(0.2)
    assert d["first_byte"] == pytest.approx(1.5)
    assert t.end == pytest.approx(10.0 + sum((0.001, 0.2, 0.05, 0.01, 0.002, 1.5, 0.003, 0.004)))


def test_a_repeated_step_counts_from_its_last_occurrence() -> None:
    # the attempt that connects the jump host first records tcp/kex/auth twice
    t = Timeline("n", 0.0, (("tcp", 1.0), ("kex", 2.0), ("auth", 3.0), ("tcp", 3.5), ("kex", 4.5),
                            ("auth", 5.0), ("closed", 6.0)))
    assert t.durations() == {"tcp": 0.5, "kex": 1.0, "auth": 0.5, "closed": 1.0}


def test_a_failed_host_has_only_the_steps_it_reached() -> None:
    t = Timeline("n", 0.0, (("tcp", 0.25), ("closed", 0.5)))
    assert t.durations() == {"tcp": 0.25, "closed": 0.25}


def test_window_idle_and_tail_on_two_slots() -> None:
    # fan-out 2, three hosts: a 0-1, b 0-2, c starts at 1.5 (a slot idle 1.0-1.5), ends 3
    timelines = [Timeline("a", 0.0, (("closed", 1.0),)), Timeline("b", 0.0, (("closed", 2.0),)),
                 Timeline("c", 1.5, (("closed", 3.0),))]
    s = summarise(timelines, fanout=2, process_start=-0.5, process_end=3.25)
    assert s.startup_s == pytest.approx(0.5)
    assert s.window_s == pytest.approx(1.5)
    assert s.window_idle_slot_s == pytest.approx(0.5)  # slot of a, 1.0 to 1.5
    assert s.tail_s == pytest.approx(1.5)
    assert s.tail_idle_slot_s == pytest.approx(1.0)  # b's slot 2.0-3.0
    assert s.exit_s == pytest.approx(0.25)
    assert s.busy_slot_s == pytest.approx(1.0 + 2.0 + 1.5)
    assert s.refill_gap_ms == pytest.approx(500.0)
    assert s.wall_s == pytest.approx(3.75)


def test_refill_gap_is_since_the_latest_earlier_end() -> None:
    timelines = [Timeline("a", 0.0, (("closed", 1.0),)), Timeline("b", 0.0, (("closed", 1.2),)),
                 Timeline("c", 1.25, (("closed", 2.0),))]
    assert refill_gaps(timelines) == [pytest.approx(0.05)]


def test_percentile_nearest_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert percentile(values, 0.9) == 9.0
    assert percentile(values, 0.5) == 5.0
    assert percentile([3.0], 0.9) == 3.0
    assert percentile([], 0.9) == 0.0


def test_no_hosts_means_all_start_up() -> None:
    s = summarise([], fanout=4, process_start=1.0, process_end=2.0)
    assert (s.hosts, s.startup_s, s.busy_slot_s) == (0, 1.0, 0.0)


def test_a_recorded_run_adds_up() -> None:
    """200 hosts recorded by benchmarks/fanout.py (the probe, fan-out 32): the parts
    of the wall add up to it, the slots to fan-out x wall, and no step is negative."""
    raw = json.loads((ROOT / "tests" / "data" / "fanout" / "timeline-200-f32.json").read_text())
    timelines = [Timeline(h, s, tuple((a, b) for a, b in marks)) for h, s, marks in raw["timelines"]]
    s = summarise(timelines, 32, raw["process_start"], raw["process_end"])
    assert s.hosts == 200
    assert s.startup_s + s.window_s + s.tail_s + s.exit_s == pytest.approx(s.wall_s)
    assert s.busy_slot_s + s.window_idle_slot_s + s.tail_idle_slot_s == pytest.approx(
        32 * (s.window_s + s.tail_s), rel=1e-6)
    assert all(v >= 0 for t in timelines for v in t.durations().values())
    assert set(s.step_slot_s) == set(STEPS)
    assert sum(s.step_slot_s.values()) == pytest.approx(s.busy_slot_s, rel=1e-6)
    lines = s.lines()
    assert lines[0].startswith("timeline, 200 hosts, fan-out 32")
    assert any("command running, to first byte" in line for line in lines)
