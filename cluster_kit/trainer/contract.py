"""The contract between a supervised job's ranks and its supervisor: one folder, its files.

The supervisor of a job with ``resilience:`` and its ranks talk only through files in
the attempt's control folder (``$CLUSTERKIT_CONTROL_DIR``, 0700; every file 0600), and
through the environment the supervisor gives each rank. This module is the one place
that names them, says their formats and reads and writes the small ones; the trainer
(:mod:`cluster_kit.trainer.supervision`), the supervisor (:mod:`cluster_kit.supervisor`)
and the diagnosis (:mod:`cluster_kit.analysis.rank_files`) all import it.

| path in the control folder | who writes | format |
| --- | --- | --- |
| ``heartbeat/rank-<R>`` | each rank | :func:`heartbeat_line` |
| ``stop`` | the supervisor (grace signal, SIGTERM) | empty: the ranks stop |
| ``stopped/rank-<R>`` | a rank, once | :func:`note_line`: the first stop it was told (``SIGTERM``, ``SIGUSR1``, ``stop-file``) |
| ``finished/rank-<R>`` | a rank, once | :func:`note_line`: steps when the script said training is done |
| ``dump-request`` | the supervisor | one request id (:data:`REQUEST_ID`) |
| ``dumps/<id>/rank-<R>.stack`` / ``.fr.json`` / ``.done`` | each rank | :func:`header_text` + faulthandler's dump / :data:`DUMP_FORMAT` JSON / empty, last |
| ``exceptions/rank-<R>.txt`` / ``.fr.json`` | a rank that raised | :func:`header_text` + traceback / :data:`DUMP_FORMAT` JSON |
| ``faults/rank-<R>.txt`` | faulthandler, on a fatal signal | its dump (empty while none came) |
| ``nccl-dumps/rank-<R>`` | NCCL's watchdog (``TORCH_FR_DUMP_TEMP_FILE``) | torch's pickle |
| ``checkpoint.json`` | rank 0's checkpointer | ``clusterkit.checkpoint-status/1`` |

Stdlib only, Python 3.8+: it travels in the supervisor's zip app and runs in every rank.
"""
from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass, replace

VERSION = 1  # of this contract: files added keep it; a changed format takes a new one

# --- the environment the supervisor gives every rank ------------------------------------------
CONTROL_DIR_ENV = "CLUSTERKIT_CONTROL_DIR"
ATTEMPT_ENV = "CLUSTERKIT_ATTEMPT"
CHECKPOINT_DIR_ENV = "CLUSTERKIT_CHECKPOINT_DIR"
CHAIN_ENV = "CLUSTERKIT_CHAIN_ID"
CHECKPOINT_EVERY_ENV = "CLUSTERKIT_CHECKPOINT_EVERY"
KEEP_CHECKPOINTS_ENV = "CLUSTERKIT_KEEP_CHECKPOINTS"
MTBF_ENV = "CLUSTERKIT_MTBF_S"
RESTART_ENV = "CLUSTERKIT_RESTART_S"
HEARTBEAT_INTERVAL_ENV = "CLUSTERKIT_HEARTBEAT_INTERVAL"

# --- the control folder -------------------------------------------------------------------------
HEARTBEAT = "heartbeat"
STOP = "stop"
STOPPED = "stopped"
FINISHED = "finished"
DUMP_REQUEST = "dump-request"
DUMPS = "dumps"
EXCEPTIONS = "exceptions"
FAULTS = "faults"
NCCL_DUMPS = "nccl-dumps"
CHECKPOINT_STATUS = "checkpoint.json"
STACK, FLIGHT_RECORDER, DONE, TEXT = ".stack", ".fr.json", ".done", ".txt"  # suffixes of rank files
DUMP_FORMAT = "clusterkit.fr/1"
# A request id names a folder: one token, no path separators, no dot-only names.
REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
RANK_FILE = re.compile(r"rank-(\d{1,7})(\.[a-z.]+)?\Z")
STOP_CAUSES = ("SIGTERM", "SIGUSR1", "SIGINT", "stop-file")


def rank_name(rank: int, suffix: str = "") -> str:
    """``rank-3`` / ``rank-3.stack``: a rank's file in one of the folders."""
    return f"rank-{rank}{suffix}"


def rank_path(control_dir: str, folder: str, rank: int, suffix: str = "") -> str:
    return os.path.join(control_dir, folder, rank_name(rank, suffix))


def nccl_dump_prefix(control_dir: str) -> str:
    """The value of ``TORCH_FR_DUMP_TEMP_FILE`` for the ranks: on a collective timeout
    NCCL's watchdog writes its Flight Recorder to this prefix + the rank. The folder
    must exist (0700) before the ranks start: torch does not create it."""
    return os.path.join(control_dir, NCCL_DUMPS, "rank-")


# --- heartbeat lines ------------------------------------------------------------------------
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


def pause_mark(since: float, max_s: float, reason: str) -> str:
    """The fifth field of a paused rank's line: ``paused:<since>:<max_s>:<reason, URL-quoted>``."""
    return f"paused:{since:.3f}:{float(max_s):g}:{urllib.parse.quote(reason[:200], safe='')}"


def resume_mark(at: float) -> str:
    """The fifth field after the rank's last pause ended: ``resumed:<at>``."""
    return f"resumed:{at:.3f}"


def heartbeat_line(steps: int, when: float, host: str, pid: int, mark: str = "") -> str:
    """``<steps> <unix_time> <host> <pid> [mark]``: `when` the last counted step ended."""
    return f"{steps} {when:.3f} {host} {pid}{' ' + mark if mark else ''}\n"


def parse_heartbeat(text: str) -> Heartbeat:
    """A heartbeat line (a pause mark without max and reason is an older trainer's);
    ValueError naming what is wrong."""
    fields = text.split("\n", 1)[0].split()
    if len(fields) not in (4, 5):
        raise ValueError(f"a heartbeat line has 4 or 5 fields (steps time host pid [pause]), not {text[:80]!r}")
    steps, when, host, pid = fields[:4]
    beat = Heartbeat(int(steps), float(when), host, int(pid))
    if len(fields) == 4:
        return beat
    kind, sep, at = fields[4].partition(":")
    if not sep or kind not in ("paused", "resumed"):
        raise ValueError(f"a heartbeat's fifth field is paused:<time> or resumed:<time>, not {fields[4][:40]!r}")
    if kind == "resumed":
        return replace(beat, resumed_at=float(at))
    since, _, rest = at.partition(":")
    max_s, _, reason = rest.partition(":")
    return replace(beat, paused_since=float(since), pause_max_s=float(max_s) if max_s else None,
                   pause_reason=urllib.parse.unquote(reason))


# --- stopped and finished notes ------------------------------------------------------------------
@dataclass(frozen=True)
class Note:
    """A rank's ``stopped`` or ``finished`` file: what (the stop's cause, or the steps) and when."""

    rank: int
    what: str
    time: float


def note_line(what: str, when: float) -> str:
    return f"{what} {when:.3f}\n"


def parse_note(text: str, rank: int) -> Note:
    """A note line; ValueError when it is not one."""
    fields = text.split()
    if len(fields) != 2:
        raise ValueError(f"a note is `<what> <unix time>`, not {text[:60]!r}")
    return Note(rank, fields[0], float(fields[1]))


# --- headers of stack and exception files -------------------------------------------------------
def header_text(fields: dict[str, object]) -> str:
    """``key: value`` lines and a blank line: how stack and exception files begin."""
    lines = [f"{key}: {value}" for key, value in fields.items()]
    return "\n".join(lines) + "\n\n"


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
