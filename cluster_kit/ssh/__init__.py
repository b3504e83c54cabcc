"""SSH: the only paramiko user: settings, known_hosts, connect, jumps, exec, fan-out, session.

The names below are the room's public surface; the rest of the package imports them
from here. They load on first use, so importing this package does not import
paramiko (`clusterkit render` stays light).

Modules, lowest first, each importing only those before it: timeline, results,
filecache, known_hosts, settings, deadlines, config_index, auth, connect, jumps,
context, execute, hosts, fanout, session.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Before any module of this package imports paramiko (see deferred.py).
from cluster_kit.ssh import deferred as _deferred  # noqa: F401

if TYPE_CHECKING:
    from cluster_kit.ssh.fanout import fan_out, resolve, run
    from cluster_kit.ssh.known_hosts import ACCEPT_NEW_IN_PROFILE
    from cluster_kit.ssh.results import HostResult
    from cluster_kit.ssh.session import SshSession, open_client
    from cluster_kit.ssh.settings import (
        Endpoint,
        Hop,
        SshSettings,
        resolve_endpoint,
        unresolved_fix,
    )
    from cluster_kit.ssh.timeline import TIMELINE_STEPS, set_timeline_recorder

# public name -> the module of this package that defines it
_HOMES = {
    "ACCEPT_NEW_IN_PROFILE": "known_hosts",
    "Endpoint": "settings",
    "Hop": "settings",
    "HostResult": "results",
    "SshSession": "session",
    "SshSettings": "settings",
    "TIMELINE_STEPS": "timeline",
    "fan_out": "fanout",
    "open_client": "session",
    "resolve": "fanout",
    "resolve_endpoint": "settings",
    "run": "fanout",
    "set_timeline_recorder": "timeline",
    "unresolved_fix": "settings",
}

__all__ = [
    "ACCEPT_NEW_IN_PROFILE", "TIMELINE_STEPS", "Endpoint", "Hop", "HostResult", "SshSession", "SshSettings",
    "fan_out", "open_client", "resolve", "resolve_endpoint", "run", "set_timeline_recorder", "unresolved_fix",
]


def __getattr__(name: str) -> object:
    """A public name, imported from its module the first time it is asked for."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
