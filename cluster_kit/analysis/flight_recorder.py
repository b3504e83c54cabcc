"""PyTorch Flight Recorder dumps (JSON) -> each rank's collectives per process group.

A dump is what ``torch._C._distributed_c10d._dump_fr_trace_json`` (gloo and other
CPU backends) or ``_dump_nccl_trace_json`` (NCCL) returns, or the file a supervised
rank writes on a dump request: ``{"format": "clusterkit.fr/1", "rank": 3,
"recorders": {"fr": <torch's JSON>, "nccl": <torch's JSON>}, ...}``. Both read the
same way here. So does the file NCCL's watchdog writes by itself on a timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT``, to ``TORCH_FR_DUMP_TEMP_FILE`` + rank): the same
content as a pickle (protocol 2, plain dicts, lists, strings and numbers), read by
an unpickler that refuses every class and function a pickle could name.

What torch writes and what this reader relies on (torch 2.11 and 2.13):

* ``entries``: one per collective, oldest first, with ``process_group`` =
  ``[name, description]`` (the name is the same on every rank; ``pg_id`` is a local
  index), ``collective_seq_id`` (counts the group's collectives, 1 first),
  ``profiling_name`` (``gloo:all_reduce``, ``nccl:all_reduce``), ``state``
  (``scheduled``, ``started``, ``completed``), ``retired`` (finished and taken off
  the watch list) and the input/output sizes and dtypes.
* ``pg_status``: per local ``pg_id`` (numbered per recorder: gloo's group "1" can be
  pg_id 0 beside NCCL's default group, also pg_id 0), ``last_enqueued_collective`` /
  ``last_started_collective`` / ``last_completed_collective`` (``-1``: none).
* ``pg_config`` is not read: gloo dumps carry one entry with an empty name there
  (which is what stops torch's own ``torchfrtrace`` on them).

Gloo never marks an entry ``completed``; its finished collectives are ``retired``.
Stdlib only, Python 3.8+: the job's supervisor runs this from a zip app.
"""
from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass
from typing import Any

WRAPPER_FORMAT = "clusterkit.fr/1"
DEFAULT_GROUP = "0"  # the default process group's name on every rank


class DumpError(ValueError):
    """The text is not a Flight Recorder dump; the message says what it is instead."""


@dataclass(frozen=True)
class Collective:
    """One Flight Recorder entry: a collective (or p2p op) as one rank saw it."""

    group: str  # process group name, the same on every rank
    group_desc: str
    seq: int  # collective_seq_id (p2p ops: p2p_seq_id)
    op: str  # "all_reduce": the backend prefix dropped
    backend: str  # "gloo", "nccl", or "" when the name had no prefix
    state: str  # scheduled | started | completed
    retired: bool
    is_p2p: bool
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    record_id: int
    created_ns: int

    @property
    def finished(self) -> bool:
        """Completed or retired: no rank waits in it any more."""
        return self.retired or self.state == "completed"

    def describe(self) -> str:
        """``all_reduce #12`` (with the group's description outside the default group)."""
        where = "" if self.group == DEFAULT_GROUP else f" of group {self.group_desc or self.group}"
        return f"{self.op} #{self.seq}{where}"


@dataclass(frozen=True)
class GroupStatus:
    """A process group's counters in one rank's dump (``pg_status``); -1 = none yet."""

    group: str
    last_enqueued: int
    last_started: int
    last_completed: int


@dataclass(frozen=True)
class RankDump:
    """One rank's Flight Recorder: its collectives and the status of each of its groups."""

    rank: int | None
    host: str
    entries: tuple[Collective, ...]
    groups: tuple[GroupStatus, ...]
    errors: tuple[str, ...] = ()  # recorders the rank could not dump, and why

    def group_names(self) -> tuple[str, ...]:
        names = {e.group for e in self.entries} | {g.group for g in self.groups}
        return tuple(sorted(names, key=group_order))

    def status(self, group: str) -> GroupStatus | None:
        return next((g for g in self.groups if g.group == group), None)

    def waiting_in(self, group: str) -> Collective | None:
        """The oldest unfinished collective of `group`: where this rank is stuck (or None)."""
        for entry in self.entries:
            if entry.group == group and not entry.is_p2p and not entry.finished:
                return entry
        return None

    def last_entered(self, group: str) -> Collective | None:
        """The group's collective this rank entered last (finished or not), or None.

        A collective that failed (gloo's timeout) is retired like one that finished:
        at an exception, the last one entered is where the rank waited.
        """
        entered = [e for e in self.entries if e.group == group and not e.is_p2p]
        return max(entered, key=lambda e: e.seq) if entered else None

    def last_enqueued(self, group: str) -> int:
        """The group's last collective this rank entered (-1: none)."""
        status = self.status(group)
        seen = [e.seq for e in self.entries if e.group == group and not e.is_p2p]
        return max([status.last_enqueued if status else -1, *seen])


def group_order(name: str) -> tuple[int, str]:
    """Sort key of group names: torch's numbered groups by number, then named ones."""
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def parse_dump(text: str, rank: int | None = None) -> RankDump:
    """A rank's dump from its JSON text (a supervised rank's file or torch's own JSON)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DumpError(f"not JSON: {exc}") from None
    return _from_data(data, rank)


def parse_dump_bytes(raw: bytes, rank: int | None = None) -> RankDump:
    """A dump file's bytes: torch's pickle (what NCCL's watchdog writes) or JSON text."""
    if raw[:1] != PICKLE_START:
        return parse_dump(raw.decode("utf-8", "replace"), rank)
    try:
        data = _PlainUnpickler(io.BytesIO(raw)).load()
    except DumpError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is just not a dump
        raise DumpError(f"not a readable pickle: {exc!r}") from None
    return _from_data(data, rank)


PICKLE_START = b"\x80"  # the PROTO opcode that begins a pickle of protocol 2 and later


class _PlainUnpickler(pickle.Unpickler):
    """Builds only dicts, lists, tuples, strings and numbers: naming any class or
    function (the only way a pickle runs code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise DumpError(f"a Flight Recorder pickle names {module}.{name}; only plain data is read")


def _from_data(data: Any, rank: int | None) -> RankDump:
    if not isinstance(data, dict):
        raise DumpError(f"a Flight Recorder dump is a JSON object, not {type(data).__name__}")
    if data.get("format") == WRAPPER_FORMAT:
        return _from_wrapper(data, rank)
    if "entries" not in data and "pg_status" not in data:
        raise DumpError("no 'entries' and no 'pg_status': not a Flight Recorder dump")
    entries, groups = _read_recorder(data)
    return RankDump(rank, "", entries, groups)


def _from_wrapper(data: dict[str, Any], rank: int | None) -> RankDump:
    """Merge the recorders of a supervised rank's file (an entry in two recorders counts once)."""
    entries: list[Collective] = []
    groups: dict[str, GroupStatus] = {}
    recorders = data.get("recorders") or {}
    for name in sorted(recorders):
        found, statuses = _read_recorder(recorders[name])
        entries.extend(found)
        groups.update({g.group: g for g in statuses})
    unique = {(e.group, e.seq, e.is_p2p, e.op, e.created_ns): e for e in entries}
    ordered = sorted(unique.values(), key=lambda e: (e.created_ns, e.record_id))
    errors = tuple(f"{k}: {v}" for k, v in sorted((data.get("errors") or {}).items()))
    own = data.get("rank")
    return RankDump(own if isinstance(own, int) else rank, str(data.get("host") or ""),
                    tuple(ordered), tuple(groups.values()), errors)


def _read_recorder(data: Any) -> tuple[tuple[Collective, ...], tuple[GroupStatus, ...]]:
    if not isinstance(data, dict):
        raise DumpError("a recorder's dump is a JSON object")
    raw_entries = data.get("entries") or []
    entries = tuple(_entry(e) for e in raw_entries if isinstance(e, dict))
    names = {str(e.get("pg_id")): _group_name(e) for e in raw_entries if isinstance(e, dict)}
    statuses = data.get("pg_status") or {}
    # pg_status is keyed by a local pg_id (numbered per recorder); only the entries name
    # the group, so a status without an entry left is left out.
    groups = tuple(_status(names[pg_id], s) for pg_id, s in sorted(statuses.items())
                   if isinstance(s, dict) and pg_id in names)
    return entries, groups


def _group_name(entry: dict[str, Any]) -> str:
    return _group(entry)[0]


def _group(raw: dict[str, Any]) -> tuple[str, str]:
    """(name, description) of an entry's process group; torch writes [name, desc]."""
    group = raw.get("process_group") or ["", ""]
    return str(group[0]), str(group[1]) if len(group) > 1 else ""


def _status(name: str, status: dict[str, Any]) -> GroupStatus:
    return GroupStatus(name, _int(status.get("last_enqueued_collective")),
                       _int(status.get("last_started_collective")),
                       _int(status.get("last_completed_collective")))


def _entry(raw: dict[str, Any]) -> Collective:
    group, group_desc = _group(raw)
    backend, _, op = str(raw.get("profiling_name") or "").rpartition(":")
    is_p2p = bool(raw.get("is_p2p"))
    seq = raw.get("p2p_seq_id") if is_p2p else raw.get("collective_seq_id")
    return Collective(
        group=group, group_desc=group_desc,
        seq=_int(seq), op=op or "?", backend=backend, state=str(raw.get("state") or ""),
        retired=bool(raw.get("retired")), is_p2p=is_p2p,
        input_sizes=_sizes(raw.get("input_sizes")), output_sizes=_sizes(raw.get("output_sizes")),
        dtypes=tuple(str(d) for d in raw.get("input_dtypes") or ()),
        record_id=_int(raw.get("record_id")), created_ns=_int(raw.get("time_created_ns")),
    )


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(tuple(_int(n) for n in shape) for shape in value if isinstance(shape, list))


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1
