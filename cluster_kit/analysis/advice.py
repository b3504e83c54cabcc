"""What to change, each with the figures behind it (pure: report dicts in, dicts out).

Two kinds of advice: measured (a ``--sweep`` variant ran and stepped faster than
the job as it is: ``expected_ms`` is its measured step) and estimated (read from
the job's own trace). A knob the sweep tried is advised from its measurements
alone: its best variant when that one beat the job as it is by more than the
noise, else nothing; the trace's estimate for that knob is dropped, so advice
never contradicts the sweep table beside it.
"""
from __future__ import annotations

import math
import statistics
from typing import Any

MB = 1 << 20
DDP_DEFAULT_BUCKET_MB = 25
STRAGGLER_RATIO = 1.10
STRAGGLER_MIN_MS = 1.0
EXPOSED_SHARE = 0.10  # exposed communication worth acting on: 10 % of the step
LAUNCH_BOUND_IDLE = 0.30  # a GPU idle this much of a step waits for the CPU's launches
SLOW_BUSBW_RATIO = 0.5  # achieved below half the sweep's busbw at that size
MEASURED_MIN_GAIN_PCT = 2.0  # a variant closer than this to the job as it is is noise, not advice
BASE_VARIANT = "as-is"


def find_straggler(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The rank whose compute exceeds the median of the others' by > 10 % and > 1 ms."""
    worst: dict[str, Any] | None = None
    for rank in ranks:
        others = [r["compute_ms"] for r in ranks if r is not rank]
        if not others:
            continue
        median = statistics.median(others)
        excess = rank["compute_ms"] - median
        slow = rank["compute_ms"] > median * STRAGGLER_RATIO and excess > STRAGGLER_MIN_MS
        if slow and (worst is None or excess > worst["compute_ms"] - worst["median_compute_ms"]):
            worst = {"rank": rank["rank"], "host": rank["host"], "compute_ms": rank["compute_ms"],
                     "median_compute_ms": round(median, 3)}
    return worst


def bucket_rows(rank: dict[str, Any]) -> list[dict[str, Any]]:
    """The rank's collectives that are DDP's gradient buckets (not the job's own calls)."""
    return [c for c in rank["collectives"] if c.get("ddp_bucket")]


def gradient_bytes(rank: dict[str, Any]) -> int:
    """Bytes all-reduced per step in DDP's buckets: the gradients."""
    return int(sum(c["bytes"] * c["count"] for c in bucket_rows(rank)))


def buckets_per_step(rank: dict[str, Any]) -> float:
    """DDP's gradient buckets per step (the job's own all-reduces are not among them)."""
    return float(sum(c["count"] for c in bucket_rows(rank)))


def advise(ranks: list[dict[str, Any]], straggler: dict[str, Any] | None, gpu: bool,
           sweep: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every advice that applies: measured ones (from a sweep) first, fastest first.

    The trace's estimate for a knob the sweep tried is left out (the measurement
    stands for that knob, whatever it found).
    """
    typical = _typical_rank(ranks)
    swept = swept_knobs(sweep or [])
    estimated = [a for a in (_buckets(typical), _bucket_view(typical), _launch_bound(typical, gpu), _nccl(typical))
                 if a is not None and a["knob"] not in swept]
    return measured_advice(sweep or []) + [a for a in [_straggler(straggler)] if a] + estimated


def _typical_rank(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The rank with the median step time."""
    ordered = sorted(ranks, key=lambda r: r["step_ms"]["mean"])
    return ordered[(len(ordered) - 1) // 2]


def variant_knob(variant: str) -> tuple[str, Any] | None:
    """(knob, value) a sweep variant sets: ``bucket_cap_mb=5`` -> ("bucket_cap_mb", 5); as-is -> None."""
    if variant in (BASE_VARIANT, ""):
        return None
    knob, _, value = variant.partition("=")
    return knob, _value(value or "true")


def swept_knobs(sweep: list[dict[str, Any]]) -> set[str]:
    """The knobs the sweep tried, whether their launches ran or failed."""
    return {k[0] for k in (variant_knob(v["variant"]) for v in sweep) if k is not None}


def measured_advice(sweep: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per knob, its fastest measured variant when it beat the job as it is; fastest first."""
    base = next((v for v in sweep if v["variant"] == BASE_VARIANT and v.get("step_ms")), None)
    if base is None:
        return []
    best: dict[str, dict[str, Any]] = {}
    for row in sweep:
        knob = variant_knob(row["variant"])
        if knob is None or not row.get("step_ms"):
            continue
        if knob[0] not in best or row["step_ms"] < best[knob[0]]["step_ms"]:
            best[knob[0]] = row
    gain = 1 - MEASURED_MIN_GAIN_PCT / 100
    faster = sorted((r for r in best.values() if r["step_ms"] < base["step_ms"] * gain), key=lambda r: r["step_ms"])
    return [_measured(row, base) for row in faster]


def _measured(row: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    knob, value = variant_knob(row["variant"]) or ("", None)
    gain = 100 * (base["step_ms"] - row["step_ms"]) / base["step_ms"]
    return {"knob": knob, "value": value,
            "why": f"measured: {row['variant']} steps in {row['step_ms']:.2f} ms against "
                   f"{base['step_ms']:.2f} ms as the job is ({gain:.0f} % faster)",
            "expected_ms": row["step_ms"], "measured": True}


def _value(text: str) -> Any:
    if text in ("true", "on"):
        return True
    if text in ("false", "off"):
        return False
    try:
        return int(text)
    except ValueError:
        return text


def rank_on_host(straggler: dict[str, Any]) -> str:
    """"rank 2 (node7)", or "rank 2" for a trace that names no host."""
    host = straggler["host"]
    return f"rank {straggler['rank']} ({host})" if host else f"rank {straggler['rank']}"


def _straggler(straggler: dict[str, Any] | None) -> dict[str, Any] | None:
    if straggler is None:
        return None
    return {"knob": "straggler", "value": straggler["host"] or f"rank {straggler['rank']}",
            "why": f"{rank_on_host(straggler)} computes {straggler['compute_ms']:.1f} ms "
                   f"per step against a median of {straggler['median_compute_ms']:.1f} ms on the others, and "
                   "every rank waits for it in the all-reduce: check that node (clusterkit probe/audit: "
                   "clocks, throttling) and its input pipeline",
            "expected_ms": None, "measured": False}


def _buckets(rank: dict[str, Any]) -> dict[str, Any] | None:
    """bucket_cap_mb from DDP's buckets alone: many small ones, or one or two exposed."""
    grad = gradient_bytes(rank)
    buckets = buckets_per_step(rank)
    step = rank["step_ms"]["mean"]
    exposed = float(rank.get("exposed_bucket_ms", rank["exposed_comm_ms"]))
    if grad <= 0 or buckets <= 0:
        return None
    mean_bucket = grad / buckets
    if buckets >= 8 and mean_bucket < 4 * MB:
        target = 25 if grad > 25 * MB else max(1, math.ceil(grad / MB / 2))
        return {"knob": "bucket_cap_mb", "value": target,
                "why": f"DDP all-reduces {buckets:g} gradient buckets per step of {mean_bucket / MB:.2f} MiB "
                       f"on average ({grad / MB:.1f} MiB of gradients): small messages run below the "
                       "fabric's bandwidth; fewer, larger buckets cost less",
                "expected_ms": None, "measured": False}
    target = max(1, math.ceil(grad / MB / 4))
    if exposed > EXPOSED_SHARE * step and buckets <= 2 and target * MB < grad:
        return {"knob": "bucket_cap_mb", "value": target,
                "why": f"{exposed:.1f} ms of {step:.1f} ms per step is DDP's bucket all-reduce not "
                       f"overlapped by compute, and the {grad / MB:.1f} MiB of gradients go in {buckets:g} "
                       "bucket(s): smaller buckets start all-reducing while backward still runs",
                "expected_ms": round(step - exposed / 2, 3), "measured": False}
    return None


def _bucket_view(rank: dict[str, Any]) -> dict[str, Any] | None:
    copies = float(rank.get("bucket_copy_ms", 0.0))
    step = rank["step_ms"]["mean"]
    if copies <= 0.01 * step:
        return None
    return {"knob": "gradient_as_bucket_view", "value": True,
            "why": f"DDP copies buckets back into .grad for {copies:.2f} ms per step "
                   f"({100 * copies / step:.1f} % of {step:.1f} ms); gradient_as_bucket_view=True "
                   "makes the gradients views of the buckets",
            "expected_ms": round(step - copies, 3), "measured": False}


def _launch_bound(rank: dict[str, Any], gpu: bool) -> dict[str, Any] | None:
    step = rank["step_ms"]["mean"]
    idle = rank["other_ms"]
    kernels = rank.get("kernels_per_step", 0.0)
    if not gpu or step <= 0 or idle < LAUNCH_BOUND_IDLE * step or rank.get("graph_launches_per_step"):
        return None
    return {"knob": "cuda_graphs", "value": True,
            "why": f"the GPU is idle {idle:.2f} ms of each {step:.2f} ms step between {kernels:.0f} "
                   "kernels: the step is launch-bound; replaying it from a CUDA graph "
                   "(cuda_graphs: true, cluster_kit.ddp.build_step) launches it at once",
            "expected_ms": round(step - idle, 3), "measured": False}


def _nccl(rank: dict[str, Any]) -> dict[str, Any] | None:
    slow = [c for c in rank["collectives"] if c.get("sweep_busbw_gbps")
            and c["busbw_gbps"] < SLOW_BUSBW_RATIO * c["sweep_busbw_gbps"] and c["bytes"] >= MB]
    if not slow:
        return None
    worst = min(slow, key=lambda c: c["busbw_gbps"] / c["sweep_busbw_gbps"])
    return {"knob": "nccl", "value": "check NCCL_IB_HCA / NCCL_SOCKET_IFNAME / NCCL_ALGO",
            "why": f"{worst['op']} of {worst['bytes'] / MB:.1f} MiB reaches {worst['busbw_gbps']:.1f} GB/s "
                   f"busbw in the step against {worst['sweep_busbw_gbps']:.1f} GB/s in bench allreduce "
                   "at that size: the collectives are slower than the fabric allows",
            "expected_ms": None, "measured": False}
