"""Follow a submitted job to its end and say how it ended.

A job with `resilience:` ends at the end of its chain: each restart is a new
Slurm job, named in the attempts record (lifecycle/chains.py), and waited for in turn.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cluster_kit.errors import ClusterRefused
from cluster_kit.lifecycle import chains, records
from cluster_kit.lifecycle.submission import where_key
from cluster_kit.slurm import builders as slurm
from cluster_kit.slurm import jobs, outcome

if TYPE_CHECKING:
    from cluster_kit.slurm.runner import Runner

FORGOTTEN = "UNKNOWN"  # the state of a job Slurm forgot and no record says how it ended
# The attempts record is written as the supervisor ends, just before the job does; a
# file system shared with the login host may show it a little later: read it again
# this many times, a second apart, before going by Slurm alone.
RECORD_READS = 10


_ENDED = {"COMPLETED": "completed", "TIMEOUT": "time_limit", "DEADLINE": "time_limit",
          "NODE_FAIL": "node_failure", "BOOT_FAIL": "node_failure", "PREEMPTED": "preempted",
          "CANCELLED": "cancelled"}


def ended_as(status: jobs.JobStatus) -> str:
    """The attempt's end in the product's words (`running` until it ended)."""
    if not status.finished:
        return "running"
    return _ENDED.get(slurm.base_state(status.state), "crash")

@dataclass(frozen=True)
class Outcome:
    """How a job (or one array task) ended, in one sentence and as data."""

    job_id: str
    state: str
    exit_status: int | None
    explanation: str
    output: str | None = None
    tasks: tuple[Outcome, ...] = ()
    first_failure: dict[str, Any] | None = None
    attempts: tuple[dict[str, Any], ...] = ()  # a supervised job's attempts (chains.attempt_summaries)

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"job_id": self.job_id, "state": self.state, "exit_code": self.exit_status,
                               "explanation": self.explanation, "output": self.output}
        if self.first_failure:
            doc["first_failure"] = self.first_failure
        if self.tasks:
            doc["tasks"] = [task.as_dict() for task in self.tasks]
        if self.attempts:
            doc["attempts"] = list(self.attempts)
        return doc


@dataclass
class _Seen:
    """What a poll loop remembers of the statuses it reported."""

    last: list[tuple[str, str]] = field(default_factory=list)


def status_or_record(runner: Runner, job_id: str) -> jobs.JobStatus:
    """The job's status from Slurm, else from clusterkit's record once Slurm
    forgot it (state as last seen, output path as submitted).

    Raises ClusterRefused when neither knows the job."""
    try:
        return jobs.job_status(runner, job_id)
    except ClusterRefused as refused:
        record = records.find(job_id, where_key(runner))
        if record is None or "does not know job" not in refused.message:
            raise
    ended = record.ended or {}
    output = record.outputs.get(job_id) or next(iter(record.outputs.values()), None)
    code = ended.get("exit_status")
    exit_code = None if not isinstance(code, int) else (
        slurm.ExitCode(0, code - 128) if code > 128 else slurm.ExitCode(code, 0))
    return jobs.JobStatus(job_id, str(ended.get("state") or FORGOTTEN), "", "", "", exit_code, output, "record")


def job_outcome(runner: Runner, status: jobs.JobStatus, launcher: str = "srun") -> Outcome:
    """How a finished job ended: Slurm's state, the first failing task found in
    its output (srun's own lines), its exit code; per task for an array."""
    if status.tasks:
        tasks = tuple(_task_outcome(runner, task, launcher) for task in status.tasks)
        failed = [t for t in tasks if t.state != "COMPLETED"]
        summary = (f"array job {status.job_id}: {len(failed)} of {len(tasks)} task(s) did not complete; "
                   + "; ".join(t.explanation for t in failed)) if failed else (
                   f"array job {status.job_id}: all {len(tasks)} tasks completed (exit code 0)")
        return Outcome(status.job_id, status.state, status.exit_status, summary, None, tasks)
    return _task_outcome(runner, status, launcher)


def _task_outcome(runner: Runner, status: jobs.JobStatus, launcher: str) -> Outcome:
    path = status.stdout_path or _recorded_output(runner, status.job_id)
    verdict = outcome.parse_job_output(jobs.read_tail(runner, path)) if path and status.finished else None
    text = outcome.explain(status.job_id, status.state, status.exit_status, verdict, ranks=launcher != "torchrun")
    first = verdict.first_failure if verdict else None
    failure = None if first is None or slurm.base_state(status.state) == "COMPLETED" else {
        "node": first.node, "tasks": list(first.tasks), "what": first.what, "exit_code": first.exit_code}
    return Outcome(status.job_id, slurm.base_state(status.state), status.exit_status, text, path,
                   first_failure=failure)


def _recorded_output(runner: Runner, job_id: str) -> str | None:
    record = records.find(job_id, where_key(runner))
    return (record.outputs.get(job_id) or None) if record else None


def explain_status(status: jobs.JobStatus) -> str:
    """`job 7: PENDING (Resources)` — a line for a job that has not ended."""
    reason = f" ({status.reason})" if status.reason and status.reason != "None" else ""
    return f"job {status.job_id}: {status.state}{reason}"


def wait(runner: Runner, job_id: str, on_status: Callable[[jobs.JobStatus], None] | None = None,
         poll: float = 5.0, launcher: str | None = None, *,
         on_restart: Callable[[str], None] | None = None, chain: chains.Chain | None = None,
         cancel_never_start: bool = True, sleep: Callable[[float], None] | None = None) -> Outcome:
    """Poll until the job ends (cancelling it if Slurm can never start it,
    ClusterRefused then); its outcome, also kept in its record.

    A job with `resilience:` is followed through its restarts: when its attempts
    record says the chain goes on, `on_restart` gets one line and the next job is
    waited for. The outcome is then the last job's, with the chain's exit code and
    its `attempts`. `chain`: the job's chain when already read.
    """
    sleep = sleep or time.sleep
    record = records.find(job_id, where_key(runner))
    record = record if record is not None and record.job_id == job_id else None
    launcher = launcher or (record.launcher if record else "srun")
    current = job_id
    told: set[int] = set()

    def tell_in_place(found: chains.Chain | None) -> None:
        """Each restart inside the job's allocation, once, as the record shows it."""
        for number, line in chains.in_place_restarts(found, current) if found is not None else ():
            if number not in told and on_restart is not None:
                told.add(number)
                on_restart(line)

    def watching(status: jobs.JobStatus) -> None:
        nonlocal chain
        if on_status is not None:
            on_status(status)
        if on_restart is not None and status.phase == "running" and (chain is not None or supervised):
            chain = (chains.read_chain(runner, chain.folder) if chain is not None
                     else chains.find_chain(runner, record if current == job_id and record else current)) or chain
            tell_in_place(chain)

    supervised = record is not None and record.supervised
    while True:
        jobs.wait(runner, current, poll=poll, on_status=watching, cancel_never_start=cancel_never_start,
                  sleep=sleep)
        status = jobs.job_status(runner, current)
        result = job_outcome(runner, status, launcher)
        chain = settled_chain(runner, chain, record if current == job_id else None, status, sleep)
        tell_in_place(chain)
        following = chain.after(current) if chain is not None else None
        if chain is None or following is None:
            break
        if on_restart is not None:
            on_restart(chains.restart_line(chain, current))
        current = following
    result = chain_outcome(result, chain)
    remember(record, result)
    if chain is not None:
        chains.remember_chain(chain, where_key(runner))
    return result


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


def chain_outcome(result: Outcome, chain: chains.Chain | None) -> Outcome:
    """The last job's outcome as the chain's: its exit code (once the record has it),
    the chain's end after Slurm's words, and the attempts."""
    if chain is None:
        return result
    code = chain.exit_code if chain.exit_code is not None else result.exit_status
    return dataclasses.replace(result, exit_status=code, explanation=f"{result.explanation}; {chains.summary(chain)}",
                               attempts=tuple(chains.attempt_summaries(chain)))


def remember(record: records.JobRecord | None, result: Outcome) -> None:
    """Keep how the job ended in its record (for when Slurm has forgotten it)."""
    if record is None:
        return
    record.ended = {"state": result.state, "exit_status": result.exit_status,
                    "explanation": result.explanation}
    if result.tasks:
        record.outputs.update({t.job_id: t.output for t in result.tasks if t.output})
    records.save(record)


def state_changes(report: Callable[[str], None]) -> Callable[[jobs.JobStatus], None]:
    """An on_status callback that reports each change of state or reason once."""
    seen = _Seen()

    def on_status(status: jobs.JobStatus) -> None:
        now = (status.state, status.reason)
        if not seen.last or seen.last[-1] != now:
            seen.last.append(now)
            report(explain_status(status))

    return on_status

