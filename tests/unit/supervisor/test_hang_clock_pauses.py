"""The hang clock stops while a rank is inside ddp.paused() and gives startup its own timeout."""
from __future__ import annotations

import pytest

from cluster_kit.analysis.rank_files import parse_heartbeat
from cluster_kit.supervisor import decide


def test_no_rank_stalls_while_one_is_paused_and_every_clock_restarts_when_it_ends() -> None:
    clock = decide.HangClock(world_size=4, hang_timeout=20, started=1000.0)
    for rank in range(4):
        clock.observe(rank, 5, 1010.0)
    clock.observe(0, 5, 1010.0, paused_since=1011.0)  # rank 0 saves; ranks 1-3 wait in its barrier
    assert clock.stalled(1100.0) == []
    clock.observe(0, 5, 1010.0, resumed_at=1120.0)
    assert clock.stalled(1139.0) == []  # 19 s after the pause ended
    assert clock.stalled(1141.0) == [0, 1, 2, 3]
    assert clock.stalled_since([2]) == 1120.0


def test_a_pause_that_ended_long_ago_does_not_hide_a_later_hang() -> None:
    clock = decide.HangClock(world_size=2, hang_timeout=20, started=0.0)
    clock.observe(0, 3, 10.0, resumed_at=5.0)
    clock.observe(1, 3, 10.0)
    clock.observe(0, 4, 12.0, resumed_at=5.0)
    assert clock.stalled(31.0) == [1] and clock.stalled_since([1]) == 10.0


def test_a_pause_before_the_first_step_is_not_a_first_step() -> None:
    clock = decide.HangClock(world_size=1, hang_timeout=20, started=0.0, startup_timeout=50)
    clock.observe(0, 0, 1.0, paused_since=1.0)  # loading a checkpoint
    assert clock.first_beat is None and clock.stalled(500.0) == []
    clock.observe(0, 0, 1.0, resumed_at=400.0)
    assert clock.stalled(449.0) == [] and clock.stalled(451.0) == [0]  # startup_timeout, from the pause's end


@pytest.mark.parametrize(("startup", "hang", "limit"), [(None, 20, decide.STARTUP_S), (None, 900, 900.0),
                                                        (45, 20, 45.0), (45, 900, 45.0)])
def test_startup_timeout_is_the_limit_before_the_first_step(startup: float | None, hang: float,
                                                           limit: float) -> None:
    clock = decide.HangClock(world_size=1, hang_timeout=hang, started=0.0, startup_timeout=startup)
    assert clock.stalled(limit - 0.5) == [] and clock.stalled(limit + 0.5) == [0]


@pytest.mark.parametrize(("line", "paused", "resumed"), [
    ("7 100.500 n1 42\n", None, None),
    ("7 100.500 n1 42 paused:101.250\n", 101.25, None),
    ("7 100.500 n1 42 resumed:130.000\n", None, 130.0),
])
def test_heartbeat_lines_say_whether_the_rank_is_paused(line: str, paused: float | None,
                                                        resumed: float | None) -> None:
    beat = parse_heartbeat(line)
    assert (beat.steps, beat.time, beat.host, beat.pid) == (7, 100.5, "n1", 42)
    assert (beat.paused_since, beat.resumed_at) == (paused, resumed)


@pytest.mark.parametrize("line", ["7 100.5 n1 42 stopped:3\n", "7 100.5 n1 42 paused\n",
                                  "7 100.5 n1 42 paused:x\n", "7 100.5 n1 42 a b\n"])
def test_a_fifth_field_other_than_a_pause_is_refused(line: str) -> None:
    with pytest.raises(ValueError):
        parse_heartbeat(line)
