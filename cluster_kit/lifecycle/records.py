"""Job records: what clusterkit submitted, kept after Slurm forgets the job.

Without accounting, Slurm forgets a job MinJobAge seconds after it ends, and
with it the job's output path; `logs`, `status` and `diagnose` read the record
instead. One JSON file per job under `$XDG_STATE_HOME/clusterkit/jobs/`
(default `~/.local/state/clusterkit/jobs/`), folder 0700 and files 0600: a
record holds the rendered script and the job's environment.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RECORD_VERSION = 1


def records_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where job records live: `$XDG_STATE_HOME/clusterkit/jobs` (XDG's default state home)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "clusterkit" / "jobs"


@dataclass
class JobRecord:
    """One submitted job: enough to find its output, profile and outcome later."""

    job_id: str
    where: str                      # "local", or the login host Slurm ran on
    name: str = ""
    profile: str | None = None      # a path `--profile` takes (resolved at submit)
    job_file: str | None = None
    launcher: str = "srun"
    submitted_at: float = field(default_factory=time.time)
    outputs: dict[str, str] = field(default_factory=dict)  # job or task id -> StdOut path
    excluded: dict[str, list[str]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # the effective job
    script: str = ""
    preflight: dict[str, Any] | None = None
    ended: dict[str, Any] | None = None  # {"state", "exit_status", "explanation"} once seen
    chain_id: str | None = None     # a restart of a `resilience:` job: the id of the chain's first job
    overrides: dict[str, Any] = field(default_factory=dict)  # `--set` / the API's overrides, by dotted key
    sweep: list[dict[str, Any]] = field(default_factory=list)  # array index -> {dotted key: value}
    array: str | None = None        # `--array` of a sweep (`0-2%2`)
    dependency: str | None = None   # `--dependency` (`afterok:12`)
    git_commit: str | None = None   # of the job's script's tree, where it was submitted from
    git_dirty: bool | None = None   # whether that tree had uncommitted changes
    version: int = RECORD_VERSION

    @property
    def supervised(self) -> bool:
        """Submitted with `resilience:`: a supervisor runs it and writes its attempts record."""
        return bool(self.settings.get("resilience"))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        data = json.loads(text)
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


def record_path(job_id: str, where: str, folder: Path) -> Path:
    """`<job id>@<where>.json`: ids repeat across clusters."""
    safe_where = "".join(ch if ch.isalnum() or ch in "-._" else "_" for ch in where)
    return folder / f"{job_id}@{safe_where}.json"


def save(record: JobRecord, folder: Path | None = None) -> Path:
    """Write (or rewrite) the record, 0600 in a 0700 folder; its path."""
    folder = folder or records_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = record_path(record.job_id, record.where, folder)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(record.to_json())
    os.replace(tmp, path)
    return path


def find(job_id: str, where: str | None = None, folder: Path | None = None) -> JobRecord | None:
    """The record of `job_id` (an array task `12_3` finds array job 12's), on
    `where` when given, else the newest with that id; None when there is none."""
    folder = folder or records_dir()
    base_id = job_id.split("_", 1)[0]
    matches = []
    for path in folder.glob(f"{base_id}@*.json") if folder.is_dir() else []:
        try:
            record = JobRecord.from_json(path.read_text())
        except (OSError, ValueError, TypeError):
            continue  # a damaged record is as good as none
        if record.job_id == base_id and (where is None or record.where == where):
            matches.append(record)
    return max(matches, key=lambda r: r.submitted_at) if matches else None


def all_records(folder: Path | None = None) -> list[JobRecord]:
    """Every readable record, newest first."""
    folder = folder or records_dir()
    out = []
    for path in folder.glob("*@*.json") if folder.is_dir() else []:
        try:
            out.append(JobRecord.from_json(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda r: r.submitted_at, reverse=True)
