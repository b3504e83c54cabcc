"""`clusterkit diagnose`: how each attempt of a job ended and who is to blame.

A job with `resilience:` is diagnosed from its chain's attempts record
(chain_diagnosis.py). A job submitted without it has one attempt; it is diagnosed from
what Slurm and the job's output hold: Slurm's state, the first task srun named
as failing (with the last line that rank printed), the nodes Slurm reported
failed. The words of `ended` are the product's: completed, hang, crash,
node_failure, time_limit, preempted, cancelled, running.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from cluster_kit.slurm import builders as slurm
from cluster_kit.slurm import jobs, outcome

if TYPE_CHECKING:
    from cluster_kit.lifecycle.outcome import Outcome
    from cluster_kit.slurm.runner import Runner

def last_rank_line(text: str, rank: int) -> str | None:
    """The last line PyTorch prefixed with `[rankN]:` (its traceback's last line)."""
    lines = [line for line in text.splitlines() if line.startswith(f"[rank{rank}]:")]
    return re.sub(r"^\[rank\d+\]:\s*", "", lines[-1]) if lines else None


def culprit(ended: str, result: Outcome | None, output: str, ranks: bool) -> dict[str, Any] | None:
    """Who is to blame for a crash or a node failure; None when no one is."""
    verdict = outcome.parse_job_output(output)
    if ended == "node_failure" and verdict.failed_nodes:
        return {"ranks": [], "hosts": list(verdict.failed_nodes),
                "evidence": f"Slurm reported node(s) {', '.join(verdict.failed_nodes)} failed"}
    first = verdict.first_failure
    if ended != "crash" or first is None:
        return None
    evidence = first.describe(ranks)
    said = last_rank_line(output, first.tasks[0]) if ranks else None
    return {"ranks": list(first.tasks) if ranks else [], "hosts": [first.node],
            "evidence": evidence + (f"; its last line: {said}" if said else "")}


def advice_for(ended: str, blamed: dict[str, Any] | None, job_id: str) -> list[str]:
    """What to do next, from how the attempt ended."""
    if ended == "crash" and blamed:
        return [f"read the failing rank's traceback: clusterkit logs {job_id}"]
    if ended == "crash":
        return [f"read the job's output: clusterkit logs {job_id}"]
    if ended == "node_failure" and blamed:
        hosts = ",".join(blamed["hosts"])
        return [(f"check {hosts} (clusterkit preflight --nodes {hosts}) and resubmit: submit leaves out "
                 "nodes Slurm reports down or drained")]
    if ended in ("time_limit", "preempted"):
        return ["raise the job's time, or save checkpoints often enough to resume from them in a new job"]
    return []


def diagnose(runner: Runner, job_id: str, launcher: str = "srun") -> dict[str, Any]:
    """The `diagnose --json` document of a job: every attempt of a supervised job's
    chain, else the job's single attempt."""
    from cluster_kit.lifecycle.chain_diagnosis import diagnose_chain
    from cluster_kit.lifecycle.chains import find_chain, remember_chain
    from cluster_kit.lifecycle.outcome import ended_as, job_outcome, status_or_record
    from cluster_kit.lifecycle.submission import where_key

    status = status_or_record(runner, job_id)
    chain = find_chain(runner, job_id, status.stdout_path) if not status.tasks else None
    if chain is not None:
        remember_chain(chain, where_key(runner))
        return diagnose_chain(runner, chain, job_id)
    ended = ended_as(status)
    result = job_outcome(runner, status, launcher) if status.finished else None
    path = _failing_output(status, result)
    output = jobs.read_tail(runner, path) if path else ""
    blamed = culprit(ended, result, output, ranks=launcher != "torchrun")
    attempt: dict[str, Any] = {"attempt": 0, "slurm_job_id": job_id, "nodes": status.nodes, "ended": ended}
    if blamed:
        attempt["culprit"] = blamed
    if result is not None:
        attempt["explanation"] = result.explanation
    return {"job_id": job_id, "state": slurm.base_state(status.state) or status.state,
            "attempts": [attempt], "advice": advice_for(ended, blamed, job_id)}


def _failing_output(status: jobs.JobStatus, result: Outcome | None) -> str | None:
    """The output file to read: the first failed array task's, else the job's."""
    if result is not None and result.tasks:
        failed = [t for t in result.tasks if t.state != "COMPLETED"]
        return (failed or list(result.tasks))[0].output
    return (result.output if result else None) or status.stdout_path
