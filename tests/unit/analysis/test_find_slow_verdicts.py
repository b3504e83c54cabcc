"""find-slow's verdicts written out whole, and the edges of its judgement: a run at the bar,
runs that all failed, halves that are both fast, three suspects of which one pair alone is slow."""
from __future__ import annotations

from cluster_kit.analysis.find_slow import is_slow, narrow, step_bar

FAST, SLOW = 180.0, 40.0


def by_group(figures: dict[tuple[str, ...], float | None], default: float | None = FAST):  # type: ignore[no-untyped-def]
    """A measure that gives each group its own figure (the default for groups not named)."""
    def measure(nodes: list[str]) -> float | None:
        return figures.get(tuple(nodes), default)
    return measure


def test_a_run_exactly_at_the_bar_is_not_slow() -> None:
    assert is_slow(150.0, 150.0) is False
    assert is_slow(149.99, 150.0) is True
    assert is_slow(None, 0.0) is True
    found = narrow(["a", "b", "c", "d"], by_group({}, default=150.0), threshold=150)
    assert [(run.step, run.busbw_gbps, run.slow) for run in found.runs] == [("all", 150.0, False)]
    assert found.verdict == "not slow: 150.00 GB/s reaches the expected 150 GB/s"


def test_the_bar_of_a_step_whose_runs_all_failed_is_zero() -> None:
    assert step_bar([None, None], None) == 0.0
    assert step_bar([], None) == 0.0
    assert step_bar([100.0, None, 50.0], None) == 80.0  # 80 % of the best
    assert step_bar([100.0], 30.0) == 30.0  # an expectation is the bar itself


def test_one_node_has_nothing_to_narrow() -> None:
    found = narrow(["gpu001"], by_group({}))
    assert [(run.step, run.nodes, run.slow) for run in found.runs] == [("all", ("gpu001",), False)]
    assert found.culprits == []
    assert found.verdict == "one node: nothing crosses the fabric, nothing to narrow"


def test_each_half_fast_alone_blames_what_joins_them() -> None:
    nodes = ["a", "b", "c", "d"]
    found = narrow(nodes, by_group({tuple(nodes): SLOW}), threshold=150)
    assert [(run.nodes, run.slow) for run in found.runs] == [
        (("a", "b", "c", "d"), True), (("a", "b"), False), (("c", "d"), False)]
    assert found.culprits == []
    assert found.verdict == ("each half alone is fast: the slowness is not one node's "
                             "(check the links and switches between the halves)")


def test_both_halves_slow_verdict_whole() -> None:
    found = narrow(["a", "b", "c", "d"], by_group({("a", "b", "c", "d"): SLOW, ("a", "b"): SLOW, ("c", "d"): SLOW}),
                   threshold=150)
    assert found.culprits == []
    assert found.verdict == "both halves are slow: more than one slow node, or the fabric between them"


def test_three_suspects_all_fast_in_pairs() -> None:
    nodes = ["a", "b", "c"]
    found = narrow(nodes, by_group({tuple(nodes): SLOW}), threshold=150)
    assert [(run.step, run.nodes, run.slow) for run in found.runs] == [
        ("all", ("a", "b", "c"), True),
        ("pair", ("a", "b"), False), ("pair", ("a", "c"), False), ("pair", ("b", "c"), False)]
    assert found.culprits == []
    assert found.verdict == "no single node is slow in a pair: the slowness needs more nodes (the fabric?)"


def test_three_suspects_with_one_slow_pair_name_nobody() -> None:
    # only a and b together are slow: neither is slow beside c, so neither is the culprit
    found = narrow(["a", "b", "c"], by_group({("a", "b", "c"): SLOW, ("a", "b"): SLOW}), threshold=150)
    assert [run.slow for run in found.runs] == [True, True, False, False]
    assert found.culprits == []
    assert found.verdict == "no single node is slow in a pair: the slowness needs more nodes (the fabric?)"


def test_three_suspects_are_judged_against_the_expectation() -> None:
    # every pair at 100 GB/s: below the expected 150, though each is the best of its step
    found = narrow(["a", "b", "c"], by_group({}, default=100.0), threshold=150)
    assert [(run.step, run.slow) for run in found.runs] == [
        ("all", True), ("pair", True), ("pair", True), ("pair", True)]
    assert found.culprits == []  # every pair slow: no node is common to all of them
    assert found.verdict == "no single node is slow in a pair: the slowness needs more nodes (the fabric?)"


def test_three_suspects_the_one_in_both_slow_pairs() -> None:
    speeds = {"a": FAST, "b": SLOW, "c": FAST}

    def ring(nodes: list[str]) -> float:
        return min(speeds[n] for n in nodes)
    found = narrow(["a", "b", "c"], ring)
    assert [run.slow for run in found.runs] == [False, True, False, True]
    assert found.culprits == ["b"]
    assert found.verdict == "slow: b (every run with it is slow, the others are not)"


def test_two_culprits_beside_a_known_good_node() -> None:
    nodes = [f"gpu{i:03d}" for i in range(1, 9)]
    speeds = dict.fromkeys(nodes, FAST) | {"gpu005": SLOW, "gpu006": SLOW}

    def ring(group: list[str]) -> float:
        return min(speeds[n] for n in group)
    found = narrow(nodes, ring, threshold=150)
    assert [(run.step, run.nodes) for run in found.runs if run.step == "pair"] == [
        ("pair", ("gpu001", "gpu005")), ("pair", ("gpu001", "gpu006"))]
    assert found.culprits == ["gpu005", "gpu006"]
    assert found.verdict == "slow: gpu005, gpu006 (every run with it is slow, the others are not)"


def test_two_suspects_beside_a_good_node_neither_slow() -> None:
    # the 4 nodes are slow together, the half c,d is slow, yet c and d are each fast beside a
    nodes = ["a", "b", "c", "d"]
    found = narrow(nodes, by_group({tuple(nodes): SLOW, ("c", "d"): SLOW}), threshold=150)
    assert [(run.step, run.nodes, run.slow) for run in found.runs] == [
        ("all", ("a", "b", "c", "d"), True), ("half", ("a", "b"), False), ("half", ("c", "d"), True),
        ("pair", ("a", "c"), False), ("pair", ("a", "d"), False)]
    assert found.culprits == []
    assert found.verdict == "no single node is slow in a pair: the slowness needs more nodes (the fabric?)"
