"""bench allreduce --find-slow's narrowing, with a stand-in measure: a ring all-reduce runs
at the speed of its slowest member, so a run's busbw is the minimum of its nodes' speeds."""
from __future__ import annotations

from cluster_kit.analysis.find_slow import narrow

FAST, SLOW = 180.0, 40.0


def ring(speeds: dict[str, float], calls: list[list[str]] | None = None):  # type: ignore[no-untyped-def]
    def measure(nodes: list[str]) -> float | None:
        if calls is not None:
            calls.append(list(nodes))
        return min(speeds[n] for n in nodes)
    return measure


def nodes(count: int) -> list[str]:
    return [f"gpu{i:03d}" for i in range(1, count + 1)]


def test_one_slow_node_of_eight_in_six_runs() -> None:
    speeds = dict.fromkeys(nodes(8), FAST) | {"gpu006": SLOW}
    calls: list[list[str]] = []
    found = narrow(nodes(8), ring(speeds, calls))
    assert found.culprits == ["gpu006"]
    assert [(run.step, run.nodes, run.busbw_gbps, run.slow) for run in found.runs] == [
        ("all", tuple(nodes(8)), SLOW, False),
        ("half", ("gpu001", "gpu002", "gpu003", "gpu004"), FAST, False),
        ("half", ("gpu005", "gpu006", "gpu007", "gpu008"), SLOW, True),
        ("half", ("gpu005", "gpu006"), SLOW, True),
        ("half", ("gpu007", "gpu008"), FAST, False),
        ("pair", ("gpu001", "gpu005"), FAST, False),
        ("pair", ("gpu001", "gpu006"), SLOW, True),
    ]
    assert found.verdict.startswith("slow: gpu006")


def test_with_an_expectation_a_fast_fleet_stops_after_one_run() -> None:
    found = narrow(nodes(4), ring(dict.fromkeys(nodes(4), FAST)), threshold=150)
    assert len(found.runs) == 1 and found.culprits == []
    assert found.verdict == "not slow: 180.00 GB/s reaches the expected 150 GB/s"


def test_three_nodes_pairwise() -> None:
    speeds = dict.fromkeys(nodes(3), FAST) | {"gpu002": SLOW}
    found = narrow(nodes(3), ring(speeds), threshold=150)
    assert found.culprits == ["gpu002"]
    assert [run.nodes for run in found.runs if run.step == "pair"] == [
        ("gpu001", "gpu002"), ("gpu001", "gpu003"), ("gpu002", "gpu003")]


def test_two_nodes_cannot_tell_which() -> None:
    speeds = {"n1": FAST, "n2": SLOW}
    found = narrow(["n1", "n2"], ring(speeds), threshold=150)
    assert found.culprits == []
    assert found.verdict == "n1 and n2 together are slow; a third node is needed to tell which"


def test_two_slow_nodes_in_different_halves_are_reported_as_such() -> None:
    speeds = dict.fromkeys(nodes(8), FAST) | {"gpu002": SLOW, "gpu007": SLOW}
    found = narrow(nodes(8), ring(speeds), threshold=150)
    assert found.culprits == []
    assert found.verdict.startswith("both halves are slow")


def test_two_slow_nodes_in_one_quarter_are_both_named() -> None:
    speeds = dict.fromkeys(nodes(8), FAST) | {"gpu005": SLOW, "gpu006": SLOW}
    found = narrow(nodes(8), ring(speeds), threshold=150)
    assert found.culprits == ["gpu005", "gpu006"]


def test_a_failed_run_counts_as_slow() -> None:
    def measure(group: list[str]) -> float | None:
        return None if "gpu003" in group else FAST
    found = narrow(nodes(4), measure)
    assert found.culprits == ["gpu003"]


def test_the_report_lists_each_run_with_its_busbw_and_job() -> None:
    from cluster_kit.report.allreduce import format_find_slow

    speeds = dict.fromkeys(nodes(4), FAST) | {"gpu003": SLOW}
    found = narrow(nodes(4), ring(speeds), threshold=150)
    text, doc = format_find_slow(found, [str(100 + i) for i in range(len(found.runs))])
    assert doc["culprits"] == ["gpu003"]
    assert doc["runs"][0] == {"run": 1, "step": "all", "nodes": nodes(4), "busbw_gbps": SLOW, "slow": True,
                              "job_id": "100"}
    lines = text.splitlines()
    assert lines[1].split() == ["1", "all", "40.00", "SLOW", "gpu001,gpu002,gpu003,gpu004"]
    assert lines[-1] == found.verdict


def test_a_narrowing_run_pins_its_nodes() -> None:
    from cluster_kit.render.sweep import on_nodes

    settings = {"nodes": 8, "slurm": {"nodelist": None, "exclude": "gpu009", "partition": "gpu"}}
    pinned = on_nodes(settings, ["gpu005", "gpu006"])
    assert pinned["nodes"] == 2
    assert pinned["slurm"] == {"nodelist": "gpu[005-006]", "exclude": None, "partition": "gpu"}
