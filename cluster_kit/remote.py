"""Run one command on one host or on hundreds over SSH; the only module importing paramiko.

Hosts resolve through ssh_config as OpenSSH does (`sshconfig.py`), host keys are
checked against known_hosts with the profile's policy (`known_hosts.py`), auth is
by keys only (identity files, then ssh-agent), and every step has a deadline: a
host that never answers comes back as an error, never as a hang. `fan_out`
returns one `HostResult` per host, in the order given, and never raises for a
host's failure.
"""
from __future__ import annotations

import getpass
import importlib.util
import logging
import os
import pickle
import queue
import select
import selectors
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import NoReturn, cast


class _Deferred(types.ModuleType):
    """Stands in for a module until one of its attributes is first used."""

    def __getattr__(self, attr: str) -> object:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


def _defer_import(name: str) -> None:
    """Make `import name` cheap: the module is imported on first attribute use.

    paramiko.config imports invoke, only ever used for ssh_config's `Match exec`,
    and invoke brings asyncio, yaml and unittest.mock: about a third of paramiko's
    import time, and of the interpreter's exit (0.1-0.2 s on a loaded 2-core
    machine, at the start and the end of every fan-out). A module that is not
    installed stays an ImportError."""
    if name in sys.modules or importlib.util.find_spec(name) is None:
        return
    sys.modules[name] = _Deferred(name)


_defer_import("invoke")

import paramiko  # after _defer_import
from paramiko.common import cMSG_CHANNEL_REQUEST
from paramiko.ssh_exception import IncompatiblePeer

from cluster_kit.errors import InputError, SshConnectError
from cluster_kit.filecache import FileCache
from cluster_kit.known_hosts import (
    KnownHosts,
    describe_key,
    problem_fix,
    problem_message,
)
from cluster_kit.sshconfig import (
    Endpoint,
    Hop,
    SshSettings,
    resolve_endpoint,
    unresolved_fix,
)
from cluster_kit.textfile import read_text_file

__all__ = ["HostResult", "SshConnectError", "SshSession", "SshSettings", "fan_out",
           "open_client", "resolve", "run"]

# paramiko logs every failed handshake at ERROR; without a handler, Python would
# print those to stderr. clusterkit reports failures itself, one line per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

GRACE_S = 2.0
READ_CHUNK = 65536
MAX_JUMP_DEPTH = 8
HOST_KEY_ALGORITHMS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256")}

# Per-connection timeline (benchmarks/fanout.py): None, the default, records nothing.
# Otherwise called once per host as it finishes, from its worker thread, with the host,
# the monotonic time its attempt started and the (step, monotonic time) marks of
# TIMELINE_STEPS it reached, in order.
TimelineRecorder = Callable[[str, float, list[tuple[str, float]]], None]
TIMELINE_STEPS = ("tcp", "kex", "auth", "channel", "sent", "first_byte", "done", "closed")
_timeline_recorder: TimelineRecorder | None = None


@dataclass(frozen=True)
class HostResult:
    """What one host did: exit status and output, or a one-line error.

    `error` is None whenever the command ran to completion (then `exit_status`
    is its status); `ok` means that and status 0.
    """

    host: str
    ok: bool
    exit_status: int | None
    stdout: str
    stderr: str
    error: str | None
    elapsed_s: float
    fix: str | None = None  # what to do about `error`, where the failing step knows it

    @property
    def reached(self) -> bool:
        """True when SSH connected, authenticated and the command finished."""
        return self.error is None


class _HostError(Exception):
    """A host failed in a way worth one line: the message is that line; `fix`,
    when the step knows it, is what to do."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix



class _CommandTimeout(_HostError):
    """The command outran command_timeout; keeps what it printed so far."""

    def __init__(self, timeout: float, out: bytes, err: bytes) -> None:
        super().__init__(f"no answer within {timeout:g}s: the command was still running "
                         "(command_timeout)")
        self.out = out
        self.err = err


# ----------------------------------------------------------------------------
# Deadlines


class _Attempt:
    """One host's try: the phase it is in, its overall deadline, and what to
    close when that deadline passes (closing unblocks any paramiko wait)."""

    def __init__(self, budget: float) -> None:
        self.started = time.monotonic()
        self.budget = budget
        self.phase = "resolving the host"
        self.aborted = False
        self._held: list[object] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.marks: list[tuple[str, float]] | None = [] if _timeline_recorder is not None else None

    def mark(self, step: str) -> None:
        """Note that this attempt reached `step` (a TIMELINE_STEPS name), if recording."""
        if self.marks is not None:
            self.marks.append((step, time.monotonic()))

    @property
    def deadline(self) -> float:
        return self.started + self.budget

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def arm(self, budget: float) -> None:
        """Start the watchdog that aborts this attempt after `budget` seconds."""
        self.budget = budget
        self._timer = threading.Timer(self.remaining(), self.abort)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def hold(self, resource: object) -> None:
        with self._lock:
            self._held.append(resource)
        if self.aborted:
            _close_quietly(resource)

    def release(self, resource: object) -> None:
        with self._lock:
            if resource in self._held:
                self._held.remove(resource)

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            held = list(self._held)
        for resource in held:
            _close_quietly(resource)

    def overrun_message(self) -> str:
        return f"no answer within {self.budget:g}s (overall deadline, while {self.phase})"


def _close_quietly(resource: object) -> None:
    # closing on the way out must not mask the real error
    with suppress(OSError, EOFError, paramiko.SSHException):
        resource.close()  # type: ignore[attr-defined]


def _budget(endpoint: Endpoint, settings: SshSettings) -> float:
    """Overall per-host deadline: connect + auth per hop, then the command."""
    hops = 1 + len(endpoint.proxy_jump)
    return 2 * endpoint.connect_timeout * hops + settings.command_timeout + GRACE_S


# ----------------------------------------------------------------------------
# Shared state of one run / fan-out

class _IndexedConfig:
    """A parsed ssh_config whose lookups read only the blocks that can apply.

    paramiko's `SSHConfig.lookup` walks every block twice per host, and asks the
    OS for the local user name for every block the host does not match (its Match
    support): with one `Host` block per node, a 500-node config cost 3 ms of CPU
    per host, 12 ms where $USER is unset and each of those asks reads the passwd
    database: more than the SSH connection itself. Here blocks whose patterns
    are all literal names are indexed by name; wildcard, negated and `Match`
    blocks are always kept. paramiko then matches and merges that short list in
    file order, so the result is what it would return. A config that
    canonicalizes host names (which re-matches under another name) is looked up
    whole.
    """

    def __init__(self, config: paramiko.SSHConfig) -> None:
        self.config = config
        blocks = getattr(config, "_config", None)  # paramiko's parsed blocks, in file order
        self._blocks: list[dict] = blocks if isinstance(blocks, list) else []
        self._indexed = isinstance(blocks, list) and not any(
            str(b.get("config", {}).get("canonicalizehostname", "no")).lower() in ("yes", "always")
            for b in self._blocks)
        self._by_name: dict[str, list[int]] = {}
        self._always: list[int] = []
        for index, block in enumerate(self._blocks):
            patterns = block.get("host")
            if "matches" in block or not isinstance(patterns, list) or not all(
                    isinstance(p, str) and not any(c in p for c in "*?[!") for p in patterns):
                self._always.append(index)
                continue
            for pattern in dict.fromkeys(os.path.normcase(p) for p in patterns):
                self._by_name.setdefault(pattern, []).append(index)

    def lookup(self, name: str) -> dict:
        """paramiko's options for `name` (an `SSHConfigDict`)."""
        if not self._indexed:
            return self.config.lookup(name)
        wanted = sorted(self._by_name.get(os.path.normcase(name), []) + self._always)
        subset = paramiko.SSHConfig()
        subset._config = [self._blocks[i] for i in wanted]  # type: ignore[attr-defined]
        return subset.lookup(name)


def _parse_ssh_config(path: str) -> _IndexedConfig:
    # read as profiles are, so that a FIFO or a device named as config_file cannot hang the command
    text = read_text_file(path, max_line_chars=None, what="ssh_config files")
    try:
        return _IndexedConfig(paramiko.SSHConfig.from_text(text))
    except (paramiko.SSHException, ValueError) as exc:
        raise InputError(f"cannot read ssh config {path}: {exc}") from None


def _empty_ssh_config() -> _IndexedConfig:
    return _IndexedConfig(paramiko.SSHConfig())


_SSH_CONFIGS = FileCache(_parse_ssh_config, lambda _path: _empty_ssh_config())


def _load_ssh_config(path: str | None) -> _IndexedConfig:
    """The parsed ssh_config (empty if absent), parsed once while unchanged."""
    return _SSH_CONFIGS.get(os.path.expanduser(path)) if path else _empty_ssh_config()


def _local_user() -> str:
    """The user ssh would log in as by default."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry, e.g. in some containers
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


class _Context:
    """What every host of one call shares: settings, parsed ssh_config, jump hosts."""

    def __init__(self, settings: SshSettings) -> None:
        self.settings = settings
        self.ssh_config = _load_ssh_config(settings.config_file)
        self.local_user = _local_user()
        self.jumps = _JumpPool(self)

    def endpoint(self, name: str, hop: Hop | None = None) -> Endpoint:
        options = self.ssh_config.lookup(name)
        return resolve_endpoint(name, options, self.settings, self.local_user, hop)

    def close(self) -> None:
        self.jumps.close()


# ----------------------------------------------------------------------------
# Connecting: TCP (or a jump host's channel), handshake, host key, auth


def _connect(ctx: _Context, endpoint: Endpoint, attempt: _Attempt,
             via: paramiko.Transport | None) -> paramiko.Transport:
    """An authenticated transport to `endpoint`, held by `attempt`."""
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
        _verify_host_key(transport, endpoint, known, ctx.settings.host_key_policy)
        attempt.mark("kex")
        attempt.phase = f"authenticating as {endpoint.user}"
        _authenticate(transport, endpoint, time.monotonic() + endpoint.connect_timeout)
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
        raise _HostError(f"hostname does not resolve ({endpoint.hostname}: {exc.strerror})",
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
    raise _HostError(_socket_failure(failure, endpoint))


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
        raise _HostError(message, fix=fix) from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        if "Timeout" in str(exc):
            raise _HostError(f"timed out connecting ({endpoint.address} via the jump host, "
                             f"{endpoint.connect_timeout:g}s)") from None
        raise _HostError(f"jump host connection lost: {_one_line(exc)}") from None


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
               attempt: _Attempt) -> paramiko.Transport:
    """SSH banner and key exchange, finished by `deadline` or an error."""
    attempt.phase = f"waiting for the SSH handshake of {endpoint.address}"
    transport = _Transport(sock)
    attempt.hold(transport)
    remaining = max(0.05, deadline - time.monotonic())
    # paramiko's own banner timeout only as a backstop behind our deadline
    transport.banner_timeout = transport.handshake_timeout = remaining + 1
    _prefer_known_key_types(transport, known.key_types(endpoint.host_key_name))
    done = threading.Event()
    transport.start_client(event=done)
    if not done.wait(remaining):
        transport.close()
        raise _HostError(f"no answer within {endpoint.connect_timeout:g}s "
                         f"({endpoint.address} accepted TCP but sent no SSH handshake)")
    if not transport.is_active():
        failure = transport.get_exception()
        transport.close()
        raise _HostError(_handshake_failure(failure, endpoint))
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
    text = _one_line(exc) if exc is not None else "no reason given"
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
        raise _HostError(problem_message(verdict, name, offered, known, endpoint.hostname, endpoint.port),
                         fix=problem_fix(verdict, name, known, endpoint.hostname, endpoint.port))


# ----------------------------------------------------------------------------
# Authentication: identity files, then ssh-agent; keys only, never a prompt

def _read_key(path: str) -> tuple[paramiko.PKey | None, str]:
    try:
        return paramiko.PKey.from_path(path), ""
    except (paramiko.PasswordRequiredException, TypeError):
        return None, (f"{_short(path)} needs a passphrase: load it into ssh-agent "
                      f"(`ssh-add {_short(path)}`)")
    except (paramiko.SSHException, ValueError, OSError) as exc:
        return None, f"{_short(path)} is not a usable private key ({_one_line(exc)})"


def _missing_key(path: str) -> tuple[paramiko.PKey | None, str]:
    return None, f"{_short(path)} not found"


# (key, "") or (None, why not); each file is read once while unchanged
_KEYS = FileCache(_read_key, _missing_key)


def _authenticate(transport: paramiko.Transport, endpoint: Endpoint, deadline: float) -> None:
    """Public-key auth with each identity file, then each agent key, until one works."""
    tried: list[str] = []
    notes: list[str] = []
    for path in endpoint.identity_files:
        key, problem = _KEYS.get(path)
        if key is None:
            if not (endpoint.default_identities and problem.endswith("not found")):
                notes.append(problem)
            continue
        if _try_key(transport, endpoint, key, _short(path), tried, deadline):
            return
    use_agent = not endpoint.identities_only and os.environ.get("SSH_AUTH_SOCK")
    if use_agent and _try_agent(transport, endpoint, tried, deadline):
        return
    raise _HostError(_auth_failure(endpoint.user, tried, notes, transport.is_active()))


def _try_agent(transport: paramiko.Transport, endpoint: Endpoint, tried: list[str],
               deadline: float) -> bool:
    """Each ssh-agent key in turn; one agent connection per host keeps threads apart."""
    agent = paramiko.Agent()
    try:
        for key in agent.get_keys():
            label = f"agent {describe_key(key.get_name(), key.asbytes())}"
            if _try_key(transport, endpoint, key, label, tried, deadline):
                return True
        return False
    finally:
        agent.close()


def _try_key(transport: paramiko.Transport, endpoint: Endpoint, key: paramiko.PKey,
             label: str, tried: list[str], deadline: float) -> bool:
    """True when `key` authenticated; False when refused (recorded in `tried`)."""
    if not transport.is_active():
        return False
    transport.auth_timeout = max(0.05, deadline - time.monotonic())
    try:
        remaining_methods = transport.auth_publickey(endpoint.user, key)
    except paramiko.BadAuthenticationType as exc:
        raise _HostError(f"authentication failed for user {endpoint.user}: the server does not "
                         f"accept keys (it allows: {', '.join(exc.allowed_types)})") from None
    except paramiko.AuthenticationException as exc:
        if "timeout" in str(exc).lower():
            raise _HostError(f"no answer within {endpoint.connect_timeout:g}s "
                             f"during authentication ({endpoint.address})") from None
        tried.append(label)
        return False
    if remaining_methods and not transport.is_authenticated():
        raise _HostError(f"authentication failed for user {endpoint.user}: the server also wants "
                         f"{', '.join(remaining_methods)}, and clusterkit uses keys only")
    return True


def _auth_failure(user: str, tried: list[str], notes: list[str], still_connected: bool) -> str:
    """`authentication failed for user X (tried: ...)` with the reasons keys were skipped."""
    parts = [f"tried: {', '.join(tried)}" if tried else "no usable key"]
    parts += notes
    if not still_connected:
        parts.append("the server closed the connection (MaxAuthTries?)")
    return f"authentication failed for user {user} ({'; '.join(parts)})"


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


class _JumpError(_HostError):
    """A jump host failed; the message already names it."""


class _JumpPool:
    """One connection per ProxyJump chain, opened by the first host that needs it.

    Hundreds of nodes behind one login node then cost one login, and channels
    on it, instead of hundreds of logins. A failed jump fails all its hosts at once.
    """

    def __init__(self, ctx: _Context) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._slots: dict[tuple[Hop, ...], _JumpSlot] = {}

    def transport(self, chain: tuple[Hop, ...], attempt: _Attempt,
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

    def _fill(self, slot: _JumpSlot, chain: tuple[Hop, ...], attempt: _Attempt,
              visiting: tuple[tuple[Hop, ...], ...]) -> None:
        hop = chain[-1]
        try:
            endpoint = self._ctx.endpoint(hop.host, hop)
            before = chain[:-1] or endpoint.proxy_jump
            via = self.transport(before, attempt, visiting) if before else None
            slot.transport = _connect(self._ctx, endpoint, attempt, via)
            # shared from now on: this host's deadline must not close it
            attempt.release(slot.transport)
            attempt.release(slot.transport.sock)
        except _JumpError as exc:
            slot.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a jump host's failure is every waiter's answer
            reason = str(exc) if isinstance(exc, (_HostError, InputError)) else _one_line(exc)
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


# ----------------------------------------------------------------------------
# Running a command


def _execute(transport: paramiko.Transport, command: str, stdin: bytes | None,
             timeout: float, attempt: _Attempt) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of `command`; _CommandTimeout after `timeout` s."""
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
            raise _CommandTimeout(timeout, out, err)
        attempt.mark("done")
        return channel.exit_status, out, err
    except _CommandTimeout:
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
                raise _CommandTimeout(timeout, b"", b"") from None
            return  # the command exited without reading it all, as `true` would
    channel.shutdown_write()


def _collect(channel: paramiko.Channel, deadline: float, timeout: float,
             attempt: _Attempt | None = None) -> tuple[bytes, bytes]:
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
            raise _CommandTimeout(timeout, bytes(out), bytes(err))
        select.select([wakeup], [], [], min(remaining, 1.0))


# ----------------------------------------------------------------------------
# One host, start to finish


def _connect_host(ctx: _Context, host: str, attempt: _Attempt) -> paramiko.Transport:
    """Resolve `host`, arm its deadline, and connect (through its jump hosts)."""
    endpoint = ctx.endpoint(host)
    attempt.arm(_budget(endpoint, ctx.settings))
    via = ctx.jumps.transport(endpoint.proxy_jump, attempt) if endpoint.proxy_jump else None
    return _connect(ctx, endpoint, attempt, via)


def _run_host(ctx: _Context, host: str, command: str, stdin: bytes | None,
              attempt: _Attempt) -> HostResult:
    """Connect, run, disconnect; any failure becomes the result's error."""
    transport: paramiko.Transport | None = None
    try:
        transport = _connect_host(ctx, host, attempt)
        return _run_on(transport, host, command, stdin, ctx.settings.command_timeout, attempt)
    except Exception as exc:  # noqa: BLE001 - a host's failure is data, not an exception
        return _result(host, attempt, error=_failure_message(exc, attempt), fix=_failure_fix(exc, attempt))
    finally:
        attempt.disarm()
        if transport is not None:
            transport.close()
        if attempt.marks is not None:
            attempt.mark("closed")
            _record_timeline(host, attempt)


def set_timeline_recorder(recorder: TimelineRecorder | None) -> None:
    """Record every later host's timeline with `recorder` (None: stop recording)."""
    global _timeline_recorder
    _timeline_recorder = recorder


def _record_timeline(host: str, attempt: _Attempt) -> None:
    recorder = _timeline_recorder
    if recorder is not None and attempt.marks is not None:
        recorder(host, attempt.started, list(attempt.marks))


def _run_on(transport: paramiko.Transport, host: str, command: str, stdin: bytes | None,
            timeout: float, attempt: _Attempt) -> HostResult:
    """Run `command` on a connected transport; any failure becomes the result's error."""
    attempt.phase = "running the command"
    try:
        status, out, err = _execute(transport, command, stdin, timeout, attempt)
        return _result(host, attempt, status=status, out=out, err=err)
    except _CommandTimeout as exc:
        return _result(host, attempt, out=exc.out, err=exc.err, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - the connection died: an answer, not a crash
        return _result(host, attempt, error=_failure_message(exc, attempt))


def _failure_message(exc: BaseException, attempt: _Attempt) -> str:
    """The error line: the deadline's if the watchdog cut in, else the exception's."""
    if attempt.aborted:
        return attempt.overrun_message()
    if isinstance(exc, (_HostError, InputError)):
        return str(exc)
    return describe_error(exc)


def _failure_fix(exc: BaseException, attempt: _Attempt) -> str | None:
    """The fix the failing step named, if it named one (not when the deadline cut in)."""
    return None if attempt.aborted else getattr(exc, "fix", None)


def describe_error(exc: BaseException) -> str:
    """One categorised line for an exception no step recognised."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"no answer (timed out: {_one_line(exc) or 'socket timeout'})"
    if isinstance(exc, (EOFError, ConnectionResetError, BrokenPipeError)):
        return "connection lost (the host closed the connection)"
    if isinstance(exc, paramiko.SSHException):
        return f"ssh error: {_one_line(exc)}"
    return f"unexpected error: {type(exc).__name__}: {_one_line(exc)}"


def _result(host: str, attempt: _Attempt, status: int | None = None, out: bytes = b"",
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


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def _short(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home != "/" and path.startswith(home + os.sep) else path


# ----------------------------------------------------------------------------
# Public API


def run(host: str, command: str, settings: SshSettings, stdin: bytes | None = None) -> HostResult:
    """Run `command` on `host`; stdin (if any) is written, then closed. Never raises
    for the host's failure: it is in the result's `error`."""
    return fan_out([host], command, settings, stdin=stdin)[0]


def resolve(host: str, settings: SshSettings) -> tuple[Endpoint, dict]:
    """How `fan_out` reaches `host` (ssh_config applied) and ssh_config's own options for it."""
    ctx = _Context(settings)
    try:
        return ctx.endpoint(host), dict(ctx.ssh_config.lookup(host))
    finally:
        ctx.close()


def fan_out(
    hosts: Iterable[str],
    command: str,
    settings: SshSettings,
    stdin: bytes | None = None,
    on_result: Callable[[HostResult], None] | None = None,
) -> list[HostResult]:
    """Run `command` on every host, at most `settings.fanout` at a time.

    Returns one result per host in the order given. `on_result` is called in the
    caller's thread as each host finishes (progress). Raises only for bad
    input shared by all hosts (an unreadable ssh_config).
    """
    names = list(hosts)
    if not names:
        return []
    results: list[HostResult | None] = [None] * len(names)
    processes = _process_count(settings, len(names))
    answers = (_fan_out_processes(names, command, settings, stdin, processes) if processes > 1
               else _fan_out_threads(names, command, settings, stdin))
    for index, result in answers:
        results[index] = result
        if on_result is not None:
            on_result(result)
    return [r for r in results if r is not None]


def _fan_out_threads(names: list[str], command: str, settings: SshSettings,
                     stdin: bytes | None) -> Iterator[tuple[int, HostResult]]:
    """(index, result) as each host finishes, from worker threads of this process."""
    ctx = _Context(settings)
    try:
        yield from _WorkerPool(ctx, names, command, stdin).results()
    finally:
        ctx.close()


# ----------------------------------------------------------------------------
# Fan-out over worker processes
#
# One interpreter runs one thread at a time, and through a jump host one transport
# thread carries every host's packets (each encrypted twice). With
# `fanout_processes` set, fan_out splits its hosts over that many forked worker
# processes, each a thread pool as above with its share of the fan-out and its own
# jump transport, sending results (and timelines) back over a pipe as they come.
# Off by default: measured on 2 cores it did not pay (see _process_count).

_WORKER_THREAD = "clusterkit-ssh"
# None: one process; an int: that many worker processes where forking is safe
fanout_processes: int | None = None


def _process_count(settings: SshSettings, hosts: int) -> int:
    """How many worker processes a fan-out of `hosts` hosts uses (1: threads here).

    One unless `fanout_processes` asks for more: on a loaded 2-core machine, two
    processes were no faster than one, directly or through a jump host, and cost
    0.3-0.6 s more CPU for 200 hosts (docs/benchmarks.md). And only where fork is
    safe: Linux; no SSH connection of this process live in another thread (a forked
    child inherits the locks, OpenSSL's among them, that a thread in the middle of a
    packet holds, without the thread); known_hosts only read (accept-new writes it,
    which processes would race on)."""
    if (fanout_processes is None or not sys.platform.startswith("linux") or not hasattr(os, "fork")
            or settings.host_key_policy == "accept-new" or _ssh_threads_running()):
        return 1
    return max(1, min(fanout_processes, hosts, settings.fanout))


def _ssh_threads_running() -> bool:
    """Whether an open paramiko transport or a fan-out worker thread runs here (a
    closed transport's thread may take 0.1 s more to end: it no longer encrypts)."""
    return any((thread.is_active() if isinstance(thread, paramiko.Transport)
                else thread.name == _WORKER_THREAD)
               for thread in threading.enumerate() if thread.is_alive())


def split_fanout(fanout: int, processes: int) -> list[int]:
    """Each process's share of `fanout` connections, the remainder to the first ones."""
    return [fanout // processes + (1 if k < fanout % processes else 0) for k in range(processes)]


class FrameReader:
    """Length-prefixed pickled messages from a worker's pipe, as bytes arrive."""

    HEADER = 4

    def __init__(self) -> None:
        self._buffer = bytearray()

    @staticmethod
    def frame(message: object) -> bytes:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        return len(data).to_bytes(FrameReader.HEADER, "big") + data

    def feed(self, data: bytes) -> list[object]:
        """The messages completed by `data`, in order; a partial one waits for more."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= self.HEADER:
            size = int.from_bytes(self._buffer[:self.HEADER], "big")
            if len(self._buffer) < self.HEADER + size:
                break
            messages.append(pickle.loads(bytes(self._buffer[self.HEADER:self.HEADER + size])))
            del self._buffer[:self.HEADER + size]
        return messages

    @property
    def pending(self) -> int:
        return len(self._buffer)


@dataclass
class _Shard:
    pid: int
    fd: int
    indexes: list[int]
    reader: FrameReader


def _fan_out_processes(names: list[str], command: str, settings: SshSettings,
                       stdin: bytes | None, processes: int) -> Iterator[tuple[int, HostResult]]:
    """(index, result) as each host finishes, from `processes` forked workers."""
    _load_ssh_config(settings.config_file)  # an unreadable config raises here, once
    shards: list[_Shard] = []
    try:
        for k, share in enumerate(split_fanout(settings.fanout, processes)):
            indexes = list(range(k, len(names), processes))
            shards.append(_start_shard(names, indexes, command, replace(settings, fanout=share), stdin))
        yield from _shard_results(names, shards)
    finally:
        for shard in shards:
            _stop_shard(shard)


def _start_shard(names: list[str], indexes: list[int], command: str, settings: SshSettings,
                 stdin: bytes | None) -> _Shard:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: never returns
        os.close(read_fd)
        _shard_main(write_fd, [names[i] for i in indexes], indexes, command, settings, stdin)
    os.close(write_fd)
    return _Shard(pid, read_fd, indexes, FrameReader())


def _shard_main(fd: int, names: list[str], indexes: list[int], command: str,
                settings: SshSettings, stdin: bytes | None) -> NoReturn:
    """A worker process: fan out over its hosts, send each answer, leave by _exit."""
    status = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it; the parent reports
        lock = threading.Lock()

        def send(message: object) -> None:
            data = FrameReader.frame(message)
            with lock:
                _write_all(fd, data)

        if _timeline_recorder is not None:
            set_timeline_recorder(lambda host, start, marks: send(("timeline", host, start, marks)))
        for position, result in _fan_out_threads(names, command, settings, stdin):
            send(("result", indexes[position], result))
        status = 0
    finally:
        os._exit(status)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _shard_results(names: list[str], shards: list[_Shard]) -> Iterator[tuple[int, HostResult]]:
    """Read every worker until its pipe closes; hosts a dead worker left unanswered
    get an error naming what happened to it."""
    open_fds = {shard.fd: shard for shard in shards}
    answered: set[int] = set()
    with selectors.DefaultSelector() as selector:
        for shard in shards:
            selector.register(shard.fd, selectors.EVENT_READ)
        while open_fds:
            for key, _ in selector.select():
                shard = open_fds[key.fd]  # type: ignore[index]
                data = os.read(shard.fd, READ_CHUNK)
                for message in shard.reader.feed(data):
                    kind, *rest = cast(tuple, message)
                    if kind == "result":
                        index, result = rest
                        answered.add(index)
                        yield index, result
                    elif kind == "timeline" and _timeline_recorder is not None:
                        _timeline_recorder(*rest)
                if not data:
                    selector.unregister(shard.fd)
                    del open_fds[shard.fd]
                    why = _reap_shard(shard)
                    for index in shard.indexes:
                        if index not in answered:
                            yield index, HostResult(names[index], False, None, "", "",
                                                    f"clusterkit worker process {why} before "
                                                    "this host was done", 0.0)


def _reap_shard(shard: _Shard) -> str:
    """Wait for a worker whose pipe closed; how it ended, in words."""
    with suppress(ChildProcessError):
        _, status = os.waitpid(shard.pid, 0)
        shard.pid = 0
        if os.WIFSIGNALED(status):
            return f"was killed by signal {os.WTERMSIG(status)}"
        return f"exited with status {os.WEXITSTATUS(status)}"
    return "ended"


def _stop_shard(shard: _Shard) -> None:
    """End a worker still running (the caller stopped early or was interrupted)."""
    with suppress(OSError):
        os.close(shard.fd)
    if shard.pid:
        with suppress(ProcessLookupError, ChildProcessError):
            os.kill(shard.pid, signal.SIGTERM)
            os.waitpid(shard.pid, 0)
        shard.pid = 0


class _WorkerPool:
    """Daemon worker threads over a queue of host indexes, plus a reaper.

    A worker stuck where nothing can interrupt it (a hanging DNS lookup) is
    written off after its deadline: its host gets an error, a fresh worker
    takes its place, and the process can still exit (daemon threads).
    """

    def __init__(self, ctx: _Context, names: list[str], command: str,
                 stdin: bytes | None) -> None:
        self._ctx = ctx
        self._names = names
        self._command = command
        self._stdin = stdin
        self._todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[int, HostResult]] = queue.SimpleQueue()
        self._running: dict[int, _Attempt] = {}
        self._lock = threading.Lock()
        self._default_budget = 2 * ctx.settings.connect_timeout + ctx.settings.command_timeout + GRACE_S
        for index in range(len(names)):
            self._todo.put(index)

    def results(self) -> Iterator[tuple[int, HostResult]]:
        """(index, result) pairs as hosts finish, each index exactly once."""
        for _ in range(min(self._ctx.settings.fanout, len(self._names))):
            self._start_worker()
        reported: set[int] = set()
        next_reap = time.monotonic()
        while len(reported) < len(self._names):
            if time.monotonic() >= next_reap:
                self._reap_stuck()
                next_reap = time.monotonic() + 0.25
            try:
                index, result = self._done.get(timeout=0.25)
            except queue.Empty:
                continue
            if index not in reported:
                reported.add(index)
                yield index, result

    def _start_worker(self) -> None:
        threading.Thread(target=self._work, name=_WORKER_THREAD, daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                index = self._todo.get_nowait()
            except queue.Empty:
                return
            attempt = _Attempt(self._default_budget)
            with self._lock:
                self._running[index] = attempt
            result = _run_host(self._ctx, self._names[index], self._command, self._stdin, attempt)
            with self._lock:
                written_off = self._running.pop(index, None) is None
            if written_off:
                return  # the reaper answered for this host and started a replacement
            self._done.put((index, result))

    def _reap_stuck(self) -> None:
        now = time.monotonic()
        with self._lock:
            stuck = [(i, a) for i, a in self._running.items() if now > a.deadline + GRACE_S]
            for index, _ in stuck:
                del self._running[index]
        for index, attempt in stuck:
            attempt.abort()
            self._done.put((index, _result(self._names[index], attempt,
                                           error=attempt.overrun_message())))
            self._start_worker()


# ----------------------------------------------------------------------------
# A session for several commands (the login runner)


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
        attempt = _Attempt(limit + GRACE_S)
        attempt.arm(limit + GRACE_S)
        try:
            return _run_on(self._transport, self.host, command, stdin, limit, attempt)
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
    ctx = _Context(settings)
    attempt = _Attempt(2 * settings.connect_timeout + GRACE_S)
    try:
        transport = _connect_host(ctx, host, attempt)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one clear message
        ctx.close()
        raise SshConnectError(host, _failure_message(exc, attempt), _failure_fix(exc, attempt)) from None
    finally:
        attempt.disarm()
    session = SshSession(host, transport, settings)
    try:
        yield session
    finally:
        session.close()
        ctx.close()
