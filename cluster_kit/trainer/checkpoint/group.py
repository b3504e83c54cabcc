"""The few collectives a checkpoint needs, and what they do without a process group.

Without ``torch.distributed`` initialized the process is alone: rank 0 of 1, and
every call here returns at once.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def active() -> bool:
    """Whether a process group of more than one rank is there."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_size() -> tuple[int, int]:
    """(rank, world size) of the process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    """Every rank waits for the others (nothing alone)."""
    if active():
        dist.barrier()


def broadcast_int(value: int) -> int:
    """Rank 0's ``value`` on every rank: on the GPU under NCCL, on the CPU otherwise."""
    if not active():
        return value
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.broadcast(tensor, src=0)
    return int(tensor.item())


def broadcast_object(value: Any) -> Any:
    """Rank 0's picklable ``value`` on every rank."""
    if not active():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
