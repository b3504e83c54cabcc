"""How an attempt ended and who is to blame, from what its launch, its ranks and Slurm left
(stdlib only, Python 3.8+): read here, decided by decide.py's rules."""
from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cluster_kit.analysis import culprit as culprits
from cluster_kit.analysis import rank_files
from cluster_kit.slurm import builders, node_names, outcome
from cluster_kit.supervisor import decide, slurmctl
from cluster_kit.supervisor.attempt import Attempt, say
from cluster_kit.trainer import contract

NODE_TABLE_TRIES = 3



def signalled(watched: Attempt, job_fields: Mapping[str, str]) -> tuple[int | None, str, None]:
    """SIGTERM came: scancel, the time limit, or preemption. The stop file is written
    already; what comes next is settled before the launch is waited for, since Slurm
    kills this script too once its KillWait (or GraceTime) is over."""
    try:
        now = slurmctl.show_job(watched.job_id)
    except RuntimeError:
        now = {}
    cause = decide.term_cause(job_fields, now)
    if cause == "cancelled" and watched.proc is not None and watched.proc.poll() is None:
        watched.stop_launch()
    say({"requeued": "Slurm requeued the job", "preempted": "the job is preempted",
         "time_limit": "the job reached its time limit", "cancelled": "the job was cancelled"}[cause]
        + ("; the ranks were told to stop" if cause != "cancelled" else ""))
    ended = {"requeued": "preempted"}.get(cause, cause)
    return (watched.proc.poll() if watched.proc is not None else None), ended, None


def stop_of(watched: Attempt) -> tuple[bool, str]:
    """(told, ending) of an attempt whose launch ended: whether the ranks were told to
    stop and none reported that training finished, so that it is requeued, never
    counted as completed. The supervisor's grace signal is the time limit; a SIGTERM
    the ranks got from Slurm counts only while Slurm preempts the job (PreemptTime:
    with a partition's GraceTime its steps are signalled, not the batch script), since
    srun sends the same SIGTERM to every task once one of them failed."""
    if rank_files.read_notes(watched.control, contract.FINISHED):
        return False, ""
    if watched.grace:
        return True, "time_limit"
    causes = {n.what for n in rank_files.read_notes(watched.control, contract.STOPPED).values()}
    if "SIGUSR1" in causes:  # the job's own --signal=USR1@N to its steps: the time limit ahead
        return True, "time_limit"
    if not causes:
        return False, ""
    try:
        preempted = decide.preempting(slurmctl.show_job(watched.job_id))
    except RuntimeError:
        preempted = False
    if preempted:
        say("Slurm preempts the job: the ranks were told to stop ({}) and did not report that training "
            "finished".format(", ".join(sorted(causes))))
    return preempted, "preempted" if preempted else ""


def memory_of(job_fields: Mapping[str, str]) -> str:
    """The job's memory as Slurm holds it (`300M per node`, `2000M per CPU`), '' when unknown."""
    for key, unit in (("MinMemoryNode", "node"), ("MinMemoryCPU", "CPU")):
        value = job_fields.get(key, "")
        if value and value not in ("0", "(null)"):
            return f"{value} per {unit}"
    return ""


def end_of(watched: Attempt, code: int | None, job_fields: Mapping[str, str]) -> tuple[str, dict[str, Any] | None]:
    """How the attempt ended, and the culprit."""
    told, cause = stop_of(watched)
    if told:
        return cause, None
    seen = decide.Evidence(now=time.time(), node_of_rank=watched.host_of, memory=memory_of(job_fields))
    if code != 0:
        failed = watched.failed_nodes(time.time())  # with Slurm's state and reason
        if failed is not None:
            return "node_failure", failed
        verdict = outcome.parse_job_output("\n".join(watched.lines))
        crash = culprits.first_failure(rank_files.read_exceptions(watched.control),
                                       rank_files.read_failure_files(watched.control), watched.world_size)
        seen = decide.Evidence(crash=crash, first_task=verdict.first_failure, failed_nodes=verdict.failed_nodes,
                               now=seen.now, node_of_rank=seen.node_of_rank, memory=seen.memory)
    ended, blamed = decide.attempt_end(code, seen)
    if blamed is not None and "detected_after_s" not in blamed and watched.first_error_at is not None:
        blamed["detected_after_s"] = round(max(0.0, time.time() - watched.first_error_at), 1)
    return ended, blamed


def slurm_names(culprit: dict[str, Any] | None, nodes: Sequence[str]) -> dict[str, Any] | None:
    """The culprit with its hosts as the allocation's Slurm names (a rank reports
    SLURMD_NODENAME, else its host name: an FQDN or a cloud name is matched against the
    nodes' NodeHostName and NodeAddr); a host that is none of them is kept apart."""
    if not culprit or not culprit.get("hosts"):
        return culprit
    table = node_table(nodes)
    if table is None:  # Slurm did not answer: the allocation's own names still are Slurm names
        return decide.on_slurm_names(culprit, {h: h for h in culprit["hosts"] if h in nodes})
    known = {n.name for n in table}
    resolved = {h: addresses_of(h) for h in culprit["hosts"] if h not in known}
    return decide.on_slurm_names(culprit, node_names.slurm_names(culprit["hosts"], table, resolved))


def node_table(nodes: Sequence[str], tries: int = NODE_TABLE_TRIES,
               pause: float = 2.0) -> list[builders.SlurmNode] | None:
    """`scontrol show node` of the allocation's nodes, asked again when it fails (Slurm
    busy with a failed node); None when it never answered."""
    argv = builders.build_scontrol_show_nodes(",".join(nodes))
    for attempt in range(tries):
        try:
            return builders.parse_scontrol_show_nodes(slurmctl.slurm(argv))
        except (RuntimeError, ValueError) as exc:
            if attempt == tries - 1:
                say(f"cannot read the allocation's nodes from Slurm ({exc}): blaming by the names ranks reported")
                return None
            time.sleep(pause)
    return None


def addresses_of(host: str) -> list[str]:
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None)})
    except OSError:
        return []
