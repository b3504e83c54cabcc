"""The estimated advice at the edges test_advice_thresholds.py leaves: buckets of unknown size,
gradients just over DDP's 25 MiB, steps under a millisecond, and the rounding of expected_ms."""
from __future__ import annotations

from typing import Any

from cluster_kit.analysis import advice

MB = 1 << 20


def rank(step: float = 100.0, **fields: Any) -> dict[str, Any]:
    return {"step_ms": {"mean": step}, "other_ms": 0.0, "exposed_comm_ms": 0.0, "collectives": [], **fields}


def bucket(nbytes: int, count: float) -> dict[str, Any]:
    return {"op": "all_reduce", "bytes": nbytes, "count": count, "ddp_bucket": True}


def test_buckets_of_unknown_size_advise_nothing() -> None:
    # 8 buckets a step whose sizes the trace did not give (0 bytes): no gradients to size them by
    assert advice._buckets(rank(collectives=[bucket(0, 8)])) is None
    assert advice._buckets(rank(exposed_bucket_ms=50.0, collectives=[bucket(0, 1)])) is None


def test_one_byte_of_gradients_in_eight_buckets_is_small() -> None:
    found = advice._buckets(rank(collectives=[bucket(0, 7), bucket(1, 1)]))
    assert found == {"knob": "bucket_cap_mb", "value": 1,
                     "why": "DDP all-reduces 8 gradient buckets per step of 0.00 MiB on average (0.0 MiB of "
                            "gradients): small messages run below the fabric's bandwidth; fewer, larger "
                            "buckets cost less",
                     "expected_ms": None, "measured": False}


def test_just_over_25_mib_of_gradients_keep_ddps_default() -> None:
    assert advice._buckets(rank(collectives=[bucket(2 * MB, 13)]))["value"] == 25  # type: ignore[index]  # 26 MiB


def test_exposed_buckets_expected_step_to_three_places() -> None:
    found = advice._buckets(rank(exposed_bucket_ms=10.1234, collectives=[bucket(100 * MB, 1)]))
    assert found is not None and found["expected_ms"] == 94.938  # 100 - 10.1234 / 2


def test_launch_bound_under_a_millisecond_and_its_rounding() -> None:
    assert advice._launch_bound(rank(0.5, other_ms=0.2), gpu=True)["expected_ms"] == 0.3  # type: ignore[index]
    found = advice._launch_bound(rank(10.0, other_ms=3.1234, kernels_per_step=9.0), gpu=True)
    assert found is not None and found["expected_ms"] == 6.877
    assert found["why"].startswith("the GPU is idle 3.12 ms of each 10.00 ms step between 9 kernels")
