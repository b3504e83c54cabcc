"""Each rank's step split into compute, exposed communication and other.

Per step: ``compute`` = time any compute kernel (CPU op on a CPU-only job) runs;
``comm`` = time any collective runs; ``exposed`` = collective time not covered by
compute; ``other`` = step time covered by neither. compute + exposed + other is
the step time. A rank's figures are the means over its steps (so they add up to
``step_ms.mean``); ``step_ms`` also has the median and p90.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from cluster_kit.analysis import collectives as coll
from cluster_kit.analysis.intervals import Span, clip, intersect, subtract, total, union
from cluster_kit.analysis.steps import Step, step_windows
from cluster_kit.analysis.traces import Trace, TraceError


@dataclass(frozen=True)
class StepTimes:
    """One step's figures in milliseconds, and its segments for a timeline."""

    number: int
    step_ms: float
    compute_ms: float
    comm_ms: float
    exposed_comm_ms: float
    other_ms: float
    segments: tuple[tuple[str, float, float], ...] = ()  # (kind, start ms, end ms) from step start


@dataclass
class RankResult:
    """One rank's analysis; ``as_json`` is its entry in the report's ``ranks``."""

    rank: int
    host: str
    world_size: int
    steps: list[StepTimes]
    collectives: list[dict[str, Any]]
    extra: dict[str, float] = field(default_factory=dict)

    def mean(self, key: str) -> float:
        return statistics.fmean(getattr(s, key) for s in self.steps)

    @property
    def step_median(self) -> float:
        return statistics.median(s.step_ms for s in self.steps)

    def as_json(self) -> dict[str, Any]:
        comm = self.mean("comm_ms")
        exposed = self.mean("exposed_comm_ms")
        return {
            "rank": self.rank, "host": self.host,
            "step_ms": {"median": r3(self.step_median), "p90": r3(percentile([s.step_ms for s in self.steps], 90)),
                        "mean": r3(self.mean("step_ms"))},
            "compute_ms": r3(self.mean("compute_ms")), "comm_ms": r3(comm),
            "exposed_comm_ms": r3(exposed),
            "overlap_pct": round(100 * (comm - exposed) / comm, 1) if comm > 0 else 0.0,
            "other_ms": r3(self.mean("other_ms")), "steps": len(self.steps),
            "collectives": self.collectives, **{k: r3(v) for k, v in self.extra.items()},
        }


def r3(value: float) -> float:
    return round(value, 3)


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (p90 of 10 steps is the 9th smallest)."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, -(-len(ordered) * pct // 100) - 1))
    return ordered[int(index)]


def split_step(step: Step, compute: list[Span], comm: list[Span]) -> StepTimes:
    """One step window's breakdown (spans already merged)."""
    busy = clip(compute, step.start, step.end)
    talk = clip(comm, step.start, step.end)
    exposed = subtract(talk, busy)
    duration = step.duration
    compute_us, exposed_us = total(busy), total(exposed)
    other_us = max(0.0, duration - compute_us - exposed_us)
    return StepTimes(step.number, duration / 1e3, compute_us / 1e3, total(talk) / 1e3,
                     exposed_us / 1e3, other_us / 1e3, _segments(step, busy, exposed))


def _segments(step: Step, busy: list[Span], exposed: list[Span]) -> tuple[tuple[str, float, float], ...]:
    marks = [("compute", s, e) for s, e in busy] + [("exposed_comm", s, e) for s, e in exposed]
    return tuple((kind, (s - step.start) / 1e3, (e - step.start) / 1e3) for kind, s, e in sorted(marks, key=lambda m: m[1]))


def analyse_rank(trace: Trace) -> RankResult:
    """The breakdown of every step of one rank's trace."""
    windows = step_windows(trace)
    if not windows:
        raise TraceError(f"{trace.path}: no ProfilerStep#N spans: record it with "
                         "torch.profiler's schedule and prof.step() (cluster_kit.ddp.StepProfiler does)")
    compute_spans, comm_spans, all_calls = coll.activity(trace)
    compute, comm = union(compute_spans), union(comm_spans)
    steps = [split_step(w, compute, comm) for w in windows]
    start, end = windows[0].start, windows[-1].end
    calls = [c for c in all_calls if start <= c.ts < end]
    extra = _extra_figures(trace, start, end, len(steps))
    extra["trace_overlap_pct"] = _overlap_pct(compute, comm)
    extra["exposed_bucket_ms"] = exposed_bucket_ms(windows, compute, all_calls)
    return RankResult(trace.rank, trace.host, trace.world_size, steps,
                      coll.summarise(calls, len(steps), trace.world_size), extra=extra)


def exposed_bucket_ms(windows: list[Step], compute: list[Span], calls: list[coll.Collective]) -> float:
    """Mean per step of the time DDP's bucket all-reduces run with no compute beside them.

    The part of ``exposed_comm_ms`` that bucket sizes can change: the job's own
    collectives (a loss all-reduced for logging) are left out.
    """
    buckets = union((c.ts, c.ts + c.dur) for c in calls if c.ddp_bucket)
    exposed = [total(subtract(clip(buckets, w.start, w.end), clip(compute, w.start, w.end))) for w in windows]
    return statistics.fmean(exposed) / 1e3


def _extra_figures(trace: Trace, start: float, end: float, steps: int) -> dict[str, float]:
    """Per-step figures the advice needs: DDP's bucket copies, kernels launched."""
    copies = sum(e.dur for e in trace.events if e.name == "torch.distributed.ddp.reducer::copy_bucket_to_grad"
                 and start <= e.ts < end)
    kernels = sum(1 for e in trace.events if e.cat == "kernel" and start <= e.ts < end)
    graphs = sum(1 for e in trace.events if e.name.startswith("cudaGraphLaunch") and start <= e.ts < end)
    out = {"bucket_copy_ms": copies / 1e3 / steps}
    if trace.has_gpu:
        out["kernels_per_step"] = kernels / steps
        out["graph_launches_per_step"] = graphs / steps
    return out


def overall_overlap_pct(trace: Trace) -> float:
    """Share of all communication time overlapped by compute, over the whole trace.

    The figure Holistic Trace Analysis's comm/comp overlap reports per rank.
    """
    compute_spans, comm_spans, _calls = coll.activity(trace)
    return _overlap_pct(union(compute_spans), union(comm_spans))


def _overlap_pct(compute: list[Span], comm: list[Span]) -> float:
    talk = total(comm)
    return 100 * total(intersect(comm, compute)) / talk if talk > 0 else 0.0
