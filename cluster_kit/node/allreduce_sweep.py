"""All-reduce bandwidth sweep, run on every rank of a job (srun or torchrun).

Standalone: stdlib and torch only, no clusterkit imports, because the job script
embeds it and runs it on nodes where clusterkit is not installed. It reads RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the environment.

For each size from ``--min-bytes`` to ``--max-bytes`` (doubling, float32) it
  1. fills the buffer with a rank-dependent pattern, all-reduces it once and
     compares every element with the exact expected sum (integers below 2**24, so
     float32 sums are exact in any order); a mismatch on any rank stops every rank
     with exit status 1;
  2. runs warm-up then timed all-reduces back to back (CUDA events on a GPU) and
     reports the mean time per all-reduce.

Bandwidths follow nccl-tests' definitions for all-reduce (GB/s = 1e9 bytes/s):
``algbw = bytes / time`` and ``busbw = algbw * 2 * (n - 1) / n``. With one rank
busbw is 0 by that formula: nothing crosses a link.

Rank 0 prints one line per size, ``CLUSTERKIT_ALLREDUCE {json}``, as soon as the
size is done (so a killed job keeps what it measured), then a table for people.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

MARKER = "CLUSTERKIT_ALLREDUCE "
# Test hook (the dev cluster's `bench allreduce --find-slow` test): on the host named by
# $CLUSTERKIT_SWEEP_SLOW_HOST every timed all-reduce waits $CLUSTERKIT_SWEEP_SLOW_S seconds
# first (default 0.01), as a node with a slow link would hold up every rank.
SLOW_HOST_ENV = "CLUSTERKIT_SWEEP_SLOW_HOST"
SLOW_SECONDS_ENV = "CLUSTERKIT_SWEEP_SLOW_S"
PERIOD = 17  # pattern period; 17 * world_size stays far below 2**24
DTYPE = torch.float32
ELEMENT_BYTES = 4
GPU_MAX_BYTES = 4 << 30
CPU_MAX_BYTES = 64 << 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; GPU or CPU decides the defaults left as None."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["nccl", "gloo"], help="default: nccl on GPU")
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, help="default: 4 GiB on GPU, 64 MiB on CPU")
    p.add_argument("--warmup", type=int, help="default: 5 on GPU, 1 on CPU")
    p.add_argument("--iters", type=int, help="default: 20 on GPU, 5 on CPU")
    p.add_argument(
        "--corrupt-rank",
        type=int,
        default=-1,
        help=argparse.SUPPRESS,  # test hook: this rank spoils its result to prove the check
    )
    return p.parse_args(argv)


def sweep_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Message sizes in bytes: min_bytes doubling up to max_bytes, whole floats only."""
    size = max(ELEMENT_BYTES, min_bytes - min_bytes % ELEMENT_BYTES)
    sizes = []
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def bandwidths(nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one all-reduce, as nccl-tests defines them."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * 2 * (world_size - 1) / world_size


def rank_pattern(rank: int, device: torch.device) -> torch.Tensor:
    """The PERIOD values rank ``rank`` contributes: ((j + rank) mod PERIOD) + 1."""
    j = torch.arange(PERIOD, dtype=torch.int64)
    return ((j + rank) % PERIOD + 1).to(device=device, dtype=DTYPE)


def expected_pattern(world_size: int, device: torch.device) -> torch.Tensor:
    """The exact sum over all ranks of :func:`rank_pattern`, per position."""
    total = torch.zeros(PERIOD, dtype=torch.int64)
    for rank in range(world_size):
        total += rank_pattern(rank, torch.device("cpu")).to(torch.int64)
    return total.to(device=device, dtype=DTYPE)


def fill_periodic(buf: torch.Tensor, period_values: torch.Tensor) -> None:
    """Write ``period_values`` repeated over ``buf`` without a full-size temporary."""
    whole = buf.numel() - buf.numel() % PERIOD
    if whole:
        buf[:whole].view(-1, PERIOD).copy_(
            period_values.expand(whole // PERIOD, PERIOD)
        )
    tail = buf.numel() - whole
    if tail:
        buf[whole:].copy_(period_values[:tail])


def count_mismatches(buf: torch.Tensor, expected: torch.Tensor) -> int:
    """Elements of ``buf`` that differ from ``expected`` repeated."""
    whole = buf.numel() - buf.numel() % PERIOD
    bad = 0
    if whole:
        bad += int((buf[:whole].view(-1, PERIOD) != expected).sum().item())
    tail = buf.numel() - whole
    if tail:
        bad += int((buf[whole:] != expected[:tail]).sum().item())
    return bad


def check_once(buf: torch.Tensor, rank: int, world: int, corrupt_rank: int) -> int:
    """One verified all-reduce; returns this rank's count of wrong elements."""
    fill_periodic(buf, rank_pattern(rank, buf.device))
    dist.all_reduce(buf)
    if rank == corrupt_rank:
        buf[buf.numel() // 2] += 1.0
    return count_mismatches(buf, expected_pattern(world, buf.device))


def worst_across_ranks(value: int, device: torch.device) -> int:
    """The largest ``value`` over all ranks, so that every rank takes the same exit."""
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def planted_delay() -> float:
    """Seconds this host waits before each timed all-reduce (0 unless the test hook names it)."""
    slow = os.environ.get(SLOW_HOST_ENV, "")
    if not slow or slow not in (os.uname().nodename, os.uname().nodename.split(".")[0]):
        return 0.0
    return float(os.environ.get(SLOW_SECONDS_ENV, "0.01"))


def time_allreduce(buf: torch.Tensor, warmup: int, iters: int, delay: float = 0.0) -> float:
    """Mean seconds per all-reduce over ``iters`` back-to-back calls.

    The buffer's values grow by the world size each call (and may reach inf);
    that changes nothing in what the all-reduce costs.
    """
    for _ in range(warmup):
        dist.all_reduce(buf)
    dist.barrier()
    if buf.is_cuda:
        return _time_cuda(buf, iters, delay)
    start = time.perf_counter()
    for _ in range(iters):
        if delay:
            time.sleep(delay)
        dist.all_reduce(buf)
    return (time.perf_counter() - start) / iters


def _time_cuda(buf: torch.Tensor, iters: int, delay: float = 0.0) -> float:
    torch.cuda.synchronize(buf.device)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        if delay:
            time.sleep(delay)
        dist.all_reduce(buf)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def measure_size(
    nbytes: int, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """Check then time one message size; returns its result row."""
    rank, world = dist.get_rank(), dist.get_world_size()
    buf = torch.empty(nbytes // ELEMENT_BYTES, dtype=DTYPE, device=device)
    wrong = worst_across_ranks(check_once(buf, rank, world, args.corrupt_rank), device)
    seconds = time_allreduce(buf, args.warmup, args.iters, planted_delay())
    algbw, busbw = bandwidths(nbytes, seconds, world)
    return {
        "kind": "result",
        "bytes": nbytes,
        "count": buf.numel(),
        "dtype": "float32",
        "world_size": world,
        "backend": dist.get_backend(),
        "warmup": args.warmup,
        "iters": args.iters,
        "time_us": round(seconds * 1e6, 3),
        "algbw_gbps": round(algbw, 6),
        "busbw_gbps": round(busbw, 6),
        "check": "ok" if wrong == 0 else "mismatch",
        "wrong_elements_max_rank": wrong,
    }


def environment_facts(device: torch.device) -> dict[str, Any]:
    """What the sweep ran on, for the log's first marker line."""
    facts: dict[str, Any] = {
        "kind": "meta",
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "torch": torch.__version__,
        "host": os.uname().nodename,
    }
    if device.type == "cuda":
        facts["cuda"] = torch.version.cuda
        facts["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        facts["device_name"] = torch.cuda.get_device_name(device)
    return facts


def format_size(nbytes: int) -> str:
    """1024-based size with its unit: 8 B, 64 KiB, 4 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}"
        nbytes //= 1024
    return f"{nbytes} B"


def format_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table of the result rows, for people reading the job log."""
    lines = [
        f"{'size':>10} {'count':>12} {'time_us':>12} {'algbw GB/s':>11} {'busbw GB/s':>11} check"
    ]
    for r in rows:
        lines.append(
            f"{format_size(r['bytes']):>10} {r['count']:>12} {r['time_us']:>12.2f} "
            f"{r['algbw_gbps']:>11.2f} {r['busbw_gbps']:>11.2f} {r['check']}"
        )
    return "\n".join(lines)


def init_distributed(backend: str | None) -> torch.device:
    """Start the process group from the environment; returns this rank's device."""
    use_gpu = torch.cuda.is_available() and backend != "gloo"
    if use_gpu:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        try:
            dist.init_process_group(backend or "nccl", device_id=device)
        except TypeError:  # torch < 2.3 has no device_id
            dist.init_process_group(backend or "nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend or "gloo")
    return device


def apply_defaults(args: argparse.Namespace, device: torch.device) -> None:
    """Fill the options whose default depends on GPU or CPU."""
    gpu = device.type == "cuda"
    if args.max_bytes is None:
        args.max_bytes = GPU_MAX_BYTES if gpu else CPU_MAX_BYTES
    if args.warmup is None:
        args.warmup = 5 if gpu else 1
    if args.iters is None:
        args.iters = 20 if gpu else 5


def emit(record: dict[str, Any]) -> None:
    """One marker line for the log parser."""
    print(MARKER + json.dumps(record, sort_keys=True), flush=True)


def run_sweep(args: argparse.Namespace, device: torch.device) -> int:
    """Measure every size; returns the exit status (1 on a wrong result)."""
    rank = dist.get_rank()
    if rank == 0:
        emit(environment_facts(device))
    rows = []
    for nbytes in sweep_sizes(args.min_bytes, args.max_bytes):
        row = measure_size(nbytes, args, device)
        rows.append(row)
        if rank == 0:
            emit(row)
        if row["check"] != "ok":
            print(
                f"CLUSTERKIT_ALLREDUCE_ERROR rank {rank}: all-reduce of {nbytes} bytes gave "
                f"a wrong sum ({row['wrong_elements_max_rank']} wrong elements on the worst "
                "rank); suspect the GPU, NVLink/PCIe or the network of this job's nodes",
                file=sys.stderr,
                flush=True,
            )
            return 1
    if rank == 0:
        print(format_table(rows), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point on every rank."""
    args = parse_args(argv)
    device = init_distributed(args.backend)
    apply_defaults(args, device)
    try:
        return run_sweep(args, device)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
