"""How often to save (cluster_kit/checkpoint/interval.py), with figures worked out by hand."""
from __future__ import annotations

import math

import pytest

from cluster_kit.trainer.checkpoint.interval import (
    FIRST_SAVE_STEPS,
    Every,
    choose_interval,
    duration_text,
    estimate_mtbf_s,
    job_mtbf_s,
    parse_every,
    young_daly_s,
)


@pytest.mark.parametrize("written, kind, value", [
    ("auto", "auto", 0.0), ("AUTO", "auto", 0.0), (500, "steps", 500.0), ("500", "steps", 500.0),
    (" 12 ", "steps", 12.0), (7.0, "steps", 7.0), ("90s", "seconds", 90.0), ("30m", "seconds", 1800.0),
    ("2h", "seconds", 7200.0), ("1.5h", "seconds", 5400.0), ("1d", "seconds", 86400.0),
])
def test_checkpoint_every_reads_auto_steps_and_durations(written: object, kind: str, value: float) -> None:
    assert parse_every(written) == Every(kind, value)  # type: ignore[arg-type]


@pytest.mark.parametrize("written", ["0", 0, -5, 2.5, "0m", "thirty", "30 minutes", "5x", True, ""])
def test_anything_else_is_refused_naming_the_forms(written: object) -> None:
    with pytest.raises(ValueError, match=r"auto, a number of steps \(500\) or a duration"):
        parse_every(written)  # type: ignore[arg-type]


@pytest.mark.parametrize("written, shown", [("auto", "auto"), ("500", "500"), ("30m", "30m"), ("90s", "90s"),
                                            ("2h", "2h"), ("1.5h", "90m"), ("45.5s", "45.5s")])
def test_every_is_shown_as_checkpoint_every_spells_it(written: str, shown: str) -> None:
    assert str(parse_every(written)) == shown


def test_young_daly_by_hand() -> None:
    # 2 * 2 s * (9992 s + 8 s) = 40000, whose root is 200 s.
    assert young_daly_s(2.0, 9992.0, 8.0) == pytest.approx(200.0)
    # 2 * 3.1 * (28440 + 8) = 176377.6 -> 419.97 s
    assert young_daly_s(3.1, 28440.0, 8.0) == pytest.approx(math.sqrt(176377.6))
    # A save as long as the MTBF: sqrt(2 * 1000 * 100) = 447 s, held at the MTBF (100 s).
    assert young_daly_s(1000.0, 100.0, 0.0) == 100.0


def test_the_mtbf_of_a_job_is_one_nodes_over_the_nodes() -> None:
    assert job_mtbf_s(16, 5000.0) == 5000 * 3600 / 16  # 1,125,000 s = 312.5 h
    assert job_mtbf_s(0, 10.0) == 36000.0  # no node count: one node


def test_the_mtbf_estimate_takes_the_failures_seen_once_there_are_some() -> None:
    prior = 5000 * 3600 / 4  # 4,500,000 s
    assert estimate_mtbf_s(36000.0, 0, nodes=4) == prior  # 10 h without a failure: the prior
    assert estimate_mtbf_s(5e6, 0, nodes=4) == 5e6  # longer than the prior without one: at least that
    assert estimate_mtbf_s(36000.0, 3, nodes=4) == 12000.0  # 3 failures in 10 h: 3.3 h
    assert estimate_mtbf_s(0.0, 2, nodes=4) == 0.5  # failures at once: no division by zero


def test_auto_turns_young_daly_into_steps_and_says_why() -> None:
    interval = choose_interval(Every("auto"), step_s=0.5, save_s=2.0, mtbf_s=9992.0, restart_s=8.0, nodes=16)
    assert (interval.steps, interval.seconds) == (400, 200.0)  # 200 s of 0.5 s steps
    assert interval.why == "every 400 steps (3.3 min): save 2 s, restart 8 s, MTBF 2.8 h at 16 nodes"
    assert interval.measured


def test_auto_with_the_issues_figures() -> None:
    interval = choose_interval(Every("auto"), step_s=1.0, save_s=3.1, mtbf_s=7.9 * 3600, restart_s=8.0, nodes=16)
    assert interval.steps == 420  # sqrt(2 * 3.1 * 28448) = 419.97 s of 1 s steps
    assert interval.why == "every 420 steps (7.0 min): save 3.1 s, restart 8 s, MTBF 7.9 h at 16 nodes"


def test_an_asynchronous_save_is_never_due_before_the_last_one_is_written() -> None:
    # sqrt(2 * 0.02 * 3600) = 12 s, but the background write takes 30 s: 60 steps of 0.5 s.
    interval = choose_interval(Every("auto"), step_s=0.5, save_s=0.02, write_s=30.0, mtbf_s=3600.0,
                               restart_s=0.0, nodes=1)
    assert interval.steps == 60
    assert interval.why.endswith("MTBF 1.0 h at 1 node; no sooner than the 30 s background write")
    shorter = choose_interval(Every("auto"), step_s=0.5, save_s=0.02, write_s=5.0, mtbf_s=3600.0,
                              restart_s=0.0, nodes=1)
    assert shorter.steps == 24  # the 12 s of Young/Daly


def test_a_step_count_is_kept_as_asked() -> None:
    interval = choose_interval(Every("steps", 500), step_s=0.5, save_s=None, mtbf_s=1.0, restart_s=1.0, nodes=1)
    assert (interval.steps, interval.seconds) == (500, 250.0)
    assert interval.why == "every 500 steps (4.2 min): checkpoint_every 500"
    unknown = choose_interval(Every("steps", 1), step_s=None, save_s=None, mtbf_s=1.0, restart_s=1.0, nodes=1)
    assert (unknown.steps, unknown.seconds, unknown.why) == (1, None, "every 1 step: checkpoint_every 1")


def test_a_duration_becomes_steps_of_the_measured_time() -> None:
    interval = choose_interval(parse_every("30m"), step_s=2.0, save_s=None, mtbf_s=1.0, restart_s=1.0, nodes=1)
    assert (interval.steps, interval.seconds) == (900, 1800.0)
    assert interval.why == "every 900 steps (30.0 min): checkpoint_every 30m, step 2 s"
    tiny = choose_interval(parse_every("1s"), step_s=3.0, save_s=None, mtbf_s=1.0, restart_s=1.0, nodes=1)
    assert tiny.steps == 1  # never less than a step


@pytest.mark.parametrize("every, step_s, save_s, wanted", [
    ("auto", None, None, "the save cost"), ("auto", 0.5, None, "the save cost"),
    ("auto", None, 2.0, "the save cost"), ("30m", None, None, "the step time"),
])
def test_before_anything_is_measured_a_first_save_comes_early(
        every: str, step_s: float | None, save_s: float | None, wanted: str) -> None:
    interval = choose_interval(parse_every(every), step_s=step_s, save_s=save_s, mtbf_s=3600.0,
                               restart_s=60.0, nodes=2)
    assert (interval.steps, interval.seconds, interval.measured) == (FIRST_SAVE_STEPS, None, False)
    assert interval.why == f"a first save after {FIRST_SAVE_STEPS} steps measures {wanted}"


@pytest.mark.parametrize("seconds, text", [
    (0.25, "0.25 s"), (3.14, "3.1 s"), (8.0, "8 s"), (9.96, "10 s"), (45.4, "45 s"),
    (576.0, "9.6 min"), (5399.0, "90.0 min"), (28440.0, "7.9 h"),
])
def test_durations_read_as_people_write_them(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text
