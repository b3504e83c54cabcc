"""Checkpoints of a training job: the public import path of ``cluster_kit.trainer.checkpoint``.

    from cluster_kit import checkpoint

    loaded = checkpoint.load(model=model, optimizer=optimizer, scheduler=scheduler, data=position)
    step = loaded.step if loaded else 0
    while step < total:
        train_one_step()
        step += 1
        if checkpoint.due(step) or ddp.stop_requested():
            checkpoint.save(step, model=model, optimizer=optimizer, scheduler=scheduler, data=position)
    checkpoint.wait()

Every name is the trainer's own (one module state, however it is reached); torch is
imported only when a torch-side name is first used.
"""
from __future__ import annotations

from typing import Any

from cluster_kit.trainer import checkpoint as _trainer
from cluster_kit.trainer.checkpoint import (
    CheckpointError,
    Every,
    Fenced,
    Interval,
    UnsafePath,
    choose_interval,
    configure,
    default,
    due,
    fence,
    interval,
    load,
    parse_every,
    save,
    settings,
    status,
    store,
    wait,
)

__all__ = ["CheckpointError", "Checkpointer", "DataPosition", "Every", "Fenced", "Interval", "Loaded",
           "UnsafePath", "choose_interval", "configure", "default", "due", "fence", "interval", "load",
           "parse_every", "save", "settings", "status", "store", "wait"]


def __getattr__(name: str) -> Any:
    """The torch-side names (Checkpointer, Loaded, DataPosition), from the trainer when first used."""
    return getattr(_trainer, name)
