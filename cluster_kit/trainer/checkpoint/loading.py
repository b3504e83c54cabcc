"""Reading a checkpoint back: the newest one that verifies, and its entries restored in place."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from . import sharded, store
from .state import restore, set_rng_state

LOG = logging.getLogger("cluster_kit.checkpoint")


def newest_whole(root: str, tell_add: Callable[[str, dict[str, Any]], None]) -> str | None:
    """Rank 0: the newest committed checkpoint that verifies; bad ones are set aside
    (``step-N.corrupt``, told to the status file through ``tell_add``)."""
    for _, name in store.committed(root):
        why = store.verify(root, name)
        if why is None:
            return name
        aside = store.set_aside(root, name, why)
        LOG.warning("checkpoint %s failed verification (%s): set aside as %s; trying the one before",
                    os.path.join(root, name), why, aside)
        tell_add("set_aside", {"name": name, "as": aside, "why": why})
    return None


def read_into(folder: str, targets: dict[str, Any], rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, the entries read) of the checkpoint in ``folder``: each target restored
    in place from the entry of its name, this rank's random number generators put back."""
    manifest = store.read_manifest(folder)
    contents: dict[str, str] = manifest.get("contents", {})
    missing = sorted(set(targets) - set(contents))
    if missing:
        raise store.CheckpointError(f"{folder} has no {', '.join(missing)} (it holds "
                                    f"{', '.join(sorted(contents))})")
    state = {n: torch_load(os.path.join(folder, f"{n}.pt"))
             for n, kind in contents.items() if kind != "sharded"}
    dcp_targets = {n: o for n, o in targets.items() if contents[n] == "sharded"}
    if dcp_targets:
        sharded.load(dcp_targets, os.path.join(folder, sharded.SUBFOLDER))
    for n, obj in targets.items():
        if contents[n] != "sharded":
            restore(obj, state[n])
    restore_rng(folder, manifest, rank)
    return manifest, state


def restore_rng(folder: str, manifest: dict[str, Any], rank: int) -> None:
    file = f"rng-rank-{rank}.pt"
    if file in manifest["files"]:
        set_rng_state(torch_load(os.path.join(folder, file)))
    else:
        LOG.warning("%s holds no random number generators of rank %d (it was saved by %s ranks): "
                    "this rank's start afresh", folder, rank, manifest.get("world_size"))


def torch_load(path: str) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)
