"""analysis.pool: every trace file read and broken down, in this process or in a pool.

The traces are drawn by hand (rank r: one step of 10 + r ms, compute 0-5, a Gloo
all-reduce 5-8 on its own thread, nothing after), so every figure is known. Whether
the files go to a process pool is seen through a stand-in executor that records how
it was made and runs the work here; one test runs the real pool.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar, Self

import pytest

from cluster_kit.analysis import pool


def op(name: str, start_ms: float, end_ms: float, tid: int = 1, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid,
            "ts": start_ms * 1e3, "dur": (end_ms - start_ms) * 1e3, "args": {}}


def write_traces(folder: Path, ranks: int = 3) -> list[Path]:
    paths = []
    for r in range(ranks):
        doc = {"traceEvents": [op("ProfilerStep#1", 0, 10 + r, cat="user_annotation"),
                               op("aten::mm", 0, 5), op("gloo:all_reduce", 5, 8, tid=2)],
               "distributedInfo": {"rank": r, "world_size": ranks, "backend": "gloo"}}
        path = folder / f"bucket_cap_mb=5.trace-rank{r}@node{r}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


def figures(result: Any) -> tuple[Any, ...]:
    [step] = result.steps
    return (result.rank, result.host, result.world_size,
            (step.step_ms, step.compute_ms, step.comm_ms, step.exposed_comm_ms, step.other_ms))


def expected(paths: list[Path]) -> dict[str, tuple[Any, ...]]:
    """Rank r on node r: a 10 + r ms step, 5 of compute, 3 of exposed Gloo, the rest idle."""
    return {str(p): (r, f"node{r}", len(paths), pytest.approx((10.0 + r, 5.0, 3.0, 3.0, 2.0 + r)))
            for r, p in enumerate(paths)}


def check(paths: list[Path], traces: list[Any], results: dict[str, Any]) -> None:
    assert [(t.path, t.rank, t.world_size, t.host, t.backend, t.variant, t.events, t.has_gpu) for t in traces] == [
        (str(p), r, len(paths), f"node{r}", "gloo", "bucket_cap_mb=5", [], False) for r, p in enumerate(paths)]
    assert list(results) == [str(p) for p in paths]
    assert {path: figures(result) for path, result in results.items()} == expected(paths)


class Recorder:
    """A stand-in for ProcessPoolExecutor: records its workers and the files, runs them here."""

    made: ClassVar[list[int | None]] = []

    def __init__(self, max_workers: int | None = None) -> None:
        Recorder.made.append(max_workers)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: Callable[[Path], Any], items: Iterable[Path]) -> Iterable[Any]:
        return map(fn, list(items))


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> type[Recorder]:
    Recorder.made = []
    monkeypatch.setattr(pool, "ProcessPoolExecutor", Recorder)
    return Recorder


def test_one_file_keeps_its_description_and_drops_its_events(tmp_path: Path) -> None:
    [path] = write_traces(tmp_path, ranks=1)
    trace, result = pool.analyse_file(path)
    assert (trace.path, trace.rank, trace.host, trace.variant, trace.events) == (
        str(path), 0, "node0", "bucket_cap_mb=5", [])
    assert figures(result) == (0, "node0", 1, pytest.approx((10.0, 5.0, 3.0, 3.0, 2.0)))


def test_small_files_are_read_here(tmp_path: Path, recorder: type[Recorder]) -> None:
    paths = write_traces(tmp_path)
    traces, results = pool.analyse_files(paths, workers=3)
    check(paths, traces, results)
    assert recorder.made == []  # far below 16 MiB: no pool


def test_from_the_size_limit_on_the_files_go_to_one_worker_each(tmp_path: Path, recorder: type[Recorder],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_traces(tmp_path)
    total = sum(p.stat().st_size for p in paths)
    monkeypatch.setattr(pool, "PARALLEL_MIN_BYTES", total)
    traces, results = pool.analyse_files(paths, workers=8)  # no more workers than files
    check(paths, traces, results)
    assert recorder.made == [3]
    monkeypatch.setattr(pool, "PARALLEL_MIN_BYTES", total + 1)
    check(paths, *pool.analyse_files(paths, workers=8))
    assert recorder.made == [3]  # one byte short: read here


def test_workers_asked_for_are_the_cap(tmp_path: Path, recorder: type[Recorder],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_traces(tmp_path)
    monkeypatch.setattr(pool, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 16)
    check(paths, *pool.analyse_files(paths, workers=2))
    check(paths, *pool.analyse_files(paths, workers=1))  # one worker: read here
    check(paths, *pool.analyse_files(paths))  # none asked: one per CPU, at most one per file
    assert recorder.made == [2, 3]


def test_the_cpus_bound_the_workers(tmp_path: Path, recorder: type[Recorder],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_traces(tmp_path)
    monkeypatch.setattr(pool, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 2)
    check(paths, *pool.analyse_files(paths))
    monkeypatch.setattr(pool.os, "cpu_count", lambda: None)  # unknown: one
    check(paths, *pool.analyse_files(paths))
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 1)
    check(paths, *pool.analyse_files(paths))
    assert recorder.made == [2]


def test_no_files(recorder: type[Recorder]) -> None:
    assert pool.analyse_files([], workers=4) == ([], {})
    assert recorder.made == []


def test_the_real_pool_gives_the_same_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_traces(tmp_path)
    monkeypatch.setattr(pool, "PARALLEL_MIN_BYTES", 0)
    check(paths, *pool.analyse_files(paths, workers=2))
