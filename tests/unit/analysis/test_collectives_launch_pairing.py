"""Gloo calls paired with their launches, and nccl:* spans with the kernels they launched.

On the recorded Gloo trace of tests/data/traces/gloo-sweep-loss (as-is, rank 0: per step
two buckets of DDP's, of 263169 and 558592 floats, launched in backward, and the loss,
one float, launched by the training loop) and on hand-made traces whose pairing is
worked out in the comments.
"""
from __future__ import annotations

from pathlib import Path

from cluster_kit.analysis.collectives import Collective, cpu_activity, gpu_activity
from cluster_kit.analysis.traces import Event, Trace, load_trace

SWEEP = Path(__file__).resolve().parents[2] / "data" / "traces" / "gloo-sweep-loss"
BACKWARD = "autograd::engine::evaluate_function: AddmmBackward0"


def event(name: str, ts: float, dur: float, tid: object = 1, cat: str = "cpu_op", **args: object) -> Event:
    return Event(name, cat, ts, dur, tid, dict(args))


def gloo(op: str, ts: float, dur: float, numel: int) -> Event:
    """A Gloo call on its worker thread (tid 2), as Gloo records it."""
    return event(f"gloo:{op}", ts, dur, tid=2, cat="user_annotation",
                 **{"Input Dims": [[numel]], "Input type": ["float"]})


def launch(op: str, ts: float, numel: int) -> Event:
    """The c10d:: op on the training thread (tid 1) that launched a call."""
    return event(f"c10d::{op}_", ts, 1.0, **{"Input Dims": [[[numel]], []], "Input type": ["TensorList", ""]})


def cpu_trace(events: list[Event]) -> Trace:
    return Trace("t.json", 0, 2, "h", "gloo", "as-is", events, has_gpu=False)


def test_the_recorded_gloo_steps_buckets_and_the_loss() -> None:
    trace = load_trace(SWEEP / "as-is.trace-rank0@vm.json.gz")
    compute, comm, calls = cpu_activity(trace)
    assert [(c.bytes, c.ddp_bucket) for c in calls] == [(1052676, True), (2234368, True), (4, False)] * 3
    assert [c.ts for c in calls] == sorted(c.ts for c in calls) == [s[0] for s in comm]
    assert compute == sorted(compute) and len(compute) > 100  # in time order, not by op name


def test_a_call_whose_launch_fell_before_the_profiled_window_is_no_bucket() -> None:
    trace = load_trace(SWEEP / "as-is.trace-rank0@vm.json.gz")
    first = min((e for e in trace.events if e.name == "c10d::allreduce_"), key=lambda e: e.ts)
    trace.events.remove(first)  # step 3's bucket of 263169 floats: launched, then the window opened
    _, _, calls = cpu_activity(trace)
    # the next launch of that size (step 4's) is later than step 3's call: it pairs with step 4's
    assert [(c.bytes, c.ddp_bucket) for c in calls] == [
        (1052676, False), (2234368, True), (4, False)] + [(1052676, True), (2234368, True), (4, False)] * 2


def test_launches_pair_by_op_and_size_in_time_order() -> None:
    events = [
        event("aten::mm", 0.0, 10.0),
        gloo("all_reduce", 5.0, 3.0, 500),  # its launch is not in the trace
        event(BACKWARD, 20.0, 40.0),
        launch("allreduce", 25.0, 500),  # in backward: DDP's bucket
        launch("allreduce", 30.0, 1000),  # in backward, and Gloo starts it in the same microsecond
        gloo("all_reduce", 30.0, 5.0, 1000),
        gloo("all_reduce", 40.0, 6.0, 500),
        event("aten::add_", 50.0, 5.0),
        launch("broadcast", 70.0, 16),
        gloo("broadcast", 72.0, 8.0, 16),
        gloo("all_reduce", 90.0, 1.0, 1),  # no launch at all
    ]
    compute, comm, calls = cpu_activity(cpu_trace(events))
    assert compute == [(0.0, 10.0), (20.0, 60.0), (50.0, 55.0)]  # the backward function computes too
    assert comm == [(5.0, 8.0), (30.0, 35.0), (40.0, 46.0), (72.0, 80.0), (90.0, 91.0)]
    assert calls == [
        Collective("all_reduce", 2000, 5.0, 3.0, False),
        Collective("all_reduce", 4000, 30.0, 5.0, True),
        Collective("all_reduce", 2000, 40.0, 6.0, True),
        Collective("broadcast", 64, 72.0, 8.0, False),
        Collective("all_reduce", 4, 90.0, 1.0, False),
    ]


def test_ops_alike_but_for_their_shapes_at_one_whole_microsecond() -> None:
    # Older profilers write whole microseconds: two short ops of one name on one thread can
    # start and end in the same one, told apart by their args only.
    events = [
        event("aten::empty", 100.0, 0.0, **{"Input Dims": [[2]]}),
        event("aten::empty", 100.0, 0.0, **{"Input Dims": [[3]]}),
        launch("allreduce", 101.0, 8),
        launch("allreduce", 101.0, 8),
        gloo("all_reduce", 102.0, 4.0, 8),
        gloo("all_reduce", 106.0, 4.0, 8),
    ]
    compute, comm, calls = cpu_activity(cpu_trace(events))
    assert compute == [(100.0, 100.0), (100.0, 100.0)]
    assert comm == [(102.0, 106.0), (106.0, 110.0)]
    assert [c.ddp_bucket for c in calls] == [False, False]


def kernel_trace(*cpu: Event) -> Trace:
    """`cpu` events, then a kernel of correlation 1 on the GPU stream (tid 0) at 400."""
    gpu = event("Memcpy DtoD (Device -> Device)", 400.0, 30.0, tid=0, cat="kernel", correlation=1)
    return Trace("t.json", 0, 1, "h", "nccl", "as-is", [*cpu, gpu], has_gpu=True)


def test_a_launch_belongs_to_the_latest_nccl_span_started_before_it_up_to_its_end() -> None:
    broadcast = event("nccl:broadcast", 100.0, 10.0, tid=7, cat="user_annotation", **{"In msg nelems": 4})
    all_reduce = event("nccl:all_reduce", 300.0, 20.0, tid=7, cat="user_annotation", **{"In msg nelems": 8})
    for at in (305.0, 320.0):  # within the all-reduce, and at its very end
        trace = kernel_trace(broadcast, all_reduce,
                             event("cudaLaunchKernel", at, 1.0, tid=7, cat="cuda_runtime", correlation=1))
        compute, comm, calls = gpu_activity(trace)
        assert (compute, comm) == ([], [(400.0, 430.0)])
        assert calls == [Collective("broadcast", 16, 100.0, 0.0, False), Collective("all_reduce", 32, 400.0, 30.0)]


def test_an_nccl_annotation_on_the_gpu_is_no_call_of_its_own() -> None:
    trace = kernel_trace(
        event("nccl:all_reduce", 300.0, 20.0, tid=7, cat="user_annotation", **{"In msg nelems": 8}),
        event("cudaLaunchKernel", 305.0, 1.0, tid=7, cat="cuda_runtime", correlation=1),
        event("nccl:all_reduce", 400.0, 30.0, tid=0, cat="gpu_user_annotation"),  # the same call, on the stream
    )
    _, comm, calls = gpu_activity(trace)
    assert comm == [(400.0, 430.0)]
    assert calls == [Collective("all_reduce", 32, 400.0, 30.0)]
