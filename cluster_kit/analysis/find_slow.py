"""Which node makes an all-reduce slow: halving, then pairwise runs (`bench allreduce --find-slow`).

Pure: `narrow(nodes, measure, threshold)` calls `measure(nodes) -> busbw GB/s` (None when
the run failed) once per run and returns every run with the verdict. A run is slow when
its busbw is below `threshold` (expect.allreduce_busbw_gbps), or, without one, below
RATIO times the best run of the same step. The nodes are halved while four or more are
suspect (each half keeps at least two nodes, so every run crosses the fabric): the slow
half stays suspect, the fast one becomes the known-good reference. Two or three suspects
left are each run with a known-good node, or, with none known, pairwise with each other.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

RATIO = 0.8   # without an expectation: a run below 80% of its step's best is slow

Measure = Callable[[list[str]], "float | None"]


@dataclass(frozen=True)
class Run:
    """One all-reduce run: its nodes, its busbw and whether it counts as slow."""

    step: str                 # "all", "half", "pair"
    nodes: tuple[str, ...]
    busbw_gbps: float | None
    slow: bool = False


@dataclass
class Narrowing:
    """Every run, the node(s) found slow, and one sentence saying what was found."""

    runs: list[Run] = field(default_factory=list)
    culprits: list[str] = field(default_factory=list)
    verdict: str = ""


def is_slow(busbw: float | None, bar: float) -> bool:
    """A failed run (None) counts as slow."""
    return busbw is None or busbw < bar


def step_bar(figures: Sequence[float | None], threshold: float | None) -> float:
    """The busbw below which a run of this step is slow."""
    if threshold is not None:
        return threshold
    return RATIO * max((f for f in figures if f is not None), default=0.0)


def run_step(out: Narrowing, step: str, groups: list[list[str]], measure: Measure,
             threshold: float | None) -> list[Run]:
    """Measure each group, judge them together, record and return the runs."""
    figures = [measure(group) for group in groups]
    bar = step_bar(figures, threshold)
    runs = [Run(step, tuple(group), busbw, is_slow(busbw, bar)) for group, busbw in zip(groups, figures)]
    out.runs += runs
    return runs


def halve(out: Narrowing, suspects: list[str], measure: Measure,
          threshold: float | None) -> tuple[list[str], list[str], bool]:
    """(suspects, known good, whether to go on) after halving while four or more are suspect."""
    good: list[str] = []
    while len(suspects) >= 4:
        middle = len(suspects) // 2
        first, second = run_step(out, "half", [suspects[:middle], suspects[middle:]], measure, threshold)
        if first.slow == second.slow:
            out.verdict = ("both halves are slow: more than one slow node, or the fabric between them"
                           if first.slow else "each half alone is fast: the slowness is not one node's "
                           "(check the links and switches between the halves)")
            return suspects, good, False
        slow, fast = (first, second) if first.slow else (second, first)
        suspects, good = list(slow.nodes), good + list(fast.nodes)
    return suspects, good, True


def pair_off(out: Narrowing, suspects: list[str], good: list[str], measure: Measure,
             threshold: float | None) -> None:
    """Run each suspect beside a known-good node (or pairwise) and name the slow ones."""
    if good:
        runs = run_step(out, "pair", [[good[0], node] for node in suspects], measure, threshold)
        out.culprits = [run.nodes[1] for run in runs if run.slow]
    elif len(suspects) == 3:
        pairs = [[suspects[0], suspects[1]], [suspects[0], suspects[2]], [suspects[1], suspects[2]]]
        runs = run_step(out, "pair", pairs, measure, threshold)
        slow_pairs = [set(run.nodes) for run in runs if run.slow]
        common = set.intersection(*slow_pairs) if slow_pairs else set()
        out.culprits = [node for node in suspects if node in common] if len(slow_pairs) >= 2 else []
    if out.culprits:
        out.verdict = f"slow: {', '.join(out.culprits)} (every run with it is slow, the others are not)"
    elif len(suspects) == 2 and not good:
        out.verdict = f"{suspects[0]} and {suspects[1]} together are slow; a third node is needed to tell which"
    else:
        out.verdict = "no single node is slow in a pair: the slowness needs more nodes (the fabric?)"


def narrow(nodes: Sequence[str], measure: Measure, threshold: float | None = None) -> Narrowing:
    """Find the node(s) that make an all-reduce over `nodes` slow (module docstring)."""
    out = Narrowing()
    [whole] = run_step(out, "all", [list(nodes)], measure, threshold)
    if threshold is not None and not whole.slow:
        out.verdict = f"not slow: {whole.busbw_gbps:.2f} GB/s reaches the expected {threshold:g} GB/s"
        return out
    if len(nodes) < 2:
        out.verdict = "one node: nothing crosses the fabric, nothing to narrow"
        return out
    suspects, good, go_on = halve(out, list(nodes), measure, threshold)
    if go_on:
        pair_off(out, suspects, good, measure, threshold)
    return out
