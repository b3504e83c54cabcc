"""Follow a job to its end: the one loop behind `submit --wait`, `logs -f`,
`Job.wait()` and `Job.logs(follow=True)`, for a plain job, an array job, and a job
with `resilience:` through its chain of attempts.

`follow` yields what happens as it happens (Polled, Restarted, Wrote) and, last, how
the job ended (Ended); the commands and the API only print or return it. A chain's
restart is a new Slurm job, named in the attempts record (chains.py), followed in turn.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cluster_kit.errors import ClusterRefused
from cluster_kit.lifecycle import chains, records
from cluster_kit.lifecycle.outcome import (
    FORGOTTEN,
    Outcome,
    ended_outcome,
    explain_status,
    remember,
    status_or_record,
)
from cluster_kit.lifecycle.output import Output
from cluster_kit.lifecycle.submission import where_key
from cluster_kit.slurm import jobs

if TYPE_CHECKING:
    from cluster_kit.slurm.runner import Runner

# The attempts record is written as the supervisor ends, just before the job does; a
# file system shared with the login host may show it a little later: read it again
# this many times, a second apart, before going by Slurm alone.
RECORD_READS = 10


@dataclass(frozen=True)
class Polled:
    """Slurm's status of the job followed now (a chain's current job)."""

    status: jobs.JobStatus


@dataclass(frozen=True)
class Restarted:
    """The chain went on: inside its allocation, or as a new job (one line)."""

    line: str


@dataclass(frozen=True)
class Wrote:
    """What the job's files got since the last look (with `Following.output`)."""

    text: str


@dataclass(frozen=True)
class Ended:
    """How the job (the chain) ended; always the last event."""

    outcome: Outcome


@dataclass
class Following:
    """How to follow: every `poll` s (through `sleep`); `launcher` for the explanation
    (default: the record's); `output`: also yield what the job writes, going on from
    this reader's last read; `cancel_never_start`: cancel a job Slurm can never start
    (ClusterRefused then)."""

    poll: float = 5.0
    launcher: str | None = None
    output: Output | None = None
    cancel_never_start: bool = True
    sleep: Callable[[float], None] = field(default=time.sleep)


@dataclass(frozen=True)
class Look:
    """The job as it stands: Slurm's status (its record's once Slurm forgot it) and,
    for a job with `resilience:`, its chain as the record says now."""

    status: jobs.JobStatus
    chain: chains.Chain | None
    record: records.JobRecord | None

    @property
    def supervised(self) -> bool:
        return self.chain is not None or (self.record is not None and self.record.supervised)

    def read(self, output: Output, chain: chains.Chain | None = None) -> str:
        """What the job wrote since `output`'s last read: `chain`'s attempts' files (this
        look's chain by default); nothing while a job with `resilience:` has no
        attempts record yet (its supervisor has not started)."""
        chain = chain or self.chain
        return "" if chain is None and self.supervised else output.read(chain)


def look(runner: Runner, job_id: str) -> Look:
    """One look at the job: what `status` shows, and where `follow` starts."""
    status = status_or_record(runner, job_id)
    record = records.find(job_id, where_key(runner))
    record = record if record is not None and record.job_id == job_id else None
    chain = None if status.tasks else chains.find_chain(runner, record or job_id, status.stdout_path)
    if chain is not None:
        chains.remember_chain(chain, where_key(runner))
    return Look(status, chain, record)


def follow(runner: Runner, job_id: str, how: Following | None = None) -> Iterator[Polled | Restarted | Wrote | Ended]:
    """The job's events until it ended, through its chain's restarts; Ended last.

    The outcome is the last job's, with the chain's exit code and its attempts, and is
    kept in the job's record."""
    how = how or Following()
    seen = look(runner, job_id)
    launcher = how.launcher or (seen.record.launcher if seen.record else "srun")
    chain, status, current = seen.chain, seen.status, job_id
    first: jobs.JobStatus | None = status  # Slurm's answer to look: the first poll's
    told = _Told()
    over = status.source == "record"  # Slurm forgot it: as its record says
    while not over:
        for status in _watch(runner, current, how, chain, first):
            first = None
            yield Polled(status)
            if seen.supervised and status.phase == "running":
                chain = _reread(runner, chain, seen, current)
                yield from told.restarts(chain, current)
            yield from _wrote(how.output, chain, seen)
        chain = settled_chain(runner, chain, seen.record if current == job_id else None, status, how.sleep)
        yield from told.restarts(chain, current)
        following = chain.after(current) if chain is not None else None
        if chain is None or following is None:
            break
        yield from told.once(chains.restart_line(chain, current))
        if following == current:  # Slurm requeues it under its own id: poll it again, not spin
            how.sleep(how.poll)
        current = following
    yield from _wrote(how.output, chain, seen)  # what the last job wrote while it ended
    result = ended_outcome(runner, status, launcher, chain)
    if result.state != FORGOTTEN and not over:
        remember(seen.record, result)
    if chain is not None:
        chains.remember_chain(chain, where_key(runner))
    yield Ended(result)


def wait(runner: Runner, job_id: str, on_status: Callable[[jobs.JobStatus], None] | None = None,
         on_restart: Callable[[str], None] | None = None, how: Following | None = None) -> Outcome:
    """`follow` for a caller that wants only the end: each status and restart line to its
    callback; how the job ended."""
    for event in follow(runner, job_id, how):
        if isinstance(event, Polled) and on_status is not None:
            on_status(event.status)
        elif isinstance(event, Restarted) and on_restart is not None:
            on_restart(event.line)
        elif isinstance(event, Ended):
            return event.outcome
    raise AssertionError("follow ends with Ended")


class _Told:
    """The restarts told so far: each once."""

    def __init__(self) -> None:
        self.lines: set[str] = set()

    def once(self, line: str) -> Iterator[Restarted]:
        if line not in self.lines:
            self.lines.add(line)
            yield Restarted(line)

    def restarts(self, chain: chains.Chain | None, current: str) -> Iterator[Restarted]:
        """Those inside the allocation of `current`, as the record shows them now."""
        for _, line in chains.in_place_restarts(chain, current) if chain is not None else ():
            yield from self.once(line)


def _watch(runner: Runner, job_id: str, how: Following, chain: chains.Chain | None,
           first: jobs.JobStatus | None) -> Iterator[jobs.JobStatus]:
    """Slurm's status of `job_id` until it ended (`first`: the one just read, if any);
    once Slurm forgot it, its record's. A job of an ended chain that neither knows any
    more ends as the chain's record says."""
    try:
        yield from jobs.watch(runner, job_id, how.poll, how.sleep, how.cancel_never_start, first)
    except ClusterRefused as refused:
        if "does not know job" not in refused.message:
            raise
        try:
            yield status_or_record(runner, job_id)
        except ClusterRefused:
            if chain is None or chain.final is None:
                raise
            yield jobs.JobStatus(job_id, FORGOTTEN, "", "", "", None, None, "record")


def _reread(runner: Runner, chain: chains.Chain | None, seen: Look, current: str) -> chains.Chain | None:
    if chain is not None:
        return chains.read_chain(runner, chain.folder) or chain
    return chains.find_chain(runner, seen.record if seen.record and current == seen.record.job_id else current)


def _wrote(output: Output | None, chain: chains.Chain | None, seen: Look) -> Iterator[Wrote]:
    text = seen.read(output, chain) if output is not None else ""
    if text:
        yield Wrote(text)


def settled_chain(runner: Runner, chain: chains.Chain | None, record: records.JobRecord | None,
                  status: jobs.JobStatus, sleep: Callable[[float], None] = time.sleep) -> chains.Chain | None:
    """The chain of the job that just ended (`status`), once its record says how that
    job's attempt ended: read again while it lags (RECORD_READS); None without a chain."""
    def read() -> chains.Chain | None:
        if chain is not None:
            return chains.read_chain(runner, chain.folder) or chain
        return chains.find_chain(runner, record or status.job_id, status.stdout_path)

    found = read()
    supervised = found is not None or (record is not None and record.supervised)
    for _ in range(RECORD_READS if supervised else 0):
        if found is not None and found.ended(status.job_id):
            break
        sleep(1.0)
        found = read() or found
    return found


def cancel(runner: Runner, job_id: str) -> list[tuple[str, bool, str]]:
    """scancel `job_id`, and when it belongs to a supervised chain that goes on, the job
    the chain runs (or waits) as now and its standby job: its supervisor then ends the
    chain as cancelled. (job id, True if Slurm cancelled it / False if it had already
    ended, what it is to `job_id`: "" itself, "chain" the job its chain runs as, "standby")
    for each, the standby first: it would take the chain over once the job it waits on
    ended cancelled."""
    try:
        chain = chains.find_chain(runner, job_id)
    except ClusterRefused:
        chain = None
    standby = str((chain.standby or {}).get("job_id") or "") if chain is not None else ""
    ids = [(standby, "standby")] if standby.isdigit() and standby != job_id else []
    ids.append((job_id, ""))
    if chain is not None and chain.final is None and chain.current_job_id not in (i for i, _ in ids):
        ids.append((chain.current_job_id, "chain"))
    return [(i, jobs.cancel(runner, i), role) for i, role in ids]


def state_changes(report: Callable[[str], None]) -> Callable[[jobs.JobStatus], None]:
    """An on_status callback that reports each change of state or reason once."""
    last: list[tuple[str, str]] = []

    def on_status(status: jobs.JobStatus) -> None:
        now = (status.state, status.reason)
        if not last or last[-1] != now:
            last.append(now)
            report(explain_status(status))

    return on_status
