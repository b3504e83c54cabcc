"""A session for several commands on one host (the login runner)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import paramiko  # after ssh/deferred.py (ssh/__init__.py)

from cluster_kit.errors import SshConnectError
from cluster_kit.ssh.context import Context
from cluster_kit.ssh.deadlines import GRACE_S, Attempt
from cluster_kit.ssh.hosts import connect_host, failure_fix, failure_message, run_on
from cluster_kit.ssh.settings import (
    SshSettings,
)

if TYPE_CHECKING:
    from cluster_kit.ssh.results import HostResult


class SshSession:
    """One authenticated connection on which several commands run in turn."""

    def __init__(self, host: str, transport: paramiko.Transport, settings: SshSettings) -> None:
        self.host = host
        self._transport = transport
        self._settings = settings

    def run(self, command: str, stdin: bytes | None = None,
            timeout: float | None = None) -> HostResult:
        """Like `remote.run`, on this connection; `timeout` defaults to command_timeout."""
        limit = timeout if timeout is not None else self._settings.command_timeout
        attempt = Attempt(limit + GRACE_S)
        attempt.arm(limit + GRACE_S)
        try:
            return run_on(self._transport, self.host, command, stdin, limit, attempt)
        finally:
            attempt.disarm()

    @property
    def active(self) -> bool:
        """Whether the connection is still up (a dropped one cannot run commands)."""
        return bool(self._transport.is_active())

    def close(self) -> None:
        self._transport.close()


@contextmanager
def open_client(host: str, settings: SshSettings) -> Iterator[SshSession]:
    """A connected `SshSession` to `host`; raises SshConnectError (exit 3) if
    the host cannot be reached, its key is refused or auth fails."""
    ctx = Context(settings)
    attempt = Attempt(2 * settings.connect_timeout + GRACE_S)
    try:
        transport = connect_host(ctx, host, attempt)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one clear message
        ctx.close()
        raise SshConnectError(host, failure_message(exc, attempt), failure_fix(exc, attempt)) from None
    finally:
        attempt.disarm()
    session = SshSession(host, transport, settings)
    try:
        yield session
    finally:
        session.close()
        ctx.close()
