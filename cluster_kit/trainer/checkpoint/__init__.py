"""Checkpoints of a training job: whole, verified, fenced by attempt, asynchronous when asked.

    from cluster_kit import checkpoint

    loaded = checkpoint.load(model=model, optimizer=optimizer, scheduler=scheduler, data=position)
    step = loaded.step if loaded else 0
    while step < total:
        train_one_step()
        step += 1
        if checkpoint.due(step) or ddp.stop_requested():
            checkpoint.save(step, model=model, optimizer=optimizer, scheduler=scheduler, data=position)
    checkpoint.wait()

The module-level calls use one :class:`Checkpointer` made from the environment that a
job with ``resilience:`` sets (``CLUSTERKIT_CHECKPOINT_DIR``, ``CLUSTERKIT_ATTEMPT``,
``CLUSTERKIT_CHECKPOINT_EVERY``, ...); :func:`configure` makes it with arguments
instead (a plain script: ``checkpoint.configure("ckpt")``). docs/architecture.md
("Checkpoints") describes the folder, the fence and the status file.

torch is imported only when a torch-side name is first used: the supervisor and the
CLI import :mod:`.interval`, :mod:`.store`, :mod:`.fence` and :mod:`.status`, which
need the stdlib only.
"""
from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any

from cluster_kit.trainer.checkpoint import fence, interval, settings, status, store
from cluster_kit.trainer.checkpoint.fence import Fenced
from cluster_kit.trainer.checkpoint.interval import (
    Every,
    Interval,
    choose_interval,
    parse_every,
)
from cluster_kit.trainer.checkpoint.store import CheckpointError, UnsafePath

if TYPE_CHECKING:
    from cluster_kit.trainer.checkpoint.checkpointer import Checkpointer, Loaded
    from cluster_kit.trainer.checkpoint.data import DataPosition

_LAZY = {"Checkpointer": "cluster_kit.trainer.checkpoint.checkpointer",
         "Loaded": "cluster_kit.trainer.checkpoint.checkpointer", "DataPosition": "cluster_kit.trainer.checkpoint.data"}
_DEFAULT: Checkpointer | None = None
_LOCK = threading.Lock()

# The stdlib-only modules are listed too: the supervisor and the CLI read the folder,
# the fence, the status file and the interval through them.
__all__ = ["CheckpointError", "Checkpointer", "DataPosition", "Every", "Fenced", "Interval", "Loaded",
           "UnsafePath", "choose_interval", "configure", "default", "due", "fence", "interval", "load",
           "parse_every", "save", "settings", "status", "store", "wait"]


def __getattr__(name: str) -> Any:
    """The torch-side names, imported when first used."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def configure(directory: str | None = None, **options: Any) -> Checkpointer:
    """Make the checkpointer the module-level calls use (see :class:`Checkpointer` for options)."""
    global _DEFAULT
    from cluster_kit.trainer.checkpoint.checkpointer import Checkpointer

    with _LOCK:
        if _DEFAULT is not None:
            _DEFAULT.drain()
        _DEFAULT = Checkpointer(directory, **options)
        return _DEFAULT


def default() -> Checkpointer:
    """The module-level checkpointer: the one :func:`configure` made, else one from the environment."""
    global _DEFAULT
    from cluster_kit.trainer.checkpoint.checkpointer import Checkpointer

    with _LOCK:
        if _DEFAULT is None:
            _DEFAULT = Checkpointer()
        return _DEFAULT


def save(step: int, *, async_: bool | None = None, **state: Any) -> None:
    """Save ``state`` as the checkpoint of ``step`` (:meth:`Checkpointer.save`). Every rank calls it."""
    default().save(step, async_=async_, **state)


def load(**targets: Any) -> Loaded | None:
    """The newest checkpoint that verifies, restored into ``targets``; None when there is none."""
    return default().load(**targets)


def due(step: int) -> bool:
    """Whether the interval says to save after ``step`` finished steps (the same on every rank)."""
    return default().due(step)


def wait() -> None:
    """Block until an asynchronous save in flight is committed (and raise its error)."""
    default().wait()
