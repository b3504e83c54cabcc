"""The hang clock stops while a rank is inside ddp.paused() and gives startup its own timeout."""
from __future__ import annotations

import pytest
from supervised import observe

from cluster_kit.supervisor import decide
from cluster_kit.trainer.contract import parse_heartbeat


def test_no_rank_stalls_while_one_is_paused_and_every_clock_restarts_when_it_ends() -> None:
    clock = decide.HangClock(world_size=4, hang_timeout=20, started=1000.0)
    for rank in range(4):
        observe(clock, rank, 5, 1010.0)
    observe(clock, 0, 5, 1010.0, paused_since=1011.0)  # rank 0 saves; ranks 1-3 wait in its barrier
    assert clock.stalled(1100.0) == []
    observe(clock, 0, 5, 1010.0, resumed_at=1120.0)
    assert clock.stalled(1139.0) == []  # 19 s after the pause ended
    assert clock.stalled(1141.0) == [0, 1, 2, 3]
    assert clock.stalled_since([2]) == 1120.0


def test_a_pause_that_ended_long_ago_does_not_hide_a_later_hang() -> None:
    clock = decide.HangClock(world_size=2, hang_timeout=20, started=0.0)
    observe(clock, 0, 3, 10.0, resumed_at=5.0)
    observe(clock, 1, 3, 10.0)
    observe(clock, 0, 4, 12.0, resumed_at=5.0)
    assert clock.stalled(31.0) == [1] and clock.stalled_since([1]) == 10.0


def test_a_pause_before_the_first_step_is_not_a_first_step() -> None:
    clock = decide.HangClock(world_size=1, hang_timeout=20, started=0.0, startup_timeout=50)
    observe(clock, 0, 0, 1.0, paused_since=1.0)  # loading a checkpoint
    assert clock.first_beat is None and clock.stalled(500.0) == []
    observe(clock, 0, 0, 1.0, resumed_at=400.0)
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


def scontrol_fields(case: str) -> dict[str, str]:
    """`scontrol show job -o` as the supervisor reads it, recorded at a batch script's SIGTERM."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "data" / "slurm"
            / f"scontrol_show_job_at_sigterm_{case}.stdout").read_text()
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            fields.setdefault(key, value)
    return fields


@pytest.mark.parametrize(("case", "cause"), [("time_limit", "time_limit"), ("requeue", "requeued"),
                                             ("scancel", "cancelled")])
def test_why_sigterm_came_is_read_from_slurm_at_the_signal(case: str, cause: str) -> None:
    now = scontrol_fields(case)
    assert now["JobState"] == "COMPLETING"  # the same for all three: the cause is elsewhere
    assert decide.term_cause({"Restarts": "0"}, now) == cause


def test_preemption_that_does_not_requeue() -> None:
    assert decide.term_cause({"Restarts": "0"}, {"JobState": "PREEMPTED", "Restarts": "0"}) == "preempted"
    assert decide.term_cause({"Restarts": "0"}, {"JobState": "COMPLETING", "Reason": "Preemption"}) == "preempted"


def test_a_pause_past_its_max_s_stops_the_clock_no_longer_and_says_why() -> None:
    clock = decide.HangClock(world_size=2, hang_timeout=20, started=1000.0)
    observe(clock, 1, 5, 1010.0)
    observe(clock, 0, 5, 1010.0, paused_since=1011.0, pause_max_s=60.0, pause_reason="checkpoint save")
    assert clock.stalled(1070.0) == [] and clock.overdue(1070.0) == {}
    assert clock.stalled(1072.0) == [0, 1]  # a save stuck on a hung file system: a hang after all
    assert clock.overdue(1072.0) == {0: ("checkpoint save", 61.0, 60.0)}


def test_a_pause_line_of_an_older_trainer_has_no_ceiling() -> None:
    beat = parse_heartbeat("7 100.500 n1 42 paused:101.250\n")
    assert (beat.paused_since, beat.pause_max_s, beat.pause_reason) == (101.25, None, "")
    clock = decide.HangClock(world_size=1, hang_timeout=20, started=0.0)
    observe(clock, 0, 7, 100.5, paused_since=beat.paused_since, pause_max_s=beat.pause_max_s)
    assert clock.stalled(1e9) == []
