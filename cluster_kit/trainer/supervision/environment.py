"""Who this rank is, from its environment: its rank, its node (Slurm's name), its heartbeat interval."""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from cluster_kit.trainer import contract

from .heartbeat import DEFAULT_INTERVAL_S


def rank_from_env(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank: ``RANK``, else ``SLURM_PROCID``, else 0."""
    env = os.environ if environ is None else environ
    for name in ("RANK", "SLURM_PROCID"):
        text = env.get(name, "").strip()
        if text.isdigit():
            return int(text)
    return 0


def node_from_env(environ: Mapping[str, str] | None = None) -> str:
    """This rank's node: ``SLURMD_NODENAME`` (Slurm's name for it), else the host name.

    On many clusters a node's host name is not its Slurm name (an FQDN, a cloud
    name); only the Slurm name can be excluded from the next attempt.
    """
    env = os.environ if environ is None else environ
    return env.get("SLURMD_NODENAME", "").strip() or socket.gethostname()


def interval_from_env(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between heartbeat writes: ``CLUSTERKIT_HEARTBEAT_INTERVAL`` (default 1.0)."""
    env = os.environ if environ is None else environ
    text = env.get(contract.HEARTBEAT_INTERVAL_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value >= 0 else DEFAULT_INTERVAL_S
