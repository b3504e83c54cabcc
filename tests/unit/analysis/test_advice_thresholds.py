"""The non-measured advice at its thresholds: on one side advice, on the other none."""
from __future__ import annotations

from typing import Any

from cluster_kit.analysis import advice

MB = 1 << 20


def rank(step: float = 100.0, **fields: Any) -> dict[str, Any]:
    return {"step_ms": {"mean": step}, "other_ms": 0.0, "exposed_comm_ms": 0.0, "collectives": [], **fields}


def buckets(count: float, nbytes: int) -> list[dict[str, Any]]:
    return [{"op": "all_reduce", "bytes": nbytes, "count": count, "ddp_bucket": True},
            {"op": "all_reduce", "bytes": 1000 * MB, "count": 1, "ddp_bucket": False}]  # the job's own


def test_launch_bound_from_30_percent_idle() -> None:
    found = advice._launch_bound(rank(10.0, other_ms=3.0, kernels_per_step=120.0), gpu=True)
    assert found == {"knob": "cuda_graphs", "value": True,
                     "why": "the GPU is idle 3.00 ms of each 10.00 ms step between 120 kernels: the step is "
                            "launch-bound; replaying it from a CUDA graph (cuda_graphs: true, "
                            "cluster_kit.ddp.build_step) launches it at once",
                     "expected_ms": 7.0, "measured": False}
    assert advice._launch_bound(rank(10.0, other_ms=2.99), gpu=True) is None
    assert advice._launch_bound(rank(10.0, other_ms=3.0), gpu=False) is None  # no GPU: nothing launched
    assert advice._launch_bound(rank(10.0, other_ms=3.0, graph_launches_per_step=1), gpu=True) is None
    assert advice._launch_bound(rank(0.0, other_ms=3.0), gpu=True) is None
    assert advice._launch_bound(rank(10.0, other_ms=3.0), gpu=True)["why"].count(" 0 kernels") == 1


def call(busbw: float, sweep: float | None, nbytes: int = MB, op: str = "all_reduce") -> dict[str, Any]:
    return {"op": op, "bytes": nbytes, "count": 1, "busbw_gbps": busbw, "sweep_busbw_gbps": sweep}


def test_nccl_below_half_the_sweep_from_one_mib() -> None:
    assert advice._nccl(rank(collectives=[call(4.99, 10.0)])) == {
        "knob": "nccl", "value": "check NCCL_IB_HCA / NCCL_SOCKET_IFNAME / NCCL_ALGO",
        "why": "all_reduce of 1.0 MiB reaches 5.0 GB/s busbw in the step against 10.0 GB/s in bench "
               "allreduce at that size: the collectives are slower than the fabric allows",
        "expected_ms": None, "measured": False}
    assert advice._nccl(rank(collectives=[call(5.0, 10.0)])) is None  # half: not below it
    assert advice._nccl(rank(collectives=[call(1.0, 10.0, nbytes=MB - 1)])) is None  # small: latency-bound
    assert advice._nccl(rank(collectives=[call(1.0, None), call(1.0, 0.0)])) is None  # no sweep to go by
    # the worst is the lowest share of the sweep, not the lowest GB/s
    worst = advice._nccl(rank(collectives=[call(1.5, 4.0, op="broadcast"), call(2.0, 10.0, 3 * MB, "all_gather"),
                                           call(40.0, 100.0)]))
    assert worst is not None and worst["why"].startswith("all_gather of 3.0 MiB reaches 2.0 GB/s busbw")


def test_buckets_many_small_ones() -> None:
    # 8 buckets of 3 MiB: half the 24 MiB of gradients a bucket
    found = advice._buckets(rank(collectives=buckets(8, 3 * MB)))
    assert found == {"knob": "bucket_cap_mb", "value": 12,
                     "why": "DDP all-reduces 8 gradient buckets per step of 3.00 MiB on average (24.0 MiB of "
                            "gradients): small messages run below the fabric's bandwidth; fewer, larger "
                            "buckets cost less",
                     "expected_ms": None, "measured": False}
    assert advice._buckets(rank(collectives=buckets(7, 3 * MB))) is None
    assert advice._buckets(rank(collectives=buckets(8, 4 * MB))) is None  # 4 MiB is not small
    # over DDP's 25 MiB default: its default; 25 MiB exactly: half of it, rounded up
    assert advice._buckets(rank(collectives=buckets(10, 3 * MB)))["value"] == 25
    assert advice._buckets(rank(collectives=buckets(25, MB)))["value"] == 13
    assert advice._buckets(rank(collectives=buckets(8, MB // 8)))["value"] == 1
    assert advice._buckets(rank(collectives=[])) is None


def test_buckets_one_or_two_exposed() -> None:
    exposed = rank(exposed_bucket_ms=10.5, exposed_comm_ms=0.0, collectives=buckets(1, 100 * MB))
    assert advice._buckets(exposed) == {
        "knob": "bucket_cap_mb", "value": 25,
        "why": "10.5 ms of 100.0 ms per step is DDP's bucket all-reduce not overlapped by compute, and the "
               "100.0 MiB of gradients go in 1 bucket(s): smaller buckets start all-reducing while "
               "backward still runs",
        "expected_ms": 94.75, "measured": False}
    # no bucket figure: the exposed communication; 10 % of the step exactly is not over it
    assert advice._buckets(rank(exposed_comm_ms=10.5, collectives=buckets(2, 50 * MB)))["value"] == 25
    assert advice._buckets(rank(exposed_bucket_ms=10.0, collectives=buckets(1, 100 * MB))) is None
    assert advice._buckets(rank(exposed_bucket_ms=50.0, collectives=buckets(3, 30 * MB))) is None
    # a quarter of the gradients, rounded up, must be smaller than they are
    assert advice._buckets(rank(exposed_bucket_ms=50.0, collectives=buckets(1, 3 * MB)))["value"] == 1
    assert advice._buckets(rank(exposed_bucket_ms=50.0, collectives=buckets(1, MB))) is None
