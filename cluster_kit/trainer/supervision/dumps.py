"""A rank's answers to the supervisor: its stacks and Flight Recorder on a dump request,
and on an uncaught exception or a fatal signal (stdlib only: torch's recorder is read
through ``sys.modules`` when the trainer has loaded torch.distributed, never imported)."""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from cluster_kit.trainer import contract

from .files import log_once, make_dir, open_private, write_private

FR_TIMEOUT_S = 20.0  # a Flight Recorder dump that takes longer is left out, the stack stays
EXIT_FR_TIMEOUT_S = 5.0  # at an uncaught exception: the process is on its way out, keep it short
# torch._C._distributed_c10d's JSON dumps: the generic recorder (gloo and other
# CPU backends) and, in CUDA builds, NCCL's own.
FR_DUMPERS = (("fr", "_dump_fr_trace_json"), ("nccl", "_dump_nccl_trace_json"))


@dataclass(frozen=True)
class Rank:
    """Who writes: the control folder, the rank, its node (Slurm's name) and its process,
    and where its finished steps are counted."""

    control_dir: str
    rank: int
    host: str
    pid: int
    steps: Callable[[], int]

    def path(self, folder: str, suffix: str = "") -> str:
        return contract.rank_path(self.control_dir, folder, self.rank, suffix)

    def header(self, **more: object) -> str:
        return contract.header_text({"rank": self.rank, "host": self.host, "pid": self.pid,
                                     "steps": self.steps(), "time": f"{time.time():.3f}", **more})


def flight_recorder(who: Rank, timeout_s: float = FR_TIMEOUT_S) -> dict[str, Any]:
    """Each Flight Recorder of this process as parsed JSON, with who wrote it.

    The recorders together get `timeout_s`; one that has not answered by then is
    named in ``errors``.
    """
    deadline = time.monotonic() + timeout_s
    out: dict[str, Any] = {
        "format": contract.DUMP_FORMAT, "rank": who.rank, "host": who.host, "pid": who.pid,
        "steps": who.steps(), "time": round(time.time(), 3), "recorders": {}, "errors": {},
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
            out["recorders"][name] = json.loads(call_with_timeout(dumper, left))
        except Exception as exc:  # noqa: BLE001 - one recorder failing keeps the others
            out["errors"][name] = f"{function}: {exc}"
    return out


def call_with_timeout(function: Callable[[], bytes], timeout_s: float) -> bytes:
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
    return bytes(result[0])


class DumpResponder:
    """Answers each new id in ``dump-request`` once: the rank's stack, its Flight Recorder
    JSON and then a ``.done`` marker in ``dumps/<id>/``."""

    def __init__(self, who: Rank) -> None:
        self.who = who
        self._request_stat: tuple[int, int, int] | None = None
        self._handled: set[str] = set()

    def new_request(self) -> str | None:
        """The id in ``dump-request`` when this rank has not answered it yet, else None."""
        path = os.path.join(self.who.control_dir, contract.DUMP_REQUEST)
        try:
            st = os.stat(path)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._request_stat:
            return None
        self._request_stat = stamp
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                request = f.read(200).strip()
        except OSError:
            return None
        if not contract.REQUEST_ID.match(request):
            log_once(f"ignoring dump-request {request[:70]!r}: not a request id")
            return None
        done = os.path.join(self.who.control_dir, contract.DUMPS, request,
                            contract.rank_name(self.who.rank, contract.DONE))
        if request in self._handled or os.path.exists(done):
            return None
        return request

    def dump(self, request: str) -> str:
        """Write this rank's stack, Flight Recorder JSON and then ``.done``; the folder."""
        self._handled.add(request)
        folder = os.path.join(self.who.control_dir, contract.DUMPS, request)
        make_dir(folder)
        base = os.path.join(folder, contract.rank_name(self.who.rank))
        self.write_stack(base + contract.STACK)
        write_private(base + contract.FLIGHT_RECORDER, json.dumps(flight_recorder(self.who)).encode())
        write_private(base + contract.DONE, b"")
        return folder

    def write_stack(self, path: str) -> None:
        """A header (rank, host, pid, steps, the main thread's id) and every thread's stack."""
        main = threading.main_thread().ident or 0
        fd = open_private(path)
        try:
            os.write(fd, self.who.header(main_thread=f"0x{main:016x}").encode())
            faulthandler.dump_traceback(fd, all_threads=True)
        finally:
            os.close(fd)


class CrashFiles:
    """What a failing rank leaves: its traceback and Flight Recorder on an uncaught
    exception (``exceptions/``), every thread's stack on a fatal signal (``faults/``)."""

    def __init__(self, who: Rank) -> None:
        self.who = who
        self._previous: Callable[..., Any] | None = None
        self._fault_file: Any = None

    def install(self) -> None:
        self._previous = sys.excepthook
        sys.excepthook = self._excepthook
        self._enable_faulthandler()

    def _excepthook(self, kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        try:
            if os.getpid() == self.who.pid:  # a forked child is not the rank
                self.write_exception(kind, value, tb)
        finally:
            (self._previous or sys.__excepthook__)(kind, value, tb)

    def write_exception(self, kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        """``exceptions/rank-<R>.txt`` (rank, host, pid, time, then the traceback), then
        ``exceptions/rank-<R>.fr.json``, this rank's Flight Recorder.

        The traceback goes first: it matters most, and the dump may take seconds. A
        rank that failed because a peer did not come (a collective timeout, a closed
        connection) shows in its dump which collective it waited in, which tells the
        supervisor whom it waited for.
        """
        text = self.who.header() + "".join(traceback.format_exception(kind, value, tb))
        try:
            make_dir(os.path.join(self.who.control_dir, contract.EXCEPTIONS))
            write_private(self.who.path(contract.EXCEPTIONS, contract.TEXT), text.encode())
            dump = flight_recorder(self.who, EXIT_FR_TIMEOUT_S)
            write_private(self.who.path(contract.EXCEPTIONS, contract.FLIGHT_RECORDER), json.dumps(dump).encode())
        except OSError as exc:
            log_once(f"cannot write the exception file of rank {self.who.rank}: {exc}")

    def _enable_faulthandler(self) -> None:
        """Fatal signals (SIGSEGV, SIGABRT, ...) write every thread's stack to the fault file."""
        try:
            make_dir(os.path.join(self.who.control_dir, contract.FAULTS))
            fd = open_private(self.who.path(contract.FAULTS, contract.TEXT))
        except OSError as exc:
            log_once(f"cannot open the fault file of rank {self.who.rank}: {exc}")
            return
        self._fault_file = os.fdopen(fd, "w")
        faulthandler.enable(self._fault_file, all_threads=True)
