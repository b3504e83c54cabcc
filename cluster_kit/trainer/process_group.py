"""The process group and DDP as a graphed step needs them (PyTorch's CUDA graphs notes).

DDP is built on a side stream (:func:`wrap_ddp`), the one per GPU that warm-up and
capture use too (:func:`capture_stream`), and DDP's async NCCL error handling is off
before the process group starts (:func:`prepare_process_group_env`).
"""
from __future__ import annotations

import logging
import os
import weakref
from typing import Any

import torch
from torch import nn

from cluster_kit.trainer.profiler import variant_kwargs

ENV_FLAG = "CLUSTERKIT_CUDA_GRAPHS"
LOG = logging.getLogger("cluster_kit.ddp")
_LOGGED: set[str] = set()
_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}
_BUILT_ON_CAPTURE_STREAM: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def graphs_requested(environ: dict[str, str] | None = None) -> bool:
    """True when ``CLUSTERKIT_CUDA_GRAPHS=1`` is set."""
    env = os.environ if environ is None else environ
    return env.get(ENV_FLAG, "").strip() == "1"


def prepare_process_group_env(enabled: bool | None = None) -> bool:
    """Turn DDP's async NCCL error handling off before ``init_process_group``.

    The CUDA graphs notes ask for this when collectives are captured. It only
    applies when graphs are requested (``enabled``, else the environment flag)
    and never overrides a value the user set. Returns whether graphs are wanted.
    """
    wanted = graphs_requested() if enabled is None else enabled
    if wanted:
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    return wanted


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter (CPU for a module without any)."""
    for param in module.parameters():
        return param.device
    return torch.device("cpu")


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream per GPU on which DDP is built, warmed up and captured.

    DDP keeps the AccumulateGrad nodes it met at construction; building it,
    warming up and capturing on different streams makes autograd join those
    streams inside the graph (PyTorch >= 2.11 warns about exactly that).
    """
    index = torch.device(device).index
    key = torch.cuda.current_device() if index is None else index
    if key not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[key] = torch.cuda.Stream(key)
    return _CAPTURE_STREAMS[key]


def wrap_ddp(
    module: nn.Module, for_capture: bool | None = None, **ddp_kwargs: Any
) -> nn.Module:
    """Wrap ``module`` in DistributedDataParallel, on the capture stream when graphed.

    Capturing the full backward pass needs DDP constructed in a side-stream
    context: with ``for_capture`` (default: ``CLUSTERKIT_CUDA_GRAPHS=1``) and a
    CUDA module it is built on :func:`capture_stream`; otherwise this is plain
    ``DistributedDataParallel(module, **ddp_kwargs)``. Under ``bench ddp --sweep``
    the arguments of ``CLUSTERKIT_DDP_VARIANT`` (:func:`variant_kwargs`) win over
    the caller's.
    """
    from torch.nn.parallel import DistributedDataParallel

    ddp_kwargs.update(variant_kwargs())
    device = module_device(module)
    wanted = graphs_requested() if for_capture is None else for_capture
    if device.type != "cuda":
        return DistributedDataParallel(module, **ddp_kwargs)
    ddp_kwargs.setdefault("device_ids", [device.index])
    if not wanted:
        return DistributedDataParallel(module, **ddp_kwargs)
    side = capture_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        wrapped = DistributedDataParallel(module, **ddp_kwargs)
    torch.cuda.current_stream(device).wait_stream(side)
    _BUILT_ON_CAPTURE_STREAM.add(wrapped)
    return wrapped


def built_on_capture_stream(model: nn.Module) -> bool:
    """Whether :func:`wrap_ddp` built this DDP on the capture stream."""
    return model in _BUILT_ON_CAPTURE_STREAM


def log_once(level: int, message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        LOG.log(level, message)


def is_ddp(model: nn.Module) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)
