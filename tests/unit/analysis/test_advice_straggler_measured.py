"""The straggler, the measured advice and how `advise` puts them together, written out
whole: each figure worked out by hand from the ranks and sweep rows below."""
from __future__ import annotations

from typing import Any

from cluster_kit.analysis import advice


def computes(*ms: float) -> list[dict[str, Any]]:
    return [{"rank": r, "host": f"h{r}", "compute_ms": c} for r, c in enumerate(ms)]


def straggler_rank(ranks: list[dict[str, Any]]) -> int | None:
    found = advice.find_straggler(ranks)
    return None if found is None else found["rank"]


def test_the_straggler_and_the_median_of_the_others() -> None:
    assert advice.find_straggler(computes(10, 10, 25.5, 10)) == {
        "rank": 2, "host": "h2", "compute_ms": 25.5, "median_compute_ms": 10}
    # the median of the others rounded to 3 places
    assert advice.find_straggler(computes(10.12344, 10.12344, 10.12344, 20)) == {
        "rank": 3, "host": "h3", "compute_ms": 20, "median_compute_ms": 10.123}
    assert straggler_rank(computes(10, 20)) == 1  # two ranks: each against the other


def test_no_straggler_among_equals_or_alone() -> None:
    assert advice.find_straggler(computes(10, 10, 10, 10)) is None
    assert advice.find_straggler(computes(10)) is None
    assert advice.find_straggler([]) is None


def test_a_straggler_is_over_both_10_percent_and_1_ms() -> None:
    assert straggler_rank(computes(20, 20, 20, 22)) is None  # 10 % exactly (2 ms over)
    assert straggler_rank(computes(20, 20, 20, 22.01)) == 3
    assert straggler_rank(computes(2, 2, 2, 3)) is None  # 1 ms exactly (50 % over)
    assert straggler_rank(computes(2, 2, 2, 3.01)) == 3
    assert straggler_rank(computes(1, 1, 1, 1.5)) is None  # 50 % over, but 0.5 ms
    assert straggler_rank(computes(100, 100, 100, 105)) is None  # 5 ms over, but 5 %


def test_the_worst_straggler_by_its_excess_first_of_equals() -> None:
    assert straggler_rank(computes(10, 10, 10, 15, 20)) == 4  # 10 ms over beats 5 ms over
    assert straggler_rank(computes(10, 10, 10, 20, 15)) == 3
    assert straggler_rank(computes(10, 10, 10, 20, 20)) == 3  # equal: the first


STRAGGLER_WHY = ("computes 25.5 ms per step against a median of 10.0 ms on the others, and every rank waits "
                 "for it in the all-reduce: check that node (clusterkit probe/audit: clocks, throttling) and "
                 "its input pipeline")


def test_the_straggler_advice_names_its_node() -> None:
    found = {"rank": 2, "host": "h2", "compute_ms": 25.5, "median_compute_ms": 10.0}
    assert advice._straggler(found) == {"knob": "straggler", "value": "h2", "why": f"rank 2 (h2) {STRAGGLER_WHY}",
                                        "expected_ms": None, "measured": False}
    assert advice._straggler(None) is None


def test_a_straggler_without_a_host_is_named_by_its_rank() -> None:
    found = {"rank": 2, "host": "", "compute_ms": 25.5, "median_compute_ms": 10.0}
    assert advice._straggler(found) == {"knob": "straggler", "value": "rank 2", "why": f"rank 2 {STRAGGLER_WHY}",
                                        "expected_ms": None, "measured": False}


def test_what_a_variant_sets() -> None:
    assert advice.variant_knob("as-is") is None
    assert advice.variant_knob("") is None
    assert advice.variant_knob("bucket_cap_mb=5") == ("bucket_cap_mb", 5)
    assert advice.variant_knob("NCCL_ALGO=Ring") == ("NCCL_ALGO", "Ring")
    for text, value in [("gradient_as_bucket_view", True), ("static_graph=true", True), ("static_graph=on", True),
                        ("static_graph=false", False), ("static_graph=off", False)]:
        knob, got = advice.variant_knob(text)  # type: ignore[misc]
        assert (knob, got) == (text.partition("=")[0], value) and got is value, text
    assert advice.variant_knob("static_graph=0")[1] == 0  # type: ignore[index]
    assert advice.variant_knob("static_graph=TRUE") == ("static_graph", "TRUE")  # the words are lower case


def row(variant: str, step_ms: float | None) -> dict[str, Any]:
    return {"variant": variant, "step_ms": step_ms}


def measured(variant: str, knob: str, value: Any, step: float, base: float, gain: str) -> dict[str, Any]:
    return {"knob": knob, "value": value,
            "why": f"measured: {variant} steps in {step:.2f} ms against {base:.2f} ms as the job is ({gain} % faster)",
            "expected_ms": step, "measured": True}


def test_measured_advice_fastest_first_one_per_knob() -> None:
    sweep = [row("as-is", 100.0), row("bucket_cap_mb=1", None), row("static_graph", 90.0),
             row("bucket_cap_mb=10", 85.0), row("bucket_cap_mb=5", 40.0), row("bucket_cap_mb=25", 40.0)]
    assert advice.measured_advice(sweep) == [
        measured("bucket_cap_mb=5", "bucket_cap_mb", 5, 40.0, 100.0, "60"),
        measured("static_graph", "static_graph", True, 90.0, 100.0, "10")]


def test_measured_advice_needs_the_job_as_it_is() -> None:
    assert advice.measured_advice([row("bucket_cap_mb=5", 40.0)]) == []
    assert advice.measured_advice([row("as-is", None), row("bucket_cap_mb=5", 40.0)]) == []
    assert advice.measured_advice([]) == []


def test_measured_advice_beats_the_job_by_more_than_2_percent() -> None:
    assert advice.measured_advice([row("as-is", 100.0), row("static_graph", 98.0)]) == []
    assert advice.measured_advice([row("as-is", 100.0), row("static_graph", 98.01)]) == []
    assert advice.measured_advice([row("static_graph", 97.99), row("as-is", 100.0)]) == [
        measured("static_graph", "static_graph", True, 97.99, 100.0, "2")]


def rank(step: float, **fields: Any) -> dict[str, Any]:
    return {"rank": 0, "host": "h", "compute_ms": 50.0, "step_ms": {"mean": step}, "other_ms": 0.0,
            "exposed_comm_ms": 0.0, "collectives": [], **fields}


BUCKET_VIEW = {"knob": "gradient_as_bucket_view", "value": True,
               "why": "DDP copies buckets back into .grad for 5.00 ms per step (5.0 % of 100.0 ms); "
                      "gradient_as_bucket_view=True makes the gradients views of the buckets",
               "expected_ms": 95.0, "measured": False}
LAUNCH_BOUND = {"knob": "cuda_graphs", "value": True,
                "why": "the GPU is idle 40.00 ms of each 100.00 ms step between 200 kernels: the step is "
                       "launch-bound; replaying it from a CUDA graph (cuda_graphs: true, "
                       "cluster_kit.ddp.build_step) launches it at once",
                "expected_ms": 60.0, "measured": False}


def ranks_around_the_median() -> list[dict[str, Any]]:
    """Only the rank of the median step (100 ms, of 90, 100 and 110) gives estimates."""
    return [rank(110.0), rank(90.0), rank(100.0, other_ms=40.0, bucket_copy_ms=5.0, kernels_per_step=200.0)]


def test_advise_reads_the_rank_of_the_median_step() -> None:
    assert advice.advise(ranks_around_the_median(), None, gpu=True) == [BUCKET_VIEW, LAUNCH_BOUND]
    five = [rank(90.0), rank(95.0), rank(100.0, bucket_copy_ms=5.0), rank(110.0), rank(120.0)]
    assert advice.advise(five, None, gpu=False) == [BUCKET_VIEW]
    two = [rank(110.0), rank(100.0, bucket_copy_ms=5.0)]  # even: the lower of the two middle ones
    assert advice.advise(two, None, gpu=False) == [BUCKET_VIEW]


def test_advise_measured_then_straggler_then_estimates_of_knobs_not_swept() -> None:
    straggler = {"rank": 2, "host": "h2", "compute_ms": 25.5, "median_compute_ms": 10.0}
    sweep = [row("as-is", 100.0), row("bucket_cap_mb=5", 80.0), row("cuda_graphs", 120.0)]
    assert advice.advise(ranks_around_the_median(), straggler, gpu=True, sweep=sweep) == [
        measured("bucket_cap_mb=5", "bucket_cap_mb", 5, 80.0, 100.0, "20"),
        {"knob": "straggler", "value": "h2", "why": f"rank 2 (h2) {STRAGGLER_WHY}", "expected_ms": None,
         "measured": False},
        BUCKET_VIEW]  # cuda_graphs was swept (and slower): its estimate is left out
