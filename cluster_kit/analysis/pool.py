"""Analyse many trace files at once: one process per CPU, each reading and cutting one rank.

Reading a rank's trace and splitting its steps needs nothing from the other
ranks, and the JSON parsing is most of the time: with 8 ranks on 8 CPUs the
wall time is about that of one.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from cluster_kit.analysis.breakdown import RankResult, analyse_rank
from cluster_kit.analysis.traces import Trace, load_trace

# Starting worker processes costs more than it saves on small traces.
PARALLEL_MIN_BYTES = 16 << 20


def analyse_file(path: Path) -> tuple[Trace, RankResult]:
    """One trace file's description (events dropped) and its breakdown."""
    trace = load_trace(path)
    return trace.without_events(), analyse_rank(trace)


def analyse_files(paths: Sequence[Path], workers: int | None = None) -> tuple[list[Trace], dict[str, RankResult]]:
    """Every file analysed, in parallel when there are several files, CPUs and megabytes."""
    workers = min(len(paths), workers or os.cpu_count() or 1)
    if workers <= 1 or sum(p.stat().st_size for p in paths) < PARALLEL_MIN_BYTES:
        pairs: list[Any] = [analyse_file(p) for p in paths]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            pairs = list(pool.map(analyse_file, paths))
    return [t for t, _ in pairs], {t.path: r for t, r in pairs}
