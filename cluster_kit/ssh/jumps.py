"""Jump hosts (ProxyJump), shared by every host of one call."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import paramiko  # after ssh/deferred.py (ssh/__init__.py)

from cluster_kit.errors import InputError
from cluster_kit.ssh.connect import connect_endpoint
from cluster_kit.ssh.results import HostError, one_line
from cluster_kit.ssh.settings import (
    Endpoint,
    Hop,
)

if TYPE_CHECKING:
    from cluster_kit.ssh.deadlines import Attempt


MAX_JUMP_DEPTH = 8


# ----------------------------------------------------------------------------
# Jump hosts, shared by every host of one call


class _JumpSlot:
    """A jump connection being made or made: waiters block on `ready`."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.transport: paramiko.Transport | None = None
        self.error: str | None = None

    def usable(self) -> bool:
        return not self.ready.is_set() or self.error is not None or (
            self.transport is not None and self.transport.is_active())


class _JumpError(HostError):
    """A jump host failed; the message already names it."""


class JumpPool:
    """One connection per ProxyJump chain, opened by the first host that needs it.

    Hundreds of nodes behind one login node then cost one login, and channels
    on it, instead of hundreds of logins. A failed jump fails all its hosts at once.
    `endpoint(host, hop)` resolves a jump host as the call's context does.
    """

    def __init__(self, endpoint: Callable[[str, Hop], Endpoint], host_key_policy: str) -> None:
        self._endpoint = endpoint
        self._host_key_policy = host_key_policy
        self._lock = threading.Lock()
        self._slots: dict[tuple[Hop, ...], _JumpSlot] = {}

    def transport(self, chain: tuple[Hop, ...], attempt: Attempt,
                  visiting: tuple[tuple[Hop, ...], ...] = ()) -> paramiko.Transport:
        """The authenticated transport to the last host of `chain`."""
        if chain in visiting or len(visiting) >= MAX_JUMP_DEPTH:
            raise _JumpError(f"ProxyJump loop through {', '.join(map(str, chain))}")
        with self._lock:
            slot = self._slots.get(chain)
            owner = slot is None or not slot.usable()
            if owner:
                slot = self._slots[chain] = _JumpSlot()
        assert slot is not None
        if owner:
            self._fill(slot, chain, attempt, visiting + (chain,))
        elif not slot.ready.wait(attempt.remaining()):
            raise _JumpError(f"jump host {chain[-1]}: no answer within {attempt.budget:g}s")
        if slot.error is not None or slot.transport is None:
            raise _JumpError(slot.error or f"jump host {chain[-1]}: not connected")
        return slot.transport

    def _fill(self, slot: _JumpSlot, chain: tuple[Hop, ...], attempt: Attempt,
              visiting: tuple[tuple[Hop, ...], ...]) -> None:
        hop = chain[-1]
        try:
            endpoint = self._endpoint(hop.host, hop)
            before = chain[:-1] or endpoint.proxy_jump
            via = self.transport(before, attempt, visiting) if before else None
            slot.transport = connect_endpoint(endpoint, attempt, via, self._host_key_policy)
            # shared from now on: this host's deadline must not close it
            attempt.release(slot.transport)
            attempt.release(slot.transport.sock)
        except _JumpError as exc:
            slot.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a jump host's failure is every waiter's answer
            reason = str(exc) if isinstance(exc, (HostError, InputError)) else one_line(exc)
            slot.error = f"jump host {hop}: {reason}"
        finally:
            slot.ready.set()

    def close(self) -> None:
        with self._lock:
            slots = list(self._slots.values())
            self._slots.clear()
        for slot in reversed(slots):  # innermost chains were opened last
            if slot.transport is not None:
                slot.transport.close()
