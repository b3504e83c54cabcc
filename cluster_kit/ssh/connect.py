"""Connecting: TCP (or a jump host's channel), handshake, host key check."""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import paramiko  # after ssh/deferred.py (ssh/__init__.py)
from paramiko.ssh_exception import IncompatiblePeer

from cluster_kit.ssh.auth import authenticate
from cluster_kit.ssh.known_hosts import (
    KnownHosts,
    describe_key,
    problem_fix,
    problem_message,
)
from cluster_kit.ssh.results import HostError, one_line
from cluster_kit.ssh.settings import (
    Endpoint,
    unresolved_fix,
)

if TYPE_CHECKING:
    from cluster_kit.ssh.deadlines import Attempt


# paramiko logs every failed handshake at ERROR; without a handler, Python would
# print those to stderr. clusterkit reports failures itself, one line per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


HOST_KEY_ALGORITHMS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256")}
# Asked for before paramiko's own first choice (aes128-ctr + hmac-sha2-256): one
# AEAD call a packet instead of a cipher call and an HMAC computed in Python; 8 % less
# client CPU over 200 hosts (docs/benchmarks.md). Every OpenSSH since 6.2 has them;
# a server without them gets paramiko's usual order.
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def cipher_preference(available: Sequence[str]) -> tuple[str, ...]:
    """paramiko's ciphers with the AEAD ones it has first."""
    first = [c for c in AEAD_CIPHERS if c in available]
    return tuple(first + [c for c in available if c not in first])


# ----------------------------------------------------------------------------
# Connecting: TCP (or a jump host's channel), handshake, host key, auth


def connect_endpoint(endpoint: Endpoint, attempt: Attempt, via: paramiko.Transport | None,
                     host_key_policy: str) -> paramiko.Transport:
    """An authenticated transport to `endpoint` (through `via`, a jump host's transport,
    when given), held by `attempt`; `host_key_policy` is the settings' (strict, accept-new)."""
    connect_deadline = time.monotonic() + endpoint.connect_timeout
    attempt.phase = f"connecting to {endpoint.address}"
    sock: socket.socket | _ChannelSocket
    if via is not None:
        sock = _open_forwarded(via, endpoint, connect_deadline)
    else:
        sock = _open_socket(endpoint, connect_deadline)
    attempt.hold(sock)
    attempt.mark("tcp")
    known = KnownHosts(endpoint.user_known_hosts, endpoint.global_known_hosts)
    transport = _handshake(sock, endpoint, known, connect_deadline, attempt)
    try:
        _verify_host_key(transport, endpoint, known, host_key_policy)
        attempt.mark("kex")
        attempt.phase = f"authenticating as {endpoint.user}"
        authenticate(transport, endpoint, time.monotonic() + endpoint.connect_timeout)
        attempt.mark("auth")
    except BaseException:
        transport.close()
        raise
    return transport


def _open_socket(endpoint: Endpoint, deadline: float) -> socket.socket:
    """A connected TCP socket, trying each address until `deadline`."""
    try:
        addresses = socket.getaddrinfo(endpoint.hostname, endpoint.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise HostError(f"hostname does not resolve ({endpoint.hostname}: {exc.strerror})",
                        fix=unresolved_fix(endpoint.hostname)) from None
    failure: OSError | None = None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise HostError(_socket_failure(failure, endpoint))


def _socket_failure(exc: OSError | None, endpoint: Endpoint) -> str:
    """One line for a failed TCP connect."""
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused ({endpoint.address})"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"timed out connecting ({endpoint.address}, {endpoint.connect_timeout:g}s)"
    if exc is not None and exc.errno in (113, 101, 65, 51):  # EHOSTUNREACH/ENETUNREACH
        return f"no route to host ({endpoint.address})"
    reason = exc.strerror if exc is not None and exc.strerror else str(exc)
    return f"cannot connect to {endpoint.address}: {reason}"


class _Transport(paramiko.Transport):
    """paramiko's Transport, keeping the server's reason when a channel cannot be
    opened: sshd says "Connection refused" or "Name or service not known", while
    paramiko's exception only says "Connect failed" for all of them."""

    def __init__(self, sock: socket.socket | _ChannelSocket) -> None:
        super().__init__(cast(socket.socket, sock))  # paramiko only needs the socket methods
        self._open_failures: dict[int, str] = {}
        self._opener = threading.local()  # which channel id this thread asked for

    def _next_channel(self) -> int:
        chanid: int = super()._next_channel()  # type: ignore[misc]
        self._opener.chanid = chanid
        return chanid

    def _parse_channel_open_failure(self, m: paramiko.Message) -> None:
        chanid = m.get_int()
        m.get_int()
        self._open_failures[chanid] = m.get_text()
        m.rewind()
        super()._parse_channel_open_failure(m)  # type: ignore[misc]

    def open_failure_reason(self) -> str:
        """The server's reason for this thread's last refused channel, if any."""
        return self._open_failures.pop(getattr(self._opener, "chanid", -1), "")


class _ChannelSocket:
    """A jump host's channel as the socket of the transport to the host behind it.

    paramiko's Channel.send checks for "closed" and then writes without its lock,
    so a close racing a send can put data after our CLOSE; sshd answers that by
    dropping the whole jump connection, every other host's channel with it.
    Here close() waits for an in-flight send, and nothing is sent after it.
    """

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel
        self._lock = threading.Lock()
        self._closed = False

    def send(self, data: bytes) -> int:
        with self._lock:
            if self._closed:
                raise OSError("socket is closed")
            return self._channel.send(data)

    def recv(self, size: int) -> bytes:
        return self._channel.recv(size)

    def settimeout(self, timeout: float | None) -> None:
        self._channel.settimeout(timeout)

    def getpeername(self) -> object:
        return self._channel.getpeername()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._channel.close()


def _open_forwarded(via: paramiko.Transport, endpoint: Endpoint, deadline: float) -> _ChannelSocket:
    """A direct-tcpip channel from the jump host to the endpoint (ssh -W)."""
    timeout = max(0.05, deadline - time.monotonic())
    try:
        return _ChannelSocket(via.open_channel("direct-tcpip", (endpoint.hostname, endpoint.port),
                                ("127.0.0.1", 0), timeout=timeout))
    except paramiko.ChannelException as exc:
        reason = via.open_failure_reason() if isinstance(via, _Transport) else ""
        message = _forward_failure(exc.code, reason or exc.text, endpoint)
        fix = unresolved_fix(endpoint.hostname, "the jump host") if "does not resolve" in message else None
        raise HostError(message, fix=fix) from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        if "Timeout" in str(exc):
            raise HostError(f"timed out connecting ({endpoint.address} via the jump host, "
                            f"{endpoint.connect_timeout:g}s)") from None
        raise HostError(f"jump host connection lost: {one_line(exc)}") from None


def _forward_failure(code: int, text: str, endpoint: Endpoint) -> str:
    """One line for a jump host's refusal to open a channel to the endpoint."""
    where = f"{endpoint.address}, via the jump host"
    lowered = text.lower()
    if "refused" in lowered:
        return f"connection refused ({where})"
    if "timed out" in lowered:
        return f"timed out connecting ({where})"
    if "name" in lowered or "resolve" in lowered or "getaddrinfo" in lowered:
        return f"hostname does not resolve ({endpoint.hostname}, on the jump host)"
    if code == 1:
        return f"the jump host does not allow forwarding to {endpoint.address} (AllowTcpForwarding?)"
    return f"cannot connect to {where}: {text or f'channel open failure {code}'}"


def _handshake(sock: socket.socket | _ChannelSocket, endpoint: Endpoint, known: KnownHosts, deadline: float,
               attempt: Attempt) -> paramiko.Transport:
    """SSH banner and key exchange, finished by `deadline` or an error."""
    attempt.phase = f"waiting for the SSH handshake of {endpoint.address}"
    transport = _Transport(sock)
    attempt.hold(transport)
    remaining = max(0.05, deadline - time.monotonic())
    # paramiko's own banner timeout only as a backstop behind our deadline
    transport.banner_timeout = transport.handshake_timeout = remaining + 1
    _prefer_known_key_types(transport, known.key_types(endpoint.host_key_name))
    options = transport.get_security_options()
    options.ciphers = cipher_preference(options.ciphers)
    done = threading.Event()
    transport.start_client(event=done)
    if not done.wait(remaining):
        transport.close()
        raise HostError(f"no answer within {endpoint.connect_timeout:g}s "
                        f"({endpoint.address} accepted TCP but sent no SSH handshake)")
    if not transport.is_active():
        failure = transport.get_exception()
        transport.close()
        raise HostError(_handshake_failure(failure, endpoint))
    return transport


def _prefer_known_key_types(transport: paramiko.Transport, known_types: list[str]) -> None:
    """Ask for a key type known_hosts has for the host first, as OpenSSH does;
    otherwise a host with a known RSA key would offer ed25519 and look changed."""
    if not known_types:
        return
    options = transport.get_security_options()
    available = list(options.key_types)
    wanted = [alg for kind in known_types for alg in HOST_KEY_ALGORITHMS.get(kind, (kind,))]
    first = [alg for alg in dict.fromkeys(wanted) if alg in available]
    options.key_types = first + [alg for alg in available if alg not in first]


def _handshake_failure(exc: BaseException | None, endpoint: Endpoint) -> str:
    """One line for a failed banner/key exchange."""
    text = one_line(exc) if exc is not None else "no reason given"
    if isinstance(exc, (EOFError, ConnectionResetError)) or "banner" in text.lower():
        return (f"connection closed by {endpoint.address} before the SSH handshake finished "
                f"(sshd MaxStartups, TCP wrappers or not an SSH server?)")
    if isinstance(exc, IncompatiblePeer):
        return f"no common SSH algorithm with {endpoint.address}: {text}"
    return f"SSH handshake with {endpoint.address} failed: {text}"


def _verify_host_key(transport: paramiko.Transport, endpoint: Endpoint, known: KnownHosts,
                     policy: str) -> None:
    """Refuse unknown keys (strict) or record them (accept-new); refuse changed keys always."""
    key = transport.get_remote_server_key()
    key_type, blob = key.get_name(), key.asbytes()
    name = endpoint.host_key_name
    verdict = known.check(name, key_type, blob)
    if verdict.status == "unknown" and policy == "accept-new":
        verdict = known.accept(name, key_type, blob, hashed=endpoint.hash_known_hosts)
        if verdict.status == "unknown":
            return  # now recorded
    if verdict.status != "match":
        offered = describe_key(key_type, blob)
        raise HostError(problem_message(verdict, name, offered, known, endpoint.hostname, endpoint.port),
                        fix=problem_fix(verdict, name, known, endpoint.hostname, endpoint.port))
