"""How a job ended, in one sentence and as data: Slurm's state, the first failing
task found in its output, its exit code; a chain's end after its last job's; kept in
the job's record for when Slurm has forgotten it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cluster_kit.errors import ClusterRefused
from cluster_kit.lifecycle import chains, records
from cluster_kit.lifecycle.submission import where_key
from cluster_kit.slurm import builders as slurm
from cluster_kit.slurm import jobs, outcome

if TYPE_CHECKING:
    from cluster_kit.slurm.runner import Runner

FORGOTTEN = "UNKNOWN"  # the state of a job Slurm forgot and no record says how it ended

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


def ended_outcome(runner: Runner, status: jobs.JobStatus, launcher: str, chain: chains.Chain | None) -> Outcome:
    """How the job followed last ended (`status`: Slurm's, or its record's once Slurm
    forgot it), as its chain's when it has one; said so when nothing tells."""
    if status.finished:
        return chain_outcome(job_outcome(runner, status, launcher), chain)
    if chain is not None and chain.final is not None:
        return Outcome(chain.current_job_id, chains.chain_state(chain, None), chain.exit_code,
                       f"job {chain.chain_id}: {chains.summary(chain)}", attempts=tuple(chains.attempt_summaries(chain)))
    return Outcome(status.job_id, FORGOTTEN, None,
                   f"Slurm no longer knows job {status.job_id}, and clusterkit's record does not say how it ended")
