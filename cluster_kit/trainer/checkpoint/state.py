"""The training objects as state dicts and back: model, optimizer, scheduler, scaler, RNG.

Anything with ``state_dict()`` / ``load_state_dict()`` is saved through them (a
DistributedDataParallel or ``torch.compile`` wrapper is looked through, so the
checkpoint loads into the bare model too); anything else is saved as the value it
is. Checkpoints are read with ``torch.load(weights_only=True)``: a file on shared
storage is data, never code, so values must be tensors, numbers, strings, None and
lists, tuples and dicts of them.
"""
from __future__ import annotations

import logging
import random
import sys
from typing import Any

import torch
from torch import nn

LOG = logging.getLogger("cluster_kit.checkpoint")
# How an optimizer runs on this machine, not what it learnt: a resumed optimizer keeps
# its own (a graphed step needs capturable=True whatever the checkpoint's run used).
IMPLEMENTATION_KEYS = ("capturable", "fused", "foreach", "differentiable")


def unwrap(module: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel / FSDP-style ``.module`` and torch.compile wrappers."""
    from torch.nn.parallel import DistributedDataParallel

    while True:
        if isinstance(module, DistributedDataParallel):
            module = module.module
        elif isinstance(getattr(module, "_orig_mod", None), nn.Module):
            module = module._orig_mod  # type: ignore[assignment]
        else:
            return module


def kind_of(obj: Any) -> str:
    """``module``, ``optimizer``, ``state_dict`` (anything else with one) or ``value``."""
    if isinstance(obj, nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
        return "state_dict"
    return "value"


def state_of(obj: Any) -> Any:
    """What is saved for ``obj``: its state dict, or itself."""
    if isinstance(obj, nn.Module):
        return unwrap(obj).state_dict()
    if kind_of(obj) != "value":
        return obj.state_dict()
    return obj


def restore(obj: Any, saved: Any) -> None:
    """Load ``saved`` into ``obj`` in place (a plain value cannot be: it is returned instead)."""
    if isinstance(obj, nn.Module):
        unwrap(obj).load_state_dict(saved)
    elif isinstance(obj, torch.optim.Optimizer):
        load_optimizer(obj, saved)
    elif kind_of(obj) == "state_dict":
        if saved == {} and obj.state_dict() != {}:
            return  # a disabled GradScaler saves {}; an enabled one keeps its defaults
        obj.load_state_dict(saved)
    else:
        raise TypeError(f"{type(obj).__name__} has no load_state_dict(): read its value from "
                        "the Loaded object that load() returns instead")


def load_optimizer(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """``optimizer.load_state_dict`` keeping the optimizer's own implementation flags.

    With ``capturable`` or ``fused`` kept on, torch places each ``step`` count on its
    parameter's device as it loads, as a graphed step (build_step) needs.
    """
    groups = saved.get("param_groups", [])
    for live, group in zip(optimizer.param_groups, groups):
        for key in IMPLEMENTATION_KEYS:
            if key in live:
                group[key] = live[key]
    optimizer.load_state_dict(saved)


def to_host(value: Any, pinned: dict[tuple[Any, ...], torch.Tensor], path: tuple[Any, ...] = ()) -> Any:
    """A copy of ``value`` that training can no longer change: every tensor copied to host memory.

    CUDA tensors go into pinned buffers kept in ``pinned`` between saves (allocating
    pinned memory costs more than the copy); call :func:`finish_copies` before
    reading them. CPU tensors are cloned.
    """
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if tensor.device.type != "cuda":
            return tensor.clone()
        buffer = pinned.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            pinned[path] = buffer
        buffer.copy_(tensor, non_blocking=True)
        return buffer
    if isinstance(value, dict):
        return type(value)((k, to_host(v, pinned, (*path, k))) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        items = [to_host(v, pinned, (*path, i)) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    return value  # numbers, strings, None: immutable


def finish_copies() -> None:
    """Wait for the non-blocking copies of :func:`to_host` to land."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


# --- random number generators ------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """This rank's generators: torch's CPU one, each CUDA device's, Python's, numpy's if loaded."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, gauss = numpy.random.get_state()
        state["numpy"] = {"name": name, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                          "has_gauss": int(has_gauss), "gauss": float(gauss)}
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put this rank's generators back as :func:`rng_state` found them."""
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuples(state["python"]))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            LOG.warning("the checkpoint has the CUDA generators of %d devices, this rank sees %d: "
                        "CUDA random numbers start afresh", len(cuda), torch.cuda.device_count())
    numpy = sys.modules.get("numpy")
    saved = state.get("numpy")
    if numpy is not None and saved is not None:
        keys = saved["keys"].numpy().astype("uint32")
        numpy.random.set_state((saved["name"], keys, saved["pos"], saved["has_gauss"], saved["gauss"]))


def _as_tuples(value: Any) -> Any:
    """random.setstate wants tuples where a round trip may have left lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(v) for v in value)
    return value
