"""Running one command on a connected transport, within its deadline."""
from __future__ import annotations

import select
import socket
import time
from contextlib import suppress
from typing import TYPE_CHECKING

import paramiko  # after ssh/deferred.py (ssh/__init__.py)
from paramiko.common import cMSG_CHANNEL_REQUEST

from cluster_kit.ssh.results import CommandTimeout

if TYPE_CHECKING:
    from cluster_kit.ssh.deadlines import Attempt


READ_CHUNK = 65536


# ----------------------------------------------------------------------------
# Running a command


def execute(transport: paramiko.Transport, command: str, stdin: bytes | None,
            timeout: float, attempt: Attempt) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of `command`; CommandTimeout after `timeout` s."""
    deadline = time.monotonic() + timeout
    channel = transport.open_session(timeout=max(0.05, timeout))
    attempt.hold(channel)  # exec_command's reply has no timeout of its own
    attempt.mark("channel")
    try:
        channel.exec_command(command)
        _send_stdin(channel, stdin or b"", deadline, timeout)
        attempt.mark("sent")
        out, err = _collect(channel, deadline, timeout, attempt)
        if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
            raise CommandTimeout(timeout, out, err)
        attempt.mark("done")
        return channel.exit_status, out, err
    except CommandTimeout:
        _ask_to_stop(channel)
        raise
    finally:
        channel.close()


def _ask_to_stop(channel: paramiko.Channel) -> None:
    """Send the command SIGTERM (RFC 4254 "signal" request, honoured by OpenSSH's
    sshd): without a pty, closing the channel alone leaves it running forever.
    paramiko has no public call for this request, hence the internal send."""
    message = paramiko.Message()
    message.add_byte(cMSG_CHANNEL_REQUEST)
    message.add_int(channel.remote_chanid)
    message.add_string("signal")
    message.add_boolean(False)
    message.add_string("TERM")
    with suppress(OSError, EOFError, AttributeError, paramiko.SSHException):
        channel.transport._send_user_message(message)  # type: ignore[union-attr]


def _send_stdin(channel: paramiko.Channel, data: bytes, deadline: float, timeout: float) -> None:
    """Write all of `data`, then EOF, so `python3 -` and friends start."""
    if data:
        channel.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            channel.sendall(data)
        except OSError as exc:
            if isinstance(exc, (socket.timeout, TimeoutError)):  # distinct before Python 3.10
                raise CommandTimeout(timeout, b"", b"") from None
            return  # the command exited without reading it all, as `true` would
    channel.shutdown_write()


def _collect(channel: paramiko.Channel, deadline: float, timeout: float,
             attempt: Attempt | None = None) -> tuple[bytes, bytes]:
    """Read stdout and stderr as they come until EOF; never blocks past `deadline`."""
    out, err = bytearray(), bytearray()
    wakeup = channel.fileno()  # readable whenever either stream has data or closes
    first = attempt is not None and attempt.marks is not None
    while True:
        finished = channel.eof_received or channel.closed  # data precedes EOF
        while channel.recv_ready():
            out += channel.recv(READ_CHUNK)
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(READ_CHUNK)
        if first and (out or err or finished):
            first = False
            attempt.mark("first_byte")  # type: ignore[union-attr]
        if finished:
            return bytes(out), bytes(err)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CommandTimeout(timeout, bytes(out), bytes(err))
        select.select([wakeup], [], [], min(remaining, 1.0))
