"""Run one command on one host or on hundreds over SSH (`run`, `fan_out`).

`fan_out` returns one `HostResult` per host, in the order given, and never
raises for a host's failure; every step has a deadline.
"""
from __future__ import annotations

import os
import pickle
import queue
import selectors
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any, NoReturn, cast

import paramiko  # after ssh/deferred.py (ssh/__init__.py)

from cluster_kit.ssh.config_index import load_ssh_config
from cluster_kit.ssh.context import Context
from cluster_kit.ssh.deadlines import GRACE_S, Attempt
from cluster_kit.ssh.execute import READ_CHUNK
from cluster_kit.ssh.hosts import (
    connect_host,
    failure_fix,
    failure_message,
    host_result,
    run_on,
)
from cluster_kit.ssh.results import HostResult
from cluster_kit.ssh.settings import (
    Endpoint,
    SshSettings,
)
from cluster_kit.ssh.timeline import set_timeline_recorder, timeline_recorder

# ----------------------------------------------------------------------------
# One host, start to finish


def _run_host(ctx: Context, host: str, command: str, stdin: bytes | None,
              attempt: Attempt) -> HostResult:
    """Connect, run, disconnect; any failure becomes the result's error."""
    transport: paramiko.Transport | None = None
    try:
        transport = connect_host(ctx, host, attempt)
        return run_on(transport, host, command, stdin, ctx.settings.command_timeout, attempt)
    except Exception as exc:  # noqa: BLE001 - a host's failure is data, not an exception
        return host_result(host, attempt, error=failure_message(exc, attempt), fix=failure_fix(exc, attempt))
    finally:
        attempt.disarm()
        if transport is not None:
            transport.close()
        if attempt.marks is not None:
            attempt.mark("closed")
            _record_timeline(host, attempt)


def _record_timeline(host: str, attempt: Attempt) -> None:
    recorder = timeline_recorder()
    if recorder is not None and attempt.marks is not None:
        recorder(host, attempt.started, list(attempt.marks))


# ----------------------------------------------------------------------------
# Public API


def run(host: str, command: str, settings: SshSettings, stdin: bytes | None = None) -> HostResult:
    """Run `command` on `host`; stdin (if any) is written, then closed. Never raises
    for the host's failure: it is in the result's `error`."""
    return fan_out([host], command, settings, stdin=stdin)[0]


def resolve(host: str, settings: SshSettings) -> tuple[Endpoint, dict[str, Any]]:
    """How `fan_out` reaches `host` (ssh_config applied) and ssh_config's own options for it."""
    ctx = Context(settings)
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
    processes = process_count(settings, len(names))
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
    ctx = Context(settings)
    try:
        yield from _WorkerPool(ctx, names, command, stdin).results()
    finally:
        ctx.close()


# ----------------------------------------------------------------------------
# Fan-out over worker processes


_WORKER_THREAD = "clusterkit-ssh"


# None: one process; an int: that many worker processes where forking is safe
fanout_processes: int | None = None


def process_count(settings: SshSettings, hosts: int) -> int:
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
    load_ssh_config(settings.config_file)  # an unreadable config raises here, once
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

        if timeline_recorder() is not None:
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
                shard = open_fds[key.fd]
                data = os.read(shard.fd, READ_CHUNK)
                for message in shard.reader.feed(data):
                    kind, *rest = cast("tuple[Any, ...]", message)
                    if kind == "result":
                        index, result = rest
                        answered.add(index)
                        yield index, result
                    elif kind == "timeline" and (recorder := timeline_recorder()) is not None:
                        recorder(*rest)
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

    def __init__(self, ctx: Context, names: list[str], command: str,
                 stdin: bytes | None) -> None:
        self._ctx = ctx
        self._names = names
        self._command = command
        self._stdin = stdin
        self._todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[int, HostResult]] = queue.SimpleQueue()
        self._running: dict[int, Attempt] = {}
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
            attempt = Attempt(self._default_budget)
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
            self._done.put((index, host_result(self._names[index], attempt,
                                               error=attempt.overrun_message())))
            self._start_worker()
