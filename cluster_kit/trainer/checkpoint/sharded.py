"""A sharded state (FSDP, DTensor) through torch.distributed.checkpoint (DCP).

No rank holds the whole model, so every rank writes its own shards into the save's
``dcp/`` folder (``dcp.save`` is collective) and reads its shards back, whatever the
new world size. Models and optimizers go this way; schedulers, scalers and the data
position stay in rank 0's files. torch's ``get_model_state_dict`` and
``get_optimizer_state_dict`` name the optimizer's state by parameter names, so it
loads into a freshly built optimizer (whose state they create first).
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .state import unwrap

SUBFOLDER = "dcp"


def is_sharded(module: nn.Module) -> bool:
    """Whether the module's parameters are DTensors (FSDP2, tensor parallel) or it is FSDP."""
    from torch.distributed.tensor import DTensor

    if type(module).__name__ == "FullyShardedDataParallel":
        return True
    return any(isinstance(p, DTensor) for p in module.parameters())


def state_dicts(objects: dict[str, Any]) -> dict[str, Any]:
    """The DCP state dicts of the models and optimizers in ``objects`` (name -> state dict)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    model = _the_model(objects)
    out: dict[str, Any] = {}
    for name, obj in objects.items():
        if isinstance(obj, nn.Module):
            out[name] = get_model_state_dict(unwrap(obj))
        else:
            out[name] = get_optimizer_state_dict(unwrap(model), obj)
    return out


def save(objects: dict[str, Any], folder: str) -> None:
    """Every rank writes its shards of ``objects`` into ``folder`` (collective)."""
    import torch.distributed.checkpoint as dcp

    state = state_dicts(objects)
    with _alone_is_fine():
        dcp.save(state, checkpoint_id=folder, no_dist=not _distributed())


def load(objects: dict[str, Any], folder: str) -> None:
    """Every rank reads its shards from ``folder`` into ``objects`` in place (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = state_dicts(objects)
    with _alone_is_fine():
        dcp.load(state, checkpoint_id=folder, no_dist=not _distributed())
    model = _the_model(objects)
    for name, obj in objects.items():
        if isinstance(obj, nn.Module):
            set_model_state_dict(unwrap(obj), state[name])
        else:
            set_optimizer_state_dict(unwrap(model), obj, state[name])


@contextlib.contextmanager
def _alone_is_fine() -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process: that is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _distributed() -> bool:
    """Whether a process group is there (without one, DCP reads and writes as one process)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _the_model(objects: dict[str, Any]) -> nn.Module:
    models = [o for o in objects.values() if isinstance(o, nn.Module)]
    optimizers = [o for o in objects.values() if isinstance(o, torch.optim.Optimizer)]
    if optimizers and len(models) != 1:
        raise ValueError("a sharded save of an optimizer needs its model beside it, and only one "
                         f"model; got {len(models)}")
    return models[0] if models else nn.Module()
