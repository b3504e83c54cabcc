"""What to change, each with the figures behind it (pure: report dicts in, dicts out)."""
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


def gradient_bytes(rank: dict[str, Any]) -> int:
    """Bytes all-reduced per step (DDP's buckets together: the gradients)."""
    return int(sum(c["bytes"] * c["count"] for c in rank["collectives"] if c["op"] == "all_reduce"))


def buckets_per_step(rank: dict[str, Any]) -> float:
    return float(sum(c["count"] for c in rank["collectives"] if c["op"] == "all_reduce"))


def advise(ranks: list[dict[str, Any]], straggler: dict[str, Any] | None, gpu: bool,
           sweep: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every advice that applies, measured ones (from a sweep) first."""
    typical = _typical_rank(ranks)
    found = [a for a in (_from_sweep(sweep), _straggler(straggler), _buckets(typical),
                         _bucket_view(typical), _launch_bound(typical, gpu), _nccl(typical))
             if a is not None]
    return found


def _typical_rank(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The rank with the median step time."""
    ordered = sorted(ranks, key=lambda r: r["step_ms"]["mean"])
    return ordered[(len(ordered) - 1) // 2]


def _from_sweep(sweep: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    if not sweep:
        return None
    base = next((v for v in sweep if v["variant"] == "as-is" and v.get("step_ms")), None)
    best = min((v for v in sweep if v.get("step_ms")), key=lambda v: v["step_ms"], default=None)
    if base is None or best is None or best["variant"] == "as-is" or best["step_ms"] >= base["step_ms"]:
        return None
    knob, _, value = best["variant"].partition("=")
    return {"knob": knob, "value": _value(value or "true"),
            "why": f"measured: {best['variant']} steps in {best['step_ms']:.1f} ms against "
                   f"{base['step_ms']:.1f} ms as the job is ({best['gain_pct']:.0f} % faster)",
            "expected_ms": best["step_ms"]}


def _value(text: str) -> Any:
    if text in ("true", "on"):
        return True
    if text in ("false", "off"):
        return False
    try:
        return int(text)
    except ValueError:
        return text


def _straggler(straggler: dict[str, Any] | None) -> dict[str, Any] | None:
    if straggler is None:
        return None
    return {"knob": "straggler", "value": straggler["host"] or f"rank {straggler['rank']}",
            "why": f"rank {straggler['rank']} ({straggler['host']}) computes {straggler['compute_ms']:.1f} ms "
                   f"per step against a median of {straggler['median_compute_ms']:.1f} ms on the others, and "
                   "every rank waits for it in the all-reduce: check that node (clusterkit probe/audit: "
                   "clocks, throttling) and its input pipeline",
            "expected_ms": None}


def _buckets(rank: dict[str, Any]) -> dict[str, Any] | None:
    grad = gradient_bytes(rank)
    buckets = buckets_per_step(rank)
    step = rank["step_ms"]["mean"]
    exposed = rank["exposed_comm_ms"]
    if grad <= 0 or buckets <= 0:
        return None
    mean_bucket = grad / buckets
    if buckets >= 8 and mean_bucket < 4 * MB:
        target = 25 if grad > 25 * MB else max(1, math.ceil(grad / MB / 2))
        return {"knob": "bucket_cap_mb", "value": target,
                "why": f"{buckets:g} all-reduces per step of {mean_bucket / MB:.2f} MiB on average "
                       f"({grad / MB:.1f} MiB of gradients): small messages run below the fabric's "
                       "bandwidth; fewer, larger buckets cost less",
                "expected_ms": None}
    if exposed > EXPOSED_SHARE * step and buckets <= 2:
        target = max(1, math.ceil(grad / MB / 4))
        return {"knob": "bucket_cap_mb", "value": target,
                "why": f"{exposed:.1f} ms of {step:.1f} ms per step is exposed communication and the "
                       f"{grad / MB:.1f} MiB of gradients go in {buckets:g} bucket(s): smaller buckets "
                       "start all-reducing while backward still runs",
                "expected_ms": round(step - exposed * (1 - rank["overlap_pct"] / 100) / 2, 3)}
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
            "expected_ms": round(step - copies, 3)}


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
            "expected_ms": round(step - idle, 3)}


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
            "expected_ms": None}
