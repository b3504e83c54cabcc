"""Which events are communication, which computation, and what each collective moved.

GPU traces: NCCL kernels by name (``ncclDevKernel_*``, older ``ncclKernel_*``) are
communication; every other kernel is computation; memcpy and memset are neither.
CPU-only traces (Gloo): the collectives' own spans (``gloo:all_reduce`` on Gloo's
worker threads) are communication; the ATen/autograd ops are computation.

Which all-reduces are DDP's gradient buckets: DDP's reducer launches a bucket's
all-reduce from the autograd hook of the bucket's last gradient, so its launch
(``c10d::allreduce_`` and, with NCCL, the ``nccl:all_reduce`` span inside it) sits
inside an ``autograd::engine::evaluate_function:`` span on the launching thread.
The job's own collectives (the loss or a metric all-reduced for logging, a
barrier) are launched by the training loop, outside any backward function.
Gloo runs a call on a worker thread, away from its launch: each ``gloo:*`` span is
paired with the earliest unpaired ``c10d::`` launch of the same op and element
count that started before it (Gloo runs a process group's calls in launch
order). Kernels replayed from a CUDA graph have no launch of their own to look at;
the graph cluster_kit.ddp.build_step captures holds forward, backward and the
optimizer step only, so its all-reduces count as DDP's buckets.
"""
from __future__ import annotations

import bisect
import math
import re
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

from cluster_kit.analysis.intervals import Span
from cluster_kit.analysis.traces import Event, Trace

NCCL_KERNEL = re.compile(r"^(?:void\s+)?nccl(?:Dev)?Kernel_(?P<op>[A-Za-z]+)")
CPU_COLLECTIVE_PREFIXES = ("gloo:",)
# Ops on the CPU that launch or wait for collectives: neither compute nor comm.
NOT_COMPUTE_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms", "ProfilerStep#")
OP_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv",
            "alltoall": "all_to_all", "send": "send", "recv": "recv"}
DTYPE_BYTES = {"float": 4, "float32": 4, "f32": 4, "double": 8, "float64": 8, "f64": 8,
               "half": 2, "float16": 2, "f16": 2, "bfloat16": 2, "c10::bfloat16": 2,
               "bf16": 2, "c10::half": 2, "int": 4, "int32": 4, "long int": 8, "int64": 8,
               "long": 8, "signed char": 1, "unsigned char": 1, "int8": 1, "uint8": 1,
               "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


BACKWARD_PREFIX = "autograd::engine::evaluate_function:"
LAUNCH_PREFIX = "c10d::"
GRAPH_LAUNCH_PREFIX = "cudaGraphLaunch"


@dataclass(frozen=True)
class Collective:
    """One collective call: its op, payload bytes (0 when unknown), span, and whose it is.

    ``ddp_bucket``: an all-reduce DDP's reducer launched for a gradient bucket
    (else the job's own collective, or one of DDP's other calls).
    """

    op: str
    bytes: int
    ts: float
    dur: float
    ddp_bucket: bool = False


class BackwardSpans:
    """The ``autograd::engine::evaluate_function:`` spans of a trace, per thread."""

    def __init__(self, events: list[Event]) -> None:
        spans: dict[Any, list[Event]] = {}
        for e in events:
            if e.name.startswith(BACKWARD_PREFIX):
                spans.setdefault(e.tid, []).append(e)
        self._starts: dict[Any, list[float]] = {}
        self._reach: dict[Any, list[float]] = {}  # the latest end of any span started so far
        for tid, found in spans.items():
            found.sort(key=lambda e: e.ts)
            self._starts[tid] = [e.ts for e in found]
            reach, latest = [], float("-inf")
            for e in found:
                latest = max(latest, e.end)
                reach.append(latest)
            self._reach[tid] = reach

    def covers(self, tid: Any, ts: float) -> bool:
        """Whether thread `tid` was running a backward function at time `ts`."""
        starts = self._starts.get(tid)
        if not starts:
            return False
        i = bisect.bisect_right(starts, ts) - 1
        return i >= 0 and self._reach[tid][i] >= ts


def is_bucket(op: str, in_backward: bool) -> bool:
    """DDP's gradient bucket: an all-reduce launched from within the backward pass."""
    return op == "all_reduce" and in_backward


def op_name(text: str) -> str:
    """``AllReduce`` / ``all_reduce`` / ``allreduce`` -> ``all_reduce``."""
    key = text.replace("_", "").lower()
    return OP_NAMES.get(key, text.lower())


def is_cpu_collective(event: Event) -> bool:
    return event.name.startswith(CPU_COLLECTIVE_PREFIXES)


def is_cpu_compute(event: Event) -> bool:
    return event.cat == "cpu_op" and not event.name.startswith(NOT_COMPUTE_PREFIXES)


Activity = tuple[list[Span], list[Span], list[Collective]]
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def activity(trace: Trace) -> Activity:
    """(compute spans, communication spans, collective calls) of a trace, spans unmerged."""
    return gpu_activity(trace) if trace.has_gpu else cpu_activity(trace)


def cpu_activity(trace: Trace) -> Activity:
    """Gloo: the ``gloo:*`` spans are the calls, each told DDP's or not by its launch."""
    compute: list[Span] = []
    comm: list[Span] = []
    calls: list[Collective] = []
    launches = _launches(trace, BackwardSpans(trace.events))
    for e in sorted(trace.events, key=lambda e: e.ts):
        if is_cpu_collective(e):
            comm.append((e.ts, e.end))
            op = op_name(e.name.split(":", 1)[1])
            in_backward = _pair_launch(launches, op, input_numel(e.args), e.ts)
            calls.append(Collective(op, message_bytes(e.args), e.ts, e.dur, is_bucket(op, in_backward)))
        elif is_cpu_compute(e):
            compute.append((e.ts, e.end))
    return compute, comm, calls


Launches = dict[tuple[str, int | None], deque[tuple[float, bool]]]


def _launches(trace: Trace, backward: BackwardSpans) -> Launches:
    """(op, element count) -> the ``c10d::`` launches in time order: (start, in a backward function)."""
    found: Launches = {}
    for e in sorted(trace.events, key=lambda e: e.ts):
        if e.cat == "cpu_op" and e.name.startswith(LAUNCH_PREFIX):
            key = (op_name(e.name[len(LAUNCH_PREFIX):].strip("_")), input_numel(e.args))
            found.setdefault(key, deque()).append((e.ts, backward.covers(e.tid, e.ts)))
    return found


def _pair_launch(launches: Launches, op: str, numel: int | None, ts: float) -> bool:
    """Whether the call's launch (the earliest unpaired one of its op and size) was in backward."""
    queue = launches.get((op, numel))
    if not queue or queue[0][0] > ts:
        return False
    return queue.popleft()[1]


def gpu_activity(trace: Trace) -> Activity:
    """Kernels split by who launched them: inside a ``nccl:*`` call (or NCCL-named) is comm.

    A one-rank NCCL all-reduce runs as a plain device copy, and a collective's
    kernel names change between NCCL releases; the CPU span that launched them
    says what they are. Kernels replayed from a CUDA graph are told by name.
    """
    owner, spans = _launching_collective(trace)
    backward = BackwardSpans(trace.events)
    launch_of = {e.args.get("correlation"): e for e in trace.events if e.cat in LAUNCH_CATS}
    compute: list[Span] = []
    comm: list[Span] = []
    per_call: dict[int, list[Event]] = {}
    named: list[Collective] = []
    for e in trace.events:
        if e.cat not in GPU_CATS:
            continue
        span = owner.get(e.args.get("correlation"))
        match = NCCL_KERNEL.match(e.name) if e.cat == "kernel" else None
        if span is not None:
            comm.append((e.ts, e.end))
            per_call.setdefault(id(span), [span]).append(e)
        elif match:
            comm.append((e.ts, e.end))
            op = op_name(str(e.args.get("Collective name") or match.group("op")))
            launch = launch_of.get(e.args.get("correlation"))
            named.append(Collective(op, message_bytes(e.args), e.ts, e.dur,
                                    is_bucket(op, launch is not None and _launched_in_backward(launch, backward))))
        elif e.cat == "kernel":
            compute.append((e.ts, e.end))
    calls = named + [_call_of(events[0], events[1:], backward) for events in per_call.values()]
    # A collective that put nothing on the GPU (one rank, in place) still counts as a call.
    calls += [_call_of(e, [], backward) for e in spans if id(e) not in per_call]
    return compute, comm, sorted(calls, key=lambda c: c.ts)


def _launched_in_backward(launch: Event, backward: BackwardSpans) -> bool:
    """A kernel's launch: a CUDA graph replay (build_step's step), or one made in backward."""
    return launch.name.startswith(GRAPH_LAUNCH_PREFIX) or backward.covers(launch.tid, launch.ts)


def _call_of(span: Event, launched: list[Event], backward: BackwardSpans) -> Collective:
    """The call of one ``nccl:*`` span; `launched`: its GPU events (none: it put nothing there)."""
    op = op_name(span.name.split(":", 1)[1])
    ts = min((e.ts for e in launched), default=span.ts)
    return Collective(op, message_bytes(span.args), ts, sum(e.dur for e in launched),
                      is_bucket(op, backward.covers(span.tid, span.ts)))


def _launching_collective(trace: Trace) -> tuple[dict[Any, Event], list[Event]]:
    """(correlation id -> the ``nccl:*`` CPU span whose thread launched it then, all such spans)."""
    spans: dict[Any, list[Event]] = {}
    for e in trace.events:
        if e.name.startswith("nccl:") and not e.cat.startswith("gpu_"):
            spans.setdefault(e.tid, []).append(e)
    for found in spans.values():
        found.sort(key=lambda e: e.ts)
    starts = {tid: [e.ts for e in found] for tid, found in spans.items()}
    owner: dict[Any, Event] = {}
    for e in trace.events:
        if e.cat not in LAUNCH_CATS or e.tid not in spans:
            continue
        i = bisect.bisect_right(starts[e.tid], e.ts) - 1
        if i >= 0 and e.ts <= spans[e.tid][i].end:
            owner[e.args.get("correlation")] = spans[e.tid][i]
    return owner, [e for found in spans.values() for e in found]


def input_numel(args: dict[str, object]) -> int | None:
    """Elements of a call's first input (a tensor, or a list of tensors summed); None when unknown."""
    dims = args.get("Input Dims")
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list):
        return None
    first = dims[0]
    shapes = first if first and all(isinstance(d, list) for d in first) else [first]
    count = 0
    for shape in shapes:
        if not all(isinstance(d, int) for d in shape):
            return None
        count += math.prod(shape)
    return count


def message_bytes(args: dict[str, object]) -> int:
    """Payload of a collective from its event's args (input shapes, or NCCL's counts)."""
    nelems = args.get("In msg nelems")
    types = args.get("Input type")
    first_type = types[0] if isinstance(types, list) and types else ""
    dtype = str(args.get("dtype") or first_type)
    if isinstance(nelems, (int, float)) and nelems:
        return int(nelems) * DTYPE_BYTES.get(dtype.lower(), 4)
    dims = args.get("Input Dims")
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        count = 1
        for d in dims[0]:
            if not isinstance(d, int):
                return 0
            count *= d
        kind = types[0] if isinstance(types, list) and types else "float"
        return count * DTYPE_BYTES.get(str(kind).lower(), 4)
    return 0


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw factor: what each rank's link carries per payload byte."""
    n = max(world_size, 1)
    if n == 1:
        return 1.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def busbw_gbps(op: str, nbytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in GB/s of one call of `nbytes` taking `seconds`."""
    if seconds <= 0 or nbytes <= 0:
        return 0.0
    return nbytes / seconds / 1e9 * bus_factor(op, world_size)


def summarise(calls: list[Collective], steps: int, world_size: int) -> list[dict[str, object]]:
    """Per (op, bytes, DDP's bucket or not): calls per step, median ms per call and its busbw, largest first."""
    groups: dict[tuple[str, int, bool], list[float]] = {}
    for call in calls:
        groups.setdefault((call.op, call.bytes, call.ddp_bucket), []).append(call.dur)
    rows = []
    for (op, nbytes, bucket), durations in groups.items():
        ms = statistics.median(durations) / 1e3
        rows.append({"op": op, "bytes": nbytes, "count": round(len(durations) / max(steps, 1), 2),
                     "ms": round(ms, 3), "busbw_gbps": round(busbw_gbps(op, nbytes, ms / 1e3, world_size), 3),
                     "ddp_bucket": bucket})
    return sorted(rows, key=lambda r: (not r["ddp_bucket"], -int(r["bytes"]), str(r["op"])))  # type: ignore[call-overload]
