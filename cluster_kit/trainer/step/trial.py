"""What every rank decides alike: whether all captured (or compiled), and the keep-faster
trial, the plain eager step and the replayed graph timed on the example batch with the
slowest rank's figure deciding for all."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

TRIAL_WARMUP = 2  # untimed steps before each timed run of keep_faster's trial
TRIAL_STEPS = 5  # timed steps of each way; the same on every rank (eager steps all-reduce)


def time_ms(run: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds per call of ``run``: TRIAL_STEPS back to back, synchronized at both ends."""
    for _ in range(TRIAL_WARMUP):
        run()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(TRIAL_STEPS):
        run()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3 / TRIAL_STEPS


def slowest_rank(values: list[float], device: torch.device) -> list[float]:
    """Each value's maximum over the ranks, so that every rank decides alike."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's first line, cut to ``limit`` characters (compile errors run long)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def all_ranks_agree(ok: bool, device: torch.device) -> bool:
    """True only if every rank captured: ranks must all replay or all run eagerly."""
    if (
        not (dist.is_available() and dist.is_initialized())
        or dist.get_world_size() == 1
    ):
        return ok
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
