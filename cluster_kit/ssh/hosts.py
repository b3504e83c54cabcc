"""One host, start to finish: connect, run, turn every failure into a result."""
from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING

import paramiko  # after ssh/deferred.py (ssh/__init__.py)

from cluster_kit.errors import InputError
from cluster_kit.ssh.connect import connect_endpoint
from cluster_kit.ssh.deadlines import host_budget
from cluster_kit.ssh.execute import execute
from cluster_kit.ssh.results import CommandTimeout, HostError, HostResult, one_line

if TYPE_CHECKING:
    from cluster_kit.ssh.context import Context
    from cluster_kit.ssh.deadlines import Attempt


def connect_host(ctx: Context, host: str, attempt: Attempt) -> paramiko.Transport:
    """Resolve `host`, arm its deadline, and connect (through its jump hosts)."""
    endpoint = ctx.endpoint(host)
    attempt.arm(host_budget(endpoint, ctx.settings))
    via = ctx.jumps.transport(endpoint.proxy_jump, attempt) if endpoint.proxy_jump else None
    return connect_endpoint(endpoint, attempt, via, ctx.settings.host_key_policy)


def run_on(transport: paramiko.Transport, host: str, command: str, stdin: bytes | None,
           timeout: float, attempt: Attempt) -> HostResult:
    """Run `command` on a connected transport; any failure becomes the result's error."""
    attempt.phase = "running the command"
    try:
        status, out, err = execute(transport, command, stdin, timeout, attempt)
        return host_result(host, attempt, status=status, out=out, err=err)
    except CommandTimeout as exc:
        return host_result(host, attempt, out=exc.out, err=exc.err, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - the connection died: an answer, not a crash
        return host_result(host, attempt, error=failure_message(exc, attempt))


def failure_message(exc: BaseException, attempt: Attempt) -> str:
    """The error line: the deadline's if the watchdog cut in, else the exception's."""
    if attempt.aborted:
        return attempt.overrun_message()
    if isinstance(exc, (HostError, InputError)):
        return str(exc)
    return describe_error(exc)


def failure_fix(exc: BaseException, attempt: Attempt) -> str | None:
    """The fix the failing step named, if it named one (not when the deadline cut in)."""
    return None if attempt.aborted else getattr(exc, "fix", None)


def describe_error(exc: BaseException) -> str:
    """One categorised line for an exception no step recognised."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"no answer (timed out: {one_line(exc) or 'socket timeout'})"
    if isinstance(exc, (EOFError, ConnectionResetError, BrokenPipeError)):
        return "connection lost (the host closed the connection)"
    if isinstance(exc, paramiko.SSHException):
        return f"ssh error: {one_line(exc)}"
    return f"unexpected error: {type(exc).__name__}: {one_line(exc)}"


def host_result(host: str, attempt: Attempt, status: int | None = None, out: bytes = b"",
                err: bytes = b"", error: str | None = None, fix: str | None = None) -> HostResult:
    return HostResult(
        host=host,
        ok=error is None and status == 0,
        exit_status=status if error is None else None,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        error=error,
        elapsed_s=round(time.monotonic() - attempt.started, 3),
        fix=fix if error is not None else None,
    )
