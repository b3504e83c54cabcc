"""The trainer's side of a supervised job: heartbeats, the stop signal, dumps on request.

A job with ``resilience:`` runs a supervisor in its batch script that talks to the
ranks only through files in one folder every node sees, ``$CLUSTERKIT_CONTROL_DIR``
(docs/architecture.md, "Supervised ranks"). Per rank this module

* writes ``heartbeat/rank-<RANK>`` (``<steps> <unix_time> <host> <pid> [pause]``) at the
  first :func:`heartbeat` and then at most once per ``CLUSTERKIT_HEARTBEAT_INTERVAL``
  seconds; a call is a clock read and a compare almost always; :func:`paused` writes
  it at once when a pause begins and ends (``paused:<since>`` / ``resumed:<at>``),
  which stops the supervisor's hang clock for a save or an evaluation;
* runs one daemon thread that polls the folder: ``stop`` (and SIGUSR1, or SIGTERM:
  the time limit, preemption) turn :func:`stop_requested` True; a new id in ``dump-request`` makes the rank write its
  Python stacks, its Flight Recorder history as JSON and then a ``.done`` marker;
* writes ``stopped/rank-<RANK>`` (``<cause> <unix_time>``) the first time it is told to
  stop (``SIGTERM``, ``SIGUSR1`` or ``stop file``), and ``finished/rank-<RANK>``
  (``<steps> <unix_time>``) once the script reports that training is done
  (:func:`finished`, :func:`cluster_kit.checkpoint.wait` with no stop asked, or the end
  of a process that ran ``build_step`` and was never told to stop): an attempt that
  stopped without finishing is requeued, never counted as completed;
* writes ``exceptions/rank-<RANK>.txt`` on an uncaught exception, then its Flight
  Recorder beside it (``exceptions/rank-<RANK>.fr.json``, within a few seconds: a
  rank that failed waiting in a collective shows which one), and lets faulthandler
  write fatal signals to ``faults/rank-<RANK>.txt``.

Every file names the rank's node as Slurm does (``SLURMD_NODENAME``, set in every
task), else its host name: the supervisor excludes nodes by their Slurm names.

Without ``CLUSTERKIT_CONTROL_DIR`` every call is a cheap no-op. Files are 0600,
folders 0700. The module imports only the stdlib: torch's Flight Recorder is read
through ``sys.modules`` when the trainer has loaded torch.distributed, never
imported here. ``cluster_kit.ddp`` re-exports the public calls.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

CONTROL_DIR_ENV = "CLUSTERKIT_CONTROL_DIR"
INTERVAL_ENV = "CLUSTERKIT_HEARTBEAT_INTERVAL"
DEFAULT_INTERVAL_S = 1.0
DEFAULT_PAUSE_MAX_S = 1800.0  # paused() longer than this is a hang after all (a save stuck on a hung file system)
STOPPED = "stopped"  # the control folder's sub-folder: rank-<R> = `<cause> <time>`, written once
FINISHED = "finished"  # rank-<R> = `<steps> <time>`: the script said training is done
POLL_S = 0.5  # the watcher's stat of `stop` and `dump-request`
FR_TIMEOUT_S = 20.0  # a Flight Recorder dump that takes longer is left out, the stack stays
EXIT_FR_TIMEOUT_S = 5.0  # at an uncaught exception: the process is on its way out, keep it short
DUMP_FORMAT = "clusterkit.fr/1"
# A request id names a folder: one token, no path separators, no dot-only names.
REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# torch._C._distributed_c10d's JSON dumps: the generic recorder (gloo and other
# CPU backends) and, in CUDA builds, NCCL's own.
FR_DUMPERS = (("fr", "_dump_fr_trace_json"), ("nccl", "_dump_nccl_trace_json"))

LOG = logging.getLogger("cluster_kit.ddp")


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
    text = env.get(INTERVAL_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value >= 0 else DEFAULT_INTERVAL_S


def _make_dir(path: str) -> None:
    """A folder of this user only (0700), parents included."""
    os.makedirs(path, mode=0o700, exist_ok=True)


def _open_private(path: str, truncate: bool = True) -> int:
    """An fd for writing a 0600 file (created when missing)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an earlier attempt keeps no wider mode
    return fd


def write_private(path: str, data: bytes) -> None:
    """Write a whole 0600 file."""
    fd = _open_private(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def header_text(fields: dict[str, object]) -> str:
    """``key: value`` lines and a blank line: how stack and exception files begin."""
    lines = [f"{key}: {value}" for key, value in fields.items()]
    return "\n".join(lines) + "\n\n"


class Supervision:
    """One rank's link to the supervisor through the control folder.

    Build it with :func:`enable_supervision` (which reads the environment);
    :meth:`beat` is the hot path. :meth:`start` installs the hooks (exception
    file, faulthandler, SIGUSR1) and the watcher thread.
    """

    def __init__(self, control_dir: str, rank: int, interval_s: float = DEFAULT_INTERVAL_S,
                 host: str | None = None, poll_s: float = POLL_S) -> None:
        self.control_dir = control_dir
        self.rank = rank
        self.interval_s = interval_s
        self.host = host or node_from_env()
        self.pid = os.getpid()
        self.poll_s = poll_s
        self.steps = 0
        self.stop = False
        self._next_write = 0.0  # monotonic time of the next write; 0 = at the next beat
        self._last_beat = 0.0
        self._written_steps = -1
        self._pauses = 0  # nesting depth of paused()
        self.pause_reason = ""
        self._stop_noted = False
        self._finished = False
        self._exit_hooked = False
        self._pause_mark = ""  # "paused:<since>" while paused, "resumed:<at>" after the last pause
        self._fd: int | None = None
        self._length = 0
        self._lock = threading.Lock()  # the main thread and the watcher both write the heartbeat
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._request_stat: tuple[int, int, int] | None = None
        self._handled: set[str] = set()
        self._fault_file: Any = None
        self._previous_excepthook: Callable[..., Any] | None = None

    def path(self, *parts: str) -> str:
        return os.path.join(self.control_dir, *parts)

    # --- heartbeat -------------------------------------------------------------------
    def beat(self) -> None:
        """Count one step; write the heartbeat when the interval has passed."""
        self.steps += 1
        now = time.monotonic()
        self._last_beat = now
        if now >= self._next_write:
            self.write_heartbeat()

    def write_heartbeat(self) -> None:
        """Write ``<steps> <unix_time> <host> <pid>`` at offset 0 of the rank's file.

        The time is when the counted step ended, so a line the watcher writes after
        the loop stopped still says when progress stopped. Never raises: a missing
        folder must not stop the training.
        """
        with self._lock:
            now = time.monotonic()
            self._next_write = now + self.interval_s
            if os.getpid() != self.pid:  # a forked child (a data loader worker) is no rank
                self._next_write = float("inf")
                return
            steps, when = self.steps, time.time() - (now - self._last_beat)
            mark = f" {self._pause_mark}" if self._pause_mark else ""
            line = f"{steps} {when:.3f} {self.host} {self.pid}{mark}\n".encode()
            try:
                self._pwrite(line)
            except OSError as exc:
                _log_once(f"cannot write the heartbeat of rank {self.rank}: {exc}")
                return
            self._written_steps = steps

    def _pwrite(self, line: bytes) -> None:
        if self._fd is None:
            _make_dir(self.path("heartbeat"))
            self._fd = _open_private(self.path("heartbeat", f"rank-{self.rank}"))
        os.pwrite(self._fd, line, 0)
        if len(line) < self._length:
            os.ftruncate(self._fd, len(line))
        self._length = len(line)

    def pause(self, reason: str, max_s: float = DEFAULT_PAUSE_MAX_S) -> None:
        """The hang clock stops from now until :meth:`resume` (pauses nest), for at most
        `max_s` seconds: a pause that lasts longer is a hang, named with its reason."""
        with self._lock:
            self._pauses += 1
            if self._pauses == 1:
                quoted = urllib.parse.quote(reason[:200], safe="")
                self._pause_mark = f"paused:{time.time():.3f}:{float(max_s):g}:{quoted}"
                self.pause_reason = reason
        self._write_now()

    def resume(self) -> None:
        """The pause begun last ends; the clock starts again when the outermost one does."""
        with self._lock:
            self._pauses = max(0, self._pauses - 1)
            if self._pauses == 0:
                self._pause_mark = f"resumed:{time.time():.3f}"
        self._write_now()

    def _write_now(self) -> None:
        self._next_write = 0.0
        self.write_heartbeat()

    def note_stop(self, cause: str) -> None:
        """Turn stop_requested() on, and tell the supervisor once why (``stopped/rank-R``):
        an attempt whose ranks stopped without finishing is requeued, not completed."""
        self.stop = True
        if self._stop_noted or os.getpid() != self.pid:
            return
        self._stop_noted = True
        self._write_note(STOPPED, f"{cause} {time.time():.3f}\n")

    def finish(self) -> None:
        """Tell the supervisor that training is done (``finished/rank-R``), once."""
        if self._finished or os.getpid() != self.pid:
            return
        self._finished = True
        self._write_note(FINISHED, f"{self.steps} {time.time():.3f}\n")

    def _write_note(self, folder: str, text: str) -> None:
        try:
            _make_dir(self.path(folder))
            write_private(self.path(folder, f"rank-{self.rank}"), text.encode())
        except OSError as exc:
            _log_once(f"cannot write {folder}/rank-{self.rank}: {exc}")

    def flush_heartbeat(self) -> None:
        """Write the last counted steps once the loop has stopped beating (watcher side)."""
        if 0 < self.steps != self._written_steps and time.monotonic() >= self._next_write:
            self.write_heartbeat()

    # --- the watcher -------------------------------------------------------------------
    def start(self) -> None:
        """Install the exception, fault and SIGUSR1 hooks and start the watcher thread."""
        if self._thread is not None:
            return
        _make_dir(self.control_dir)
        self._install_excepthook()
        self._enable_faulthandler()
        self._install_sigusr1()
        self._install_sigterm()
        self._thread = threading.Thread(target=self._watch, name="clusterkit-watcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the watcher (tests; a training process just exits)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._closed.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any surprise
                _log_once(f"supervision watcher of rank {self.rank}: {exc!r}")
            self._closed.wait(self.poll_s)

    def poll_once(self) -> None:
        """One look at the folder: the stop file, a new dump request, a stale heartbeat."""
        if not self.stop and os.path.exists(self.path("stop")):
            self.note_stop("stop-file")
        request = self.new_request()
        if request is not None:
            self.dump(request)
        self.flush_heartbeat()

    def new_request(self) -> str | None:
        """The id in ``dump-request`` when this rank has not answered it yet, else None."""
        try:
            st = os.stat(self.path("dump-request"))
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._request_stat:
            return None
        self._request_stat = stamp
        try:
            with open(self.path("dump-request"), encoding="utf-8", errors="replace") as f:
                request = f.read(200).strip()
        except OSError:
            return None
        if not REQUEST_ID.match(request):
            _log_once(f"ignoring dump-request {request[:70]!r}: not a request id")
            return None
        done = self.path("dumps", request, f"rank-{self.rank}.done")
        if request in self._handled or os.path.exists(done):
            return None
        return request

    # --- dumps ------------------------------------------------------------------------
    def dump(self, request: str) -> str:
        """Write this rank's stack, Flight Recorder JSON and then ``.done``; the folder."""
        self._handled.add(request)
        folder = self.path("dumps", request)
        _make_dir(folder)
        base = os.path.join(folder, f"rank-{self.rank}")
        self.write_stack(base + ".stack")
        write_private(base + ".fr.json", json.dumps(self.flight_recorder()).encode())
        write_private(base + ".done", b"")
        return folder

    def write_stack(self, path: str) -> None:
        """A header (rank, host, pid, steps, the main thread's id) and every thread's stack."""
        main = threading.main_thread().ident or 0
        header = header_text({
            "rank": self.rank, "host": self.host, "pid": self.pid, "steps": self.steps,
            "time": f"{time.time():.3f}", "main_thread": f"0x{main:016x}",
        })
        fd = _open_private(path)
        try:
            os.write(fd, header.encode())
            faulthandler.dump_traceback(fd, all_threads=True)
        finally:
            os.close(fd)

    def flight_recorder(self, timeout_s: float = FR_TIMEOUT_S) -> dict[str, Any]:
        """Each Flight Recorder of this process as parsed JSON, with who wrote it.

        The recorders together get `timeout_s`; one that has not answered by then
        is named in ``errors``.
        """
        deadline = time.monotonic() + timeout_s
        out: dict[str, Any] = {
            "format": DUMP_FORMAT, "rank": self.rank, "host": self.host, "pid": self.pid,
            "steps": self.steps, "time": round(time.time(), 3), "recorders": {}, "errors": {},
        }
        c10d = sys.modules.get("torch._C._distributed_c10d")
        if c10d is None:
            out["errors"]["torch"] = "torch.distributed is not loaded in this process"
            return out
        for name, function in FR_DUMPERS:
            dumper = getattr(c10d, function, None)
            if dumper is None:
                continue
            try:
                left = max(0.0, deadline - time.monotonic())
                out["recorders"][name] = json.loads(_call_with_timeout(dumper, left))
            except Exception as exc:  # noqa: BLE001 - one recorder failing keeps the others
                out["errors"][name] = f"{function}: {exc}"
        return out

    # --- hooks ------------------------------------------------------------------------
    def _install_excepthook(self) -> None:
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook

    def _excepthook(self, kind: type[BaseException], value: BaseException,
                    tb: TracebackType | None) -> None:
        try:
            if os.getpid() == self.pid:  # a forked child is not the rank
                self.write_exception(kind, value, tb)
        finally:
            previous = self._previous_excepthook or sys.__excepthook__
            previous(kind, value, tb)

    def write_exception(self, kind: type[BaseException], value: BaseException,
                        tb: TracebackType | None) -> None:
        """``exceptions/rank-<RANK>.txt`` (rank, host, pid, time, then the traceback),
        then ``exceptions/rank-<RANK>.fr.json``, this rank's Flight Recorder.

        The traceback goes first: it matters most, and the dump may take seconds.
        A rank that failed because a peer did not come (a collective timeout, a
        closed connection) shows in its dump which collective it waited in, which
        tells the supervisor whom it waited for.
        """
        header = header_text({"rank": self.rank, "host": self.host, "pid": self.pid,
                              "steps": self.steps, "time": f"{time.time():.3f}"})
        text = header + "".join(traceback.format_exception(kind, value, tb))
        try:
            _make_dir(self.path("exceptions"))
            write_private(self.path("exceptions", f"rank-{self.rank}.txt"), text.encode())
            dump = self.flight_recorder(EXIT_FR_TIMEOUT_S)
            write_private(self.path("exceptions", f"rank-{self.rank}.fr.json"), json.dumps(dump).encode())
        except OSError as exc:
            _log_once(f"cannot write the exception file of rank {self.rank}: {exc}")

    def _enable_faulthandler(self) -> None:
        """Fatal signals (SIGSEGV, SIGABRT, ...) write every thread's stack to the fault file."""
        try:
            _make_dir(self.path("faults"))
            fd = _open_private(self.path("faults", f"rank-{self.rank}.txt"))
        except OSError as exc:
            _log_once(f"cannot open the fault file of rank {self.rank}: {exc}")
            return
        self._fault_file = os.fdopen(fd, "w")
        faulthandler.enable(self._fault_file, all_threads=True)

    def _install_sigusr1(self) -> None:
        """SIGUSR1 turns stop_requested() True; a handler set before keeps running."""
        self._on_signal(signal.SIGUSR1)

    def _install_sigterm(self) -> None:
        """SIGTERM (the time limit, preemption, scancel: Slurm's SIGKILL follows after
        KillWait or GraceTime) also turns stop_requested() True, so that the rank can
        still checkpoint and return; a second SIGTERM ends it as the default would."""
        self._on_signal(signal.SIGTERM, second_ends=True)

    def _on_signal(self, signum: int, second_ends: bool = False) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        previous = signal.getsignal(signum)
        seen: list[int] = []

        def handler(number: int, frame: Any) -> None:
            self.note_stop(signal.Signals(number).name)
            seen.append(number)
            if callable(previous):
                previous(number, frame)
            elif second_ends and len(seen) > 1 and previous == signal.SIG_DFL:
                signal.signal(number, signal.SIG_DFL)
                os.kill(os.getpid(), number)

        signal.signal(signum, handler)


class _Off:
    """What the calls talk to without ``CLUSTERKIT_CONTROL_DIR``: nothing."""

    stop = False

    def beat(self) -> None:
        pass

    def pause(self, reason: str, max_s: float = DEFAULT_PAUSE_MAX_S) -> None:
        pass

    def finish(self) -> None:
        pass

    def resume(self) -> None:
        pass


_OFF = _Off()
_ACTIVE: Any = None  # Supervision, _OFF, or None before the first call
_ENABLE_LOCK = threading.Lock()
_LOGGED: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        LOG.warning(message)


def _call_with_timeout(function: Callable[[], bytes], timeout_s: float) -> bytes:
    """``function()`` on a helper thread; TimeoutError when it has not returned in time."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(function())
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            result.append(exc)

    helper = threading.Thread(target=run, name="clusterkit-fr-dump", daemon=True)
    helper.start()
    helper.join(timeout_s)
    if not result:
        raise TimeoutError(f"no answer in {round(timeout_s, 1):g} s")
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def enable_supervision(environ: Mapping[str, str] | None = None) -> Supervision | None:
    """Start this rank's supervision when ``CLUSTERKIT_CONTROL_DIR`` is set (once).

    The first :func:`heartbeat` and ``build_step`` call it; a script may call it
    earlier so that a hang before the first step can be diagnosed too. Returns
    the rank's :class:`Supervision`, or None when the job is not supervised.
    """
    global _ACTIVE
    with _ENABLE_LOCK:
        if _ACTIVE is None:
            env = os.environ if environ is None else environ
            folder = env.get(CONTROL_DIR_ENV, "").strip()
            _ACTIVE = _start(folder, env) if folder else _OFF
    return _ACTIVE if isinstance(_ACTIVE, Supervision) else None


def _start(folder: str, env: Mapping[str, str]) -> Any:
    link = Supervision(folder, rank_from_env(env), interval_from_env(env), node_from_env(env))
    try:
        link.start()
    except OSError as exc:
        _log_once(f"supervision is off: cannot use {CONTROL_DIR_ENV}={folder}: {exc}")
        return _OFF
    return link


def heartbeat() -> None:
    """Report one finished training step to the job's supervisor (no-op when unsupervised).

    ``build_step``'s steps call it by themselves; any other loop calls it once a step.
    """
    (_ACTIVE or _enabled()).beat()


def stop_requested() -> bool:
    """True once the job was asked to stop (time limit or preemption ahead).

    The script then saves a checkpoint and returns normally; the job is requeued.
    """
    return bool((_ACTIVE or _enabled()).stop)


def finished() -> None:
    """Report that training is done (no-op when unsupervised).

    An attempt whose ranks were told to stop (the time limit, preemption) and exited
    without this report is requeued to go on from its checkpoint; with it, the chain
    is completed. :func:`cluster_kit.checkpoint.wait` reports it when no stop was asked.
    """
    (_ACTIVE or _enabled()).finish()


def finish_at_exit() -> None:
    """At the process's normal exit, report :func:`finished` unless a stop was asked
    (``build_step`` calls it: a loop that ran out of steps is done)."""
    link = _ACTIVE or _enabled()
    if isinstance(link, Supervision) and not link._exit_hooked:
        link._exit_hooked = True
        atexit.register(lambda: None if link.stop else link.finish())


@contextlib.contextmanager
def paused(reason: str = "paused", max_s: float = DEFAULT_PAUSE_MAX_S) -> Iterator[None]:
    """Stop the job's hang clock while the block runs (a checkpoint save, an evaluation).

    While any rank is inside, no rank counts as hung; when the last one leaves, every
    rank's clock starts again from then. A pause longer than ``max_s`` seconds (default
    30 minutes: a save stuck on a hung file system) is a hang after all, and the
    diagnosis names ``reason``. A no-op when the job is not supervised.
    """
    link = _ACTIVE or _enabled()
    link.pause(reason, max_s)
    try:
        yield
    finally:
        link.resume()


def _enabled() -> Any:
    enable_supervision()
    return _ACTIVE
