"""The files supervised ranks write in the control folder, read back (pure parsers + one reader).

What each file is and how it is written is :mod:`cluster_kit.trainer.contract`'s; this
module reads a folder of them for the diagnosis: heartbeats, the stacks and Flight
Recorder dumps of a dump request, exception and fault files, NCCL's own timeout dumps,
and the ranks' stop and finish notes.

Stdlib only, Python 3.8+: the job's supervisor runs this from a zip app.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from cluster_kit.trainer import contract
from cluster_kit.trainer.contract import Heartbeat, Note, parse_header, parse_heartbeat

from .flight_recorder import DumpError, RankDump, parse_dump, parse_dump_bytes

# faulthandler: `Thread 0x00007f... (most recent call first):` (`Current thread` for the caller)
THREAD_LINE = re.compile(r"(Current thread|Thread) (0x[0-9a-fA-F]+)\b.*:\s*\Z")
# faulthandler: `  File "x.py", line 8 in f`; traceback: `  File "x.py", line 8, in f`
FRAME_LINE = re.compile(r'\s+File "(?P<path>.*)", line (?P<line>\d+),? in (?P<function>.*?)\s*\Z')
# Frames of Python itself, of installed packages and of clusterkit are not the user's code.
LIBRARY_PATH = re.compile(r"(^<)|/site-packages/|/dist-packages/|/lib/python3\.\d+/|/cluster_kit/")
MAX_FILE_BYTES = 4 << 20  # dumps are KBs; anything bigger is read only this far


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str

    def short(self) -> str:
        """``train.py:88 in load_batch``."""
        return f"{os.path.basename(self.path)}:{self.line} in {self.function}"

    @property
    def is_library(self) -> bool:
        return bool(LIBRARY_PATH.search(self.path))


@dataclass(frozen=True)
class ThreadStack:
    ident: str  # "0x00007f..."
    current: bool  # the thread that wrote the dump (the rank's watcher)
    frames: tuple[Frame, ...]  # innermost first, as faulthandler prints them


@dataclass(frozen=True)
class StackDump:
    """A rank's ``.stack`` file: its header and every thread's frames."""

    header: dict[str, str]
    threads: tuple[ThreadStack, ...]
    text: str

    def main_thread(self) -> ThreadStack | None:
        """The training thread: the header's main_thread, else the first one that did not write the dump."""
        wanted = self.header.get("main_thread", "").lower()
        for thread in self.threads:
            if thread.ident.lower() == wanted:
                return thread
        return next((t for t in self.threads if not t.current), None)

    def where(self) -> Frame | None:
        """The main thread's innermost frame in the user's code (else its innermost frame)."""
        thread = self.main_thread()
        if thread is None or not thread.frames:
            return None
        return user_frame(thread.frames)


@dataclass(frozen=True)
class ExceptionReport:
    """A rank's exception (or fault) file: who, when, and the text."""

    rank: int
    host: str
    time: float | None
    text: str  # the traceback (faulthandler's output for a fault)
    fault: bool = False

    def last_lines(self, count: int = 5) -> tuple[str, ...]:
        lines = [line for line in self.text.splitlines() if line.strip()]
        return tuple(lines[-count:])

    def frames(self) -> tuple[Frame, ...]:
        """The failing thread's frames, innermost first (a traceback lists them outermost first)."""
        if self.fault:
            return _failing_thread(parse_stack(self.text).threads)
        return tuple(reversed(_frames(self.text.splitlines())))


def _failing_thread(threads: tuple[ThreadStack, ...]) -> tuple[Frame, ...]:
    """The frames of the thread a fatal signal hit; when that was no Python thread (a
    C++ thread's abort), the first thread in the user's code, the one that trains."""
    crashed = next((t for t in threads if t.current), None)
    crashed = crashed or next((t for t in threads if any(not f.is_library for f in t.frames)), None)
    crashed = crashed or (threads[0] if threads else None)
    return crashed.frames if crashed else ()


def user_frame(frames: tuple[Frame, ...]) -> Frame:
    """The innermost frame that is the user's code, else the innermost one."""
    return next((f for f in frames if not f.is_library), frames[0])


def read_notes(control_dir: str, kind: str) -> dict[int, Note]:
    """``{rank: Note}`` of the ``stopped`` or ``finished`` files of every rank (unreadable ones left out)."""
    notes = {}
    for rank, path in rank_paths(os.path.join(control_dir, kind), "").items():
        try:
            notes[rank] = contract.parse_note(read_text(path), rank)
        except (OSError, ValueError):
            continue
    return notes


def parse_stack(text: str) -> StackDump:
    """A ``.stack`` file (or any faulthandler output) into threads and frames."""
    header, body = parse_header(text)
    threads: list[ThreadStack] = []
    opened: re.Match[str] | None = None
    lines: list[str] = []
    for line in body.splitlines():
        match = THREAD_LINE.match(line)
        if match:
            _close_thread(threads, opened, lines)
            opened, lines = match, []
        elif opened is not None:
            lines.append(line)
    _close_thread(threads, opened, lines)
    return StackDump(header, tuple(threads), text)


def _close_thread(threads: list[ThreadStack], opened: re.Match[str] | None, lines: list[str]) -> None:
    if opened is not None:
        threads.append(ThreadStack(opened.group(2), opened.group(1) == "Current thread", _frames(lines)))


def _frames(lines: list[str]) -> tuple[Frame, ...]:
    found = (FRAME_LINE.match(line) for line in lines)
    return tuple(Frame(m.group("path"), int(m.group("line")), m.group("function")) for m in found if m)


def parse_exception(text: str, rank: int, mtime: float | None = None, fault: bool = False) -> ExceptionReport:
    """An exception file (header + traceback) or a fault file (faulthandler's text, no header)."""
    header, body = parse_header(text)
    when = header.get("time")
    return ExceptionReport(rank, header.get("host", ""), float(when) if when else mtime, body, fault)


# --- reading a control folder -----------------------------------------------------------------
@dataclass(frozen=True)
class RankFiles:
    """What one rank left for the supervisor."""

    rank: int
    heartbeat: Heartbeat | None = None
    stack: StackDump | None = None
    dump: RankDump | None = None
    problems: tuple[str, ...] = ()  # files that were there but could not be read

    @property
    def host(self) -> str:
        for host in (self.stack.header.get("host") if self.stack else None,
                     self.dump.host if self.dump else None,
                     self.heartbeat.host if self.heartbeat else None):
            if host:
                return host
        return ""

    @property
    def steps(self) -> int | None:
        """Steps at the dump (exact) or else in the heartbeat file."""
        text = self.stack.header.get("steps", "") if self.stack else ""
        if text.isdigit():
            return int(text)
        return self.heartbeat.steps if self.heartbeat else None


def rank_paths(folder: str, suffix: str) -> dict[int, str]:
    """``{rank: path}`` of the ``rank-<R><suffix>`` files in `folder` (none when it is missing)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    found = {}
    for name in names:
        match = contract.RANK_FILE.match(name)
        if match and (match.group(2) or "") == suffix:
            found[int(match.group(1))] = os.path.join(folder, name)
    return found


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(MAX_FILE_BYTES)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(MAX_FILE_BYTES)


def read_failure_files(control_dir: str) -> dict[int, RankFiles]:
    """Every rank's heartbeat, and the Flight Recorder dump taken when it failed.

    The dump is NCCL's own (written at the timeout, while the rank still waited),
    else the one the rank's exception hook wrote (``exceptions/rank-<R>.fr.json``).
    """
    beats = rank_paths(os.path.join(control_dir, contract.HEARTBEAT), "")
    nccl = rank_paths(os.path.join(control_dir, contract.NCCL_DUMPS), "")
    hooked = rank_paths(os.path.join(control_dir, contract.EXCEPTIONS), contract.FLIGHT_RECORDER)
    found = {}
    for rank in sorted(set(beats) | set(nccl) | set(hooked)):
        files = _rank_files(rank, beats.get(rank), None, None)
        dump, problems = _failure_dump(rank, nccl.get(rank), hooked.get(rank))
        found[rank] = RankFiles(rank, files.heartbeat, None, dump, files.problems + problems)
    return found


def _failure_dump(rank: int, nccl: str | None, hooked: str | None) -> tuple[RankDump | None, tuple[str, ...]]:
    problems: list[str] = []
    for path in (nccl, hooked):
        if path is None:
            continue
        try:
            return parse_dump_bytes(read_bytes(path), rank), tuple(problems)
        except (OSError, DumpError) as exc:
            problems.append(f"{path}: {exc}")
    return None, tuple(problems)


def read_dump_folder(control_dir: str, request: str) -> dict[int, RankFiles]:
    """Every rank's heartbeat, and its stack and Flight Recorder dump for `request`."""
    dumps = os.path.join(control_dir, contract.DUMPS, request)
    beats = rank_paths(os.path.join(control_dir, contract.HEARTBEAT), "")
    stacks, frs = rank_paths(dumps, contract.STACK), rank_paths(dumps, contract.FLIGHT_RECORDER)
    return {rank: _rank_files(rank, beats.get(rank), stacks.get(rank), frs.get(rank))
            for rank in sorted(set(beats) | set(stacks) | set(frs))}


def _rank_files(rank: int, beat: str | None, stack: str | None, fr: str | None) -> RankFiles:
    problems = []
    heartbeat = stack_dump = dump = None
    try:
        heartbeat = parse_heartbeat(read_text(beat)) if beat else None
    except (OSError, ValueError) as exc:
        problems.append(f"{beat}: {exc}")
    try:
        stack_dump = parse_stack(read_text(stack)) if stack else None
    except OSError as exc:
        problems.append(f"{stack}: {exc}")
    try:
        dump = parse_dump(read_text(fr), rank) if fr else None
    except (OSError, DumpError) as exc:
        problems.append(f"{fr}: {exc}")
    return RankFiles(rank, heartbeat, stack_dump, dump, tuple(problems))


def read_exceptions(control_dir: str) -> tuple[ExceptionReport, ...]:
    """The exception files and the non-empty fault files of every rank."""
    reports = []
    for kind, fault in ((contract.EXCEPTIONS, False), (contract.FAULTS, True)):
        for rank, path in sorted(rank_paths(os.path.join(control_dir, kind), contract.TEXT).items()):
            try:
                text, mtime = read_text(path), os.path.getmtime(path)
            except OSError:
                continue
            if text.strip():
                reports.append(parse_exception(text, rank, mtime, fault))
    return tuple(reports)
