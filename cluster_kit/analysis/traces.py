"""Read PyTorch profiler traces (Chrome trace JSON, one file per rank, maybe gzipped)."""
from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

TRACE_SUFFIXES = (".json", ".json.gz")
# `VARIANT.trace-rankR@HOST.json` as cluster_kit.ddp.StepProfiler names them.
VARIANT_FILE = re.compile(r"^(?:(?P<variant>.+)\.)?trace-rank(?P<rank>\d+)(?:@(?P<host>[^@/]+))?\.json(?:\.gz)?$")


class TraceError(ValueError):
    """A file that is not a PyTorch profiler trace; the message names it."""


class Event(NamedTuple):
    """One complete ("X") event; times in microseconds as the trace has them."""

    name: str
    cat: str
    ts: float
    dur: float
    tid: Any
    args: dict[str, Any]

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class Trace:
    """One rank's trace: who wrote it and its complete events."""

    path: str
    rank: int
    world_size: int
    host: str
    backend: str
    variant: str
    events: list[Event] = field(default_factory=list)
    has_gpu: bool = False  # any GPU kernel in it

    def without_events(self) -> Trace:
        """The same trace's description, its events dropped (cheap to send between processes)."""
        return Trace(self.path, self.rank, self.world_size, self.host, self.backend, self.variant, [], self.has_gpu)


def parse_trace(text: str | bytes, path: str = "<trace>") -> Trace:
    """A Trace from the JSON text of one profiler trace."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TraceError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: no traceEvents list: not a PyTorch profiler trace")
    return _trace_from_doc(doc, path)


def _trace_from_doc(doc: dict[str, Any], path: str) -> Trace:
    info = doc.get("distributedInfo") or {}
    match = VARIANT_FILE.match(Path(path).name)
    rank = info.get("rank", int(match.group("rank")) if match else 0)
    events = [
        Event(str(e.get("name", "")), str(e.get("cat", "")), float(e["ts"]),
              float(e.get("dur", 0.0)), e.get("tid"), e.get("args") or {})
        for e in doc["traceEvents"]
        if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e
    ]
    return Trace(path=path, rank=int(rank), world_size=int(info.get("world_size", 1)),
                 host=str((match and match.group("host")) or doc.get("host_name") or ""), backend=str(info.get("backend", "")),
                 variant=variant_of(path), events=events,
                 has_gpu=any(e.cat == "kernel" for e in events))


def variant_of(path: str) -> str:
    """The DDP variant in a trace file's name ("" when it names none)."""
    match = VARIANT_FILE.match(Path(path).name)
    return (match.group("variant") or "") if match else ""


def load_trace(path: Path) -> Trace:
    """Read one trace file (``.json`` or ``.json.gz``)."""
    try:
        raw = path.read_bytes()
        if path.name.endswith(".gz"):
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None
    return parse_trace(raw, str(path))


def trace_files(folder: Path) -> list[Path]:
    """The trace files in a folder (not its subfolders), sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def folder_traces(folder: Path) -> list[Path]:
    """The trace files of a folder; TraceError naming the folder when there is none."""
    if not folder.is_dir():
        raise TraceError(f"{folder}: no such folder")
    files = trace_files(folder)
    if not files:
        raise TraceError(f"{folder}: no PyTorch profiler traces (*.json, *.json.gz) in it")
    return files


def load_folder(folder: Path) -> list[Trace]:
    """Every trace in a folder, read in this process."""
    return [load_trace(p) for p in folder_traces(folder)]


def by_variant(traces: Iterable[Trace]) -> dict[str, list[Trace]]:
    """Traces grouped by DDP variant ("" for a plain run), each group sorted by rank."""
    groups: dict[str, list[Trace]] = {}
    for trace in traces:
        groups.setdefault(trace.variant, []).append(trace)
    return {k: sorted(v, key=lambda t: t.rank) for k, v in groups.items()}
