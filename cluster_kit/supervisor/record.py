"""The attempts record of a supervised job, typed, read and written here only (stdlib only, Python 3.8+).

One JSON file, `attempts.json`, in the job's record folder
`<folder of the first attempt's output>/clusterkit-<first job id>/` (0700), written
0600 by the supervisor (write a temporary file, rename it) and read by
`clusterkit status`, `diagnose` and `submit --wait` (through :func:`parse`):

    {"format": "clusterkit.attempts/1", "job_id": "123", "resilience": {...},
     "script_digest": "sha256:...", "start_exclude": [],
     "attempts": [{"attempt": 0, "slurm_job_id": "123", "step": "123.0", "nodes": "n[1-2]",
                   "allocation": "n[1-3]", "batch_host": "n1",
                   "started_at": 1.7e9, "ended_at": 1.7e9, "ended": "hang",
                   "exit_code": 137, "detected_after_s": 41.2,
                   "culprit": {"ranks": [3], "hosts": ["n2"], "evidence": "...", "kind": "node"},
                   "excluded": ["n2"], "released": ["n2"], "stacks": {"3": "..."},
                   "checkpoints": ["checkpoints every 412 steps (9.6 min): ..."],
                   "why": "...; restarted in job 123 on n[1,3] (n3 in place of n2)"},
                  {"attempt": 1, "slurm_job_id": "123", "step": "123.1", "waited_s": 0.4, ...,
                   "next_job_id": "124", "without": ["n2"]}],
     "exclude": ["n2"], "standby": {"job_id": "125", "after": "123"}, "final": null}

An attempt restarted in its allocation has the same `slurm_job_id` as the next one;
one restarted as a new job names it as `next_job_id`, and `without` the nodes that
job was submitted without. `standby` is the job waiting with
`--dependency=afternotok` on the current one (null once the supervisor saw the end).
A program error's culprit has `"kind": "program"` and its `signature`, `error` and
`where`. `final` is `{"ended": ..., "exit_code": N, "why": "..."}` once the chain is
over. A record written by another version keeps the keys this one does not know, and
one missing keys this one writes reads with them empty: older records still read.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable
from typing import Any

from . import private

FORMAT = "clusterkit.attempts/1"
RECORD_NAME = "attempts.json"
ENDINGS = ("completed", "hang", "crash", "node_failure", "time_limit", "preempted", "cancelled", "running")
FAILURES = ("hang", "crash", "node_failure")  # count against max_restarts
REQUEUES = ("time_limit", "preempted")  # count against max_time_requeues
EARLIER_LIMIT = 50  # earlier chains read for the failure rate
ALWAYS = ("attempt", "slurm_job_id", "nodes", "allocation", "batch_host", "started_at", "ended", "output")


@dataclasses.dataclass
class AttemptRecord:
    """One attempt of the chain (keys written only once they say something, but ALWAYS's)."""

    attempt: int
    slurm_job_id: str
    nodes: str = ""
    allocation: str = ""
    batch_host: str = ""
    started_at: float | None = None
    ended: str = "running"
    output: str = ""
    ended_at: float | None = None
    exit_code: int | None = None
    step: str | None = None
    waited_s: float | None = None
    detected_after_s: float | None = None
    culprit: dict[str, Any] | None = None
    stacks: dict[str, str] = dataclasses.field(default_factory=dict)
    excluded: list[str] = dataclasses.field(default_factory=list)
    released: list[str] = dataclasses.field(default_factory=list)
    checkpoints: list[str] = dataclasses.field(default_factory=list)
    why: str = ""
    next_job_id: str | None = None
    without: list[str] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "extra":
                continue
            if field.name in ALWAYS or (field.name == "exit_code" and self.ended != "running") \
                    or (field.name == "without" and value is not None) or value not in (None, "", [], {}):
                out[field.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttemptRecord:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("attempt", 0)
        known["slurm_job_id"] = str(known.get("slurm_job_id", ""))
        if known.get("next_job_id") is not None:
            known["next_job_id"] = str(known["next_job_id"])
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})

    @property
    def kind(self) -> str:
        """Whose fault the culprit is: "node" (a record before kinds: always a node's) or "program"."""
        return str((self.culprit or {}).get("kind", "node"))


@dataclasses.dataclass(frozen=True)
class Final:
    """How the chain ended."""

    ended: str
    exit_code: int
    why: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ChainRecord:
    """The chain of one supervised job: its settings, attempts, excluded nodes, standby and end."""

    job_id: str
    resilience: dict[str, Any]
    attempts: list[AttemptRecord] = dataclasses.field(default_factory=list)
    final: Final | None = None
    script_digest: str = ""
    start_exclude: list[str] = dataclasses.field(default_factory=list)
    exclude: list[str] = dataclasses.field(default_factory=list)
    standby: dict[str, str] | None = None  # {"job_id", "after"}
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def last(self) -> AttemptRecord | None:
        return self.attempts[-1] if self.attempts else None

    def count(self, endings: Iterable[str]) -> int:
        wanted = set(endings)
        return sum(1 for a in self.attempts if a.ended in wanted)

    def excluded_nodes(self) -> list[str]:
        """The nodes the chain's next attempt goes without, in the order they were blamed
        (each attempt's `excluded` lists the ones it added)."""
        return list(self.exclude)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.extra, "format": FORMAT, "job_id": self.job_id,
                               "resilience": dict(self.resilience),
                               "attempts": [a.to_dict() for a in self.attempts],
                               "final": self.final.to_dict() if self.final else None}
        if self.script_digest:
            out["script_digest"] = self.script_digest
        out["start_exclude"] = list(self.start_exclude)
        if self.exclude:
            out["exclude"] = list(self.exclude)
        if self.standby is not None or "standby" in self.extra:
            out["standby"] = self.standby
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChainRecord:
        final = data.get("final")
        standby = data.get("standby")
        own = ("format", "job_id", "resilience", "attempts", "final", "script_digest", "start_exclude",
               "exclude", "standby")
        return cls(
            job_id=str(data.get("job_id") or ""),
            resilience=dict(data["resilience"]) if isinstance(data.get("resilience"), dict) else {},
            attempts=[AttemptRecord.from_dict(a) for a in data["attempts"] if isinstance(a, dict)],
            final=Final(str(final.get("ended")), int(final.get("exit_code") or 0), str(final.get("why") or ""))
            if isinstance(final, dict) and final else None,
            script_digest=str(data.get("script_digest") or ""),
            start_exclude=[str(n) for n in data.get("start_exclude") or []],
            exclude=[str(n) for n in data.get("exclude") or []],
            standby={str(k): str(v) for k, v in standby.items()} if isinstance(standby, dict) else None,
            extra={k: v for k, v in data.items() if k not in own})


def folder_for(output_path: str, chain_id: str) -> str:
    """The record folder beside a job's output file: `<its folder>/clusterkit-<chain id>`."""
    return os.path.join(os.path.dirname(output_path) or ".", f"clusterkit-{chain_id}")


def new_record(chain_id: str, resilience: dict[str, Any]) -> ChainRecord:
    return ChainRecord(str(chain_id), dict(resilience))


class CorruptRecord(RuntimeError):
    """An attempts record that is there but cannot be read as one (kept aside)."""


def parse(text: str) -> ChainRecord | None:
    """The record in an attempts file's text; None when it is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return ChainRecord.from_dict(data) if _is_record(data) else None


def load(folder: str) -> ChainRecord | None:
    """The record in `folder`; None when there is none. A record that is not one is
    renamed aside (`attempts.json.corrupt-<unix time>`) and CorruptRecord raised: a
    chain never starts its history anew over one. private.Untrusted for a record
    another user could have written."""
    path = os.path.join(folder, RECORD_NAME)
    raw = private.read(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
        problem = None if _is_record(data) else f"it is not a {FORMAT} record"
    except (UnicodeDecodeError, ValueError) as exc:
        problem = f"it is not JSON ({exc})"
    if problem is None:
        return ChainRecord.from_dict(data)
    kept = f"{path}.corrupt-{int(time.time())}"
    os.replace(path, kept)
    raise CorruptRecord(f"the attempts record {path} cannot be read: {problem}; it was kept as {kept}, and "
                        "the chain does not go on without its history: look at it, then submit the job again")


def earlier(folder: str, limit: int = EARLIER_LIMIT) -> list[ChainRecord]:
    """The ended records of the user's other chains beside `folder` (the newest
    `limit`): what `checkpoint_every: auto` learns the failure rate from. Only folders
    and records private.check trusts; one that is not is skipped, never touched."""
    parent, own = os.path.split(os.path.abspath(folder))
    found = []
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith("clusterkit-") and e.name != own]
    except OSError:
        return []
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            private.check(entry.path, st, "folder")
            found.append((st.st_mtime, entry.path))
        except (OSError, private.Untrusted):
            continue
    records = []
    for _, path in sorted(found, reverse=True)[:limit]:
        try:
            text = (private.read(os.path.join(path, RECORD_NAME)) or b"").decode("utf-8")
        except (OSError, ValueError, private.Untrusted):
            continue
        rec = parse(text)
        if rec is not None and rec.final is not None:
            records.append(rec)
    return records


def _is_record(data: Any) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("attempts"), list)


def make_private_dir(path: str) -> bool:
    """Make `path` 0700, or trust the one there (private.folder)."""
    return private.folder(path)


def save(folder: str, rec: ChainRecord) -> str:
    """Write the record 0600 in its 0700 folder, whole (temporary file, then rename)."""
    text = json.dumps(rec.to_dict(), indent=1, sort_keys=True) + "\n"
    return private.write(os.path.join(folder, RECORD_NAME), text.encode("utf-8"))
