"""The collective arithmetic a report's bandwidth column rests on, from figures worked out by hand.

Bus factors as nccl-tests documents them (doc/PERFORMANCE.md): all_reduce 2(n-1)/n,
all_gather, reduce_scatter and all_to_all (n-1)/n, broadcast and reduce 1. Bytes
are element counts times the dtype's size, written out here.
"""
from __future__ import annotations

import pytest

from cluster_kit.analysis.collectives import (
    BackwardSpans,
    Collective,
    bus_factor,
    busbw_gbps,
    gpu_activity,
    input_numel,
    message_bytes,
    op_name,
    summarise,
)
from cluster_kit.analysis.traces import Event, Trace

BACKWARD = "autograd::engine::evaluate_function: AddmmBackward0"


@pytest.mark.parametrize(("op", "n", "factor"), [
    ("all_reduce", 8, 1.75), ("all_reduce", 4, 1.5), ("all_reduce", 2, 1.0),
    ("all_gather", 8, 0.875), ("all_gather", 2, 0.5), ("reduce_scatter", 4, 0.75),
    ("all_to_all", 8, 0.875), ("broadcast", 8, 1.0), ("reduce", 4, 1.0), ("send_recv", 2, 1.0),
    # one rank (or a world size not known, 0): nothing crosses a link, the factor is 1
    ("all_reduce", 1, 1.0), ("all_gather", 1, 1.0), ("all_gather", 0, 1.0), ("broadcast", 1, 1.0),
])
def test_bus_factor_is_nccl_tests_factor(op: str, n: int, factor: float) -> None:
    assert bus_factor(op, n) == pytest.approx(factor)


def test_op_names() -> None:
    assert [op_name(t) for t in ("AllReduce", "allreduce", "all_reduce", "ReduceScatter", "SendRecv")] == \
        ["all_reduce", "all_reduce", "all_reduce", "reduce_scatter", "send_recv"]
    assert op_name("Barrier") == "barrier"  # not in the table: as written, in lower case


def test_busbw_is_bytes_per_second_times_the_factor() -> None:
    # 1 GB in 1 s is 1 GB/s of algorithm bandwidth; an 8-rank all-reduce carries 1.75x that
    assert busbw_gbps("all_reduce", 10**9, 1.0, 8) == pytest.approx(1.75)
    # 256 MiB in 10 ms on 4 ranks: 268435456 / 0.01 / 1e9 * 3/4
    assert busbw_gbps("all_gather", 268435456, 0.01, 4) == pytest.approx(20.1326592)
    assert busbw_gbps("broadcast", 5 * 10**8, 0.25, 16) == pytest.approx(2.0)
    # nothing moved or no time taken: no bandwidth, not a division by zero
    assert busbw_gbps("broadcast", 1, 1e-9, 2) == pytest.approx(1.0)
    assert busbw_gbps("all_reduce", 0, 1.0, 8) == 0.0
    assert busbw_gbps("all_reduce", 10**9, 0.0, 8) == 0.0
    assert busbw_gbps("all_reduce", 10**9, -1.0, 8) == 0.0
    assert busbw_gbps("all_reduce", -5, 1.0, 8) == 0.0


@pytest.mark.parametrize(("args", "nbytes"), [
    # NCCL's counts: elements times the dtype's size, whatever the dtype's case
    ({"In msg nelems": 1000, "dtype": "Float"}, 4000),
    ({"In msg nelems": 1000, "dtype": "BFloat16"}, 2000),
    ({"In msg nelems": 3, "dtype": "Double"}, 24),
    ({"In msg nelems": 7, "dtype": "Byte"}, 28),  # a dtype not in the table counts 4 bytes
    ({"In msg nelems": 5, "dtype": "uint8"}, 5),
    ({"In msg nelems": 12.0, "dtype": "Half"}, 24),
    # a count without a dtype: the first input's type (not the list written out, which no size matches)
    ({"In msg nelems": 10, "Input type": ["c10::BFloat16", "float"]}, 20),
    ({"In msg nelems": 10, "Input type": []}, 40),
    # counts win over shapes
    ({"In msg nelems": 10, "dtype": "Half", "Input Dims": [[100]], "Input type": ["float"]}, 20),
    # no count (or a zero one): the first input's shape and type
    ({"In msg nelems": 0, "Input Dims": [[4, 256]], "Input type": ["c10::BFloat16"]}, 2048),
    ({"Input Dims": [[2, 3]], "Input type": ["double"]}, 48),
    ({"Input Dims": [[2, 3], [1000]], "Input type": ["long int", "float"]}, 48),
    ({"Input Dims": [[2, 3]]}, 24),  # no type: float
    ({"Input Dims": [[3]], "Input type": ["Byte"]}, 12),  # a type not in the table: 4 bytes
    ({"Input Dims": [[2, 3]], "Input type": []}, 24),
    ({"Input Dims": [[]], "Input type": ["float"]}, 4),  # a scalar
    ({"Input Dims": [[2, "?"]], "Input type": ["float"]}, 0),
    ({"Input Dims": [], "Input type": ["float"]}, 0),
    ({"Input Dims": [5]}, 0),
    ({}, 0),
])
def test_message_bytes(args: dict[str, object], nbytes: int) -> None:
    assert message_bytes(args) == nbytes


@pytest.mark.parametrize(("dims", "numel"), [
    ([[2, 3]], 6),
    ([[2, 3], [1000]], 6),  # the first input only
    ([[[2, 3], [4]]], 10),  # a list of tensors: summed
    ([[[5]]], 5),
    ([[]], 1),  # a scalar
    ([[2, "?"]], None),
    ([[[2, 3], [4, "?"]]], None),
    ([], None),
    ([5], None),
    (5, None),
    ("2x3", None),
])
def test_input_numel(dims: object, numel: int | None) -> None:
    assert input_numel({"Input Dims": dims}) == numel


def test_input_numel_without_dims() -> None:
    assert input_numel({}) is None
    assert input_numel({"input dims": [[2, 3]]}) is None


def test_summarise_groups_by_op_size_and_bucket() -> None:
    calls = [
        Collective("all_reduce", 10**6, 10.0, 1000.0, True),
        Collective("all_reduce", 10**6, 20.0, 3500.0, True),
        Collective("all_reduce", 10**6, 30.0, 1500.0, True),
        Collective("all_reduce", 4, 40.0, 50.0, False),
        Collective("broadcast", 2 * 10**6, 45.0, 1000.0, False),
        Collective("all_gather", 2 * 10**6, 50.0, 4000.0, False),
        Collective("all_gather", 2 * 10**6, 60.0, 6000.0, False),
        Collective("all_reduce", 10**6, 80.0, 1234.5678, False),
    ]
    rows = summarise(calls, steps=2, world_size=4)
    # DDP's buckets first, then the largest, then by op
    assert rows == [
        # the median of 1, 3.5, 1.5 ms (not their mean, 2); 3 calls in 2 steps; 1e6 B / 1.5 ms * 2(3)/4
        {"op": "all_reduce", "bytes": 10**6, "count": 1.5, "ms": 1.5, "busbw_gbps": 1.0, "ddp_bucket": True},
        # the median of 4 and 6 ms is 5; 2e6 B / 5 ms * 3/4; of the same size, by op
        {"op": "all_gather", "bytes": 2 * 10**6, "count": 1.0, "ms": 5.0, "busbw_gbps": 0.3, "ddp_bucket": False},
        {"op": "broadcast", "bytes": 2 * 10**6, "count": 0.5, "ms": 1.0, "busbw_gbps": 2.0, "ddp_bucket": False},
        # the same op and size outside backward is a row of its own; ms and GB/s to 3 places
        {"op": "all_reduce", "bytes": 10**6, "count": 0.5, "ms": 1.235, "busbw_gbps": 1.215, "ddp_bucket": False},
        {"op": "all_reduce", "bytes": 4, "count": 0.5, "ms": 0.05, "busbw_gbps": 0.0, "ddp_bucket": False},
    ]


def test_summarise_counts_per_step() -> None:
    calls = [Collective("reduce", 8, float(i), 10.0) for i in range(4)]
    assert summarise(calls, steps=3, world_size=2)[0]["count"] == 1.33
    # no steps found: counted over the whole trace
    assert summarise(calls, steps=0, world_size=2)[0]["count"] == 4
    assert summarise([], steps=3, world_size=2) == []


def _event(name: str, ts: float, dur: float, tid: object = 1, cat: str = "cpu_op", **args: object) -> Event:
    return Event(name, cat, ts, dur, tid, dict(args))


def test_backward_spans_cover_their_thread_from_start_to_end() -> None:
    spans = BackwardSpans([
        _event(BACKWARD, 300.0, 10.0),
        _event(BACKWARD, 100.0, 50.0),
        _event(BACKWARD, 120.0, 10.0),  # nested in the one before: ends first
        _event("aten::mm", 200.0, 50.0),
        _event(BACKWARD, 500.0, 10.0, tid=2),
    ])
    inside = [100.0, 125.0, 140.0, 150.0, 300.0, 310.0]
    outside = [99.0, 151.0, 200.0, 299.0, 311.0, 505.0]
    assert [spans.covers(1, ts) for ts in inside] == [True] * len(inside)
    assert [spans.covers(1, ts) for ts in outside] == [False] * len(outside)
    assert spans.covers(2, 505.0) and not spans.covers(2, 511.0) and not spans.covers(3, 120.0)


def test_gpu_activity_tells_kernels_apart_and_makes_calls() -> None:
    events = [
        _event("gemm", 0.0, 100.0, tid=0, cat="kernel", correlation=1),
        _event("Memcpy HtoD", 100.0, 10.0, tid=0, cat="gpu_memcpy", correlation=9),
        # NCCL-named kernels no nccl:* span launched: told by name (and "Collective name")
        _event("cudaLaunchKernel", 190.0, 5.0, tid=8, cat="cuda_runtime", correlation=2),
        _event("void ncclKernel_AllGather_RING_LL_Sum_float(ncclDevComm*)", 200.0, 50.0, tid=0,
               cat="kernel", correlation=2, **{"In msg nelems": 256, "dtype": "Float"}),
        _event("cudaGraphLaunch", 290.0, 5.0, tid=8, cat="cuda_runtime", correlation=3),
        _event("ncclDevKernel_Generic_4", 300.0, 40.0, tid=0, cat="kernel", correlation=3,
               **{"In msg nelems": 1000, "dtype": "BFloat16", "Collective name": "allreduce"}),
        # an all-reduce launched from backward whose kernels are not NCCL-named: two kernels, one call
        _event(BACKWARD, 390.0, 100.0, tid=7),
        _event("nccl:all_reduce", 400.0, 20.0, tid=7, **{"In msg nelems": 500, "dtype": "Float"}),
        _event("cudaLaunchKernel", 410.0, 2.0, tid=7, cat="cuda_runtime", correlation=4),
        _event("cudaLaunchKernel", 415.0, 2.0, tid=7, cat="cuda_runtime", correlation=5),
        _event("Memcpy DtoD (Device -> Device)", 500.0, 30.0, tid=0, cat="kernel", correlation=4),
        _event("Memcpy DtoD (Device -> Device)", 540.0, 20.0, tid=0, cat="kernel", correlation=5),
        # a broadcast that put nothing on the GPU
        _event("nccl:broadcast", 600.0, 5.0, tid=7, **{"In msg nelems": 10, "dtype": "Double"}),
        # launched after the broadcast ended: compute
        _event("cudaLaunchKernel", 700.0, 2.0, tid=7, cat="cuda_runtime", correlation=6),
        _event("gemm", 800.0, 60.0, tid=0, cat="kernel", correlation=6),
    ]
    trace = Trace("t.json", 0, 4, "h", "nccl", "as-is", events, has_gpu=True)
    compute, comm, calls = gpu_activity(trace)
    assert compute == [(0.0, 100.0), (800.0, 860.0)]
    assert sorted(comm) == [(200.0, 250.0), (300.0, 340.0), (500.0, 530.0), (540.0, 560.0)]
    assert calls == [
        Collective("all_gather", 1024, 200.0, 50.0, False),
        Collective("all_reduce", 2000, 300.0, 40.0, True),  # replayed from a CUDA graph: a bucket
        Collective("all_reduce", 2000, 500.0, 50.0, True),  # first kernel's start, both kernels' time
        Collective("broadcast", 80, 600.0, 0.0, False),
    ]


def test_gpu_activity_graph_less_named_kernel_outside_backward_is_no_bucket() -> None:
    events = [
        _event(BACKWARD, 0.0, 100.0, tid=7),
        _event("cudaLaunchKernel", 50.0, 2.0, tid=7, cat="cuda_runtime", correlation=1),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 60.0, 10.0, tid=0, cat="kernel", correlation=1),
        _event("cudaLaunchKernel", 150.0, 2.0, tid=7, cat="cuda_runtime", correlation=2),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 160.0, 10.0, tid=0, cat="kernel", correlation=2),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 260.0, 10.0, tid=0, cat="kernel", correlation=3),
    ]
    trace = Trace("t.json", 0, 2, "h", "nccl", "as-is", events, has_gpu=True)
    _, _, calls = gpu_activity(trace)
    assert [c.ddp_bucket for c in calls] == [True, False, False]
