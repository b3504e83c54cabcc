"""DDP's gradient buckets as advice reads them (the rows, their bytes and count) and the
gradient_as_bucket_view advice from the time DDP spends copying buckets back, at 1 % of the step."""
from __future__ import annotations

from typing import Any

from cluster_kit.analysis import advice

MB = 1 << 20


def rank(step: float = 100.0, **fields: Any) -> dict[str, Any]:
    return {"step_ms": {"mean": step}, "other_ms": 0.0, "exposed_comm_ms": 0.0, "collectives": [], **fields}


COLLECTIVES = [
    {"op": "all_reduce", "bytes": 3 * MB, "count": 2, "ddp_bucket": True},
    {"op": "all_reduce", "bytes": 4, "count": 1},  # the job's own (no mark)
    {"op": "all_reduce", "bytes": MB, "count": 1.5, "ddp_bucket": True},  # in 2 steps of 3
    {"op": "broadcast", "bytes": 8 * MB, "count": 1, "ddp_bucket": False},
]


def test_the_buckets_are_the_rows_marked_as_ddps() -> None:
    assert advice.bucket_rows(rank(collectives=COLLECTIVES)) == [COLLECTIVES[0], COLLECTIVES[2]]
    assert advice.bucket_rows(rank()) == []


def test_gradient_bytes_are_each_buckets_bytes_times_its_count() -> None:
    assert advice.gradient_bytes(rank(collectives=COLLECTIVES)) == 6 * MB + 3 * MB // 2
    assert advice.buckets_per_step(rank(collectives=COLLECTIVES)) == 3.5
    # a fraction of a byte per step is dropped
    assert advice.gradient_bytes(rank(collectives=[{"bytes": 3, "count": 0.5, "ddp_bucket": True}])) == 1
    assert advice.gradient_bytes(rank()) == 0


def test_bucket_view_from_copies_over_1_percent_of_the_step() -> None:
    assert advice._bucket_view(rank(100.0, bucket_copy_ms=10.1234)) == {
        "knob": "gradient_as_bucket_view", "value": True,
        "why": "DDP copies buckets back into .grad for 10.12 ms per step (10.1 % of 100.0 ms); "
               "gradient_as_bucket_view=True makes the gradients views of the buckets",
        "expected_ms": 89.877, "measured": False}
    assert advice._bucket_view(rank(200.0, bucket_copy_ms=2.0)) is None  # 1 % exactly
    assert advice._bucket_view(rank(200.0, bucket_copy_ms=2.01))["expected_ms"] == 197.99  # type: ignore[index]
    assert advice._bucket_view(rank(50.0)) is None  # no copies measured (a graphed or CPU step)
    assert advice._bucket_view(rank(50.0, bucket_copy_ms=0.0)) is None
