"""The files supervised ranks write in the control folder, read back (pure parsers + one reader).

``heartbeat/rank-<R>``: ``<steps> <unix_time> <host> <pid> [paused:<since>[:<max_s>:<reason>]|resumed:<at>]``
(the reason URL-quoted). ``stopped/rank-<R>``: ``<cause> <unix_time>``, the first stop
the rank was told (``SIGTERM``, ``SIGUSR1``, ``stop-file``); ``finished/rank-<R>``:
``<steps> <unix_time>``, the script said training is done. ``dumps/<id>/rank-<R>.stack``:
``key: value`` header lines (rank, host, pid, steps, time, main_thread), a blank line,
then faulthandler's dump of every thread. ``exceptions/rank-<R>.txt``: the same kind of
header, then the traceback; ``exceptions/rank-<R>.fr.json``: the rank's Flight Recorder
at that moment. ``faults/rank-<R>.txt``: what faulthandler wrote on a fatal signal
(empty when none came). ``nccl-dumps/rank-<R>``: NCCL's watchdog's own dump on a
timeout, where :func:`nccl_dump_prefix` points it. docs/architecture.md, "Supervised
ranks", has the contract.

Stdlib only, Python 3.8+: the job's supervisor runs this from a zip app.
"""
from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass, replace

from .flight_recorder import DumpError, RankDump, parse_dump, parse_dump_bytes

RANK_FILE = re.compile(r"rank-(\d{1,7})(\.[a-z.]+)?\Z")
# faulthandler: `Thread 0x00007f... (most recent call first):` (`Current thread` for the caller)
THREAD_LINE = re.compile(r"(Current thread|Thread) (0x[0-9a-fA-F]+)\b.*:\s*\Z")
# faulthandler: `  File "x.py", line 8 in f`; traceback: `  File "x.py", line 8, in f`
FRAME_LINE = re.compile(r'\s+File "(?P<path>.*)", line (?P<line>\d+),? in (?P<function>.*?)\s*\Z')
# Frames of Python itself, of installed packages and of clusterkit are not the user's code.
LIBRARY_PATH = re.compile(r"(^<)|/site-packages/|/dist-packages/|/lib/python3\.\d+/|/cluster_kit/")
MAX_FILE_BYTES = 4 << 20  # dumps are KBs; anything bigger is read only this far
NCCL_DUMPS = "nccl-dumps"  # the control folder's sub-folder for NCCL's own timeout dumps
STOPPED = "stopped"  # rank-<R>: the first stop the rank was told, and when
FINISHED = "finished"  # rank-<R>: the script said training is done


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat line: how many steps the rank reported, and when the last one ended."""

    steps: int
    time: float
    host: str
    pid: int
    paused_since: float | None = None  # the rank is inside ddp.paused() since then
    resumed_at: float | None = None  # when its last pause ended
    pause_max_s: float | None = None  # how long that pause may stop the hang clock (None: no ceiling)
    pause_reason: str = ""


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


def parse_heartbeat(text: str) -> Heartbeat:
    """``<steps> <unix_time> <host> <pid> [paused:<since>[:<max_s>:<reason>]|resumed:<at>]``;
    ValueError naming what is wrong."""
    fields = text.split("\n", 1)[0].split()
    if len(fields) not in (4, 5):
        raise ValueError(f"a heartbeat line has 4 or 5 fields (steps time host pid [pause]), not {text[:80]!r}")
    steps, when, host, pid = fields[:4]
    beat = Heartbeat(int(steps), float(when), host, int(pid))
    if len(fields) == 5:
        kind, sep, at = fields[4].partition(":")
        if not sep or kind not in ("paused", "resumed"):
            raise ValueError(f"a heartbeat's fifth field is paused:<time> or resumed:<time>, not {fields[4][:40]!r}")
        if kind == "resumed":
            return replace(beat, resumed_at=float(at))
        since, _, rest = at.partition(":")
        max_s, _, reason = rest.partition(":")
        beat = replace(beat, paused_since=float(since), pause_max_s=float(max_s) if max_s else None,
                       pause_reason=urllib.parse.unquote(reason))
    return beat


@dataclass(frozen=True)
class Note:
    """A rank's ``stopped`` or ``finished`` file: what (the stop's cause, or the steps) and when."""

    rank: int
    what: str
    time: float


def read_notes(control_dir: str, kind: str) -> dict[int, Note]:
    """``{rank: Note}`` of the ``stopped`` or ``finished`` files of every rank (unreadable ones left out)."""
    notes = {}
    for rank, path in rank_paths(os.path.join(control_dir, kind), "").items():
        try:
            what, when = read_text(path).split()[:2]
            notes[rank] = Note(rank, what, float(when))
        except (OSError, ValueError):
            continue
    return notes


def parse_header(text: str) -> tuple[dict[str, str], str]:
    """The ``key: value`` lines before the first blank line, and the text after it."""
    head, _, rest = text.partition("\n\n")
    header = {}
    for line in head.splitlines():
        key, sep, value = line.partition(": ")
        if not sep or " " in key:
            return {}, text  # no header: the whole text is the body
        header[key] = value.strip()
    return header, rest


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
        match = RANK_FILE.match(name)
        if match and (match.group(2) or "") == suffix:
            found[int(match.group(1))] = os.path.join(folder, name)
    return found


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(MAX_FILE_BYTES)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(MAX_FILE_BYTES)


def nccl_dump_prefix(control_dir: str) -> str:
    """The value of ``TORCH_FR_DUMP_TEMP_FILE`` for the ranks: on a collective
    timeout NCCL's watchdog writes its Flight Recorder to this prefix + the rank.
    The folder must exist (0700) before the ranks start: torch does not create it."""
    return os.path.join(control_dir, NCCL_DUMPS, "rank-")


def read_failure_files(control_dir: str) -> dict[int, RankFiles]:
    """Every rank's heartbeat, and the Flight Recorder dump taken when it failed.

    The dump is NCCL's own (written at the timeout, while the rank still waited),
    else the one the rank's exception hook wrote (``exceptions/rank-<R>.fr.json``).
    """
    beats = rank_paths(os.path.join(control_dir, "heartbeat"), "")
    nccl = rank_paths(os.path.join(control_dir, NCCL_DUMPS), "")
    hooked = rank_paths(os.path.join(control_dir, "exceptions"), ".fr.json")
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
    dumps = os.path.join(control_dir, "dumps", request)
    beats = rank_paths(os.path.join(control_dir, "heartbeat"), "")
    stacks, frs = rank_paths(dumps, ".stack"), rank_paths(dumps, ".fr.json")
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
    for kind, fault in (("exceptions", False), ("faults", True)):
        for rank, path in sorted(rank_paths(os.path.join(control_dir, kind), ".txt").items()):
            try:
                text, mtime = read_text(path), os.path.getmtime(path)
            except OSError:
                continue
            if text.strip():
                reports.append(parse_exception(text, rank, mtime, fault))
    return tuple(reports)
