"""Deadlines: one budget per host attempt, spent by every SSH step."""
from __future__ import annotations

from contextlib import suppress

import paramiko  # after ssh/deferred.py (ssh/__init__.py)

from cluster_kit.ssh.settings import (
    Endpoint,
    SshSettings,
)

GRACE_S = 2.0


# ----------------------------------------------------------------------------
# Deadlines


def _close_quietly(resource: object) -> None:
    # closing on the way out must not mask the real error
    with suppress(OSError, EOFError, paramiko.SSHException):
        resource.close()  # type: ignore[attr-defined]


def _budget(endpoint: Endpoint, settings: SshSettings) -> float:
    """Overall per-host deadline: connect + auth per hop, then the command."""
    hops = 1 + len(endpoint.proxy_jump)
    return 2 * endpoint.connect_timeout * hops + settings.command_timeout + GRACE_S
