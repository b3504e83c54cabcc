"""Cut a trace into its training steps: the profiler's ``ProfilerStep#N`` windows.

On the CPU a step is its ProfilerStep span. On a GPU the kernels a step launched
may still run after the CPU has moved on, so a step's window ends at the later of
its CPU span and its last kernel; windows never overlap (a step starts no earlier
than the previous one ended), so they add up to the recorded time.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from cluster_kit.analysis.traces import Event, Trace

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


@dataclass(frozen=True)
class Step:
    """One step window, in trace microseconds."""

    number: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def profiler_steps(trace: Trace) -> list[Event]:
    """The ProfilerStep#N spans on the CPU, in time order."""
    spans = [e for e in trace.events if e.name.startswith("ProfilerStep#") and not e.cat.startswith("gpu_")]
    return sorted(spans, key=lambda e: e.ts)


def step_number(event: Event) -> int:
    tail = event.name.rpartition("#")[2]
    return int(tail) if tail.isdigit() else -1


def step_windows(trace: Trace) -> list[Step]:
    """The trace's steps; on GPU traces extended to the end of each step's kernels."""
    spans = profiler_steps(trace)
    ends = [e.end for e in spans]
    if trace.has_gpu:
        ends = _gpu_ends(trace, spans, ends)
    steps: list[Step] = []
    for span, end in zip(spans, ends):
        start = max(span.ts, steps[-1].end) if steps else span.ts
        steps.append(Step(step_number(span), start, max(start, end)))
    return steps


def _gpu_ends(trace: Trace, spans: list[Event], ends: list[float]) -> list[float]:
    """Each step's end pushed out to the last GPU activity it launched."""
    launches = {e.args.get("correlation"): e.ts for e in trace.events if e.cat in LAUNCH_CATS}
    starts = [e.ts for e in spans]
    out = list(ends)
    for event in trace.events:
        if event.cat not in GPU_CATS:
            continue
        launched = launches.get(event.args.get("correlation"))
        if launched is None:
            continue
        index = bisect.bisect_right(starts, launched) - 1
        if 0 <= index < len(spans) and launched <= spans[index].end and event.end > out[index]:
            out[index] = event.end
    return out
