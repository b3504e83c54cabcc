"""`clusterkit diagnose` of a job with `resilience:`: every attempt of its chain.

The supervisor already diagnosed each attempt (how it ended, the culprit ranks and
hosts with the evidence, the stacks of a hang) into the attempts record; this adds
Slurm's state of the job the chain runs as now and the advice that needs the
whole chain: a node blamed again, a failure that follows the script from node to
node, restarts used up.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from cluster_kit.errors import ClusterRefused
from cluster_kit.hostlist import NodeSet
from cluster_kit.lifecycle.chains import Chain, chain_state
from cluster_kit.lifecycle.outcome import ended_as
from cluster_kit.supervisor.record import FAILURES, REQUEUES

if TYPE_CHECKING:
    from cluster_kit.slurm import jobs
    from cluster_kit.slurm.runner import Runner

ATTEMPT_KEYS = ("attempt", "slurm_job_id", "step", "nodes", "waited_s", "started_at", "ended_at", "ended",
                "exit_code", "detected_after_s", "culprit", "excluded", "released", "checkpoints", "why",
                "next_job_id", "without", "output", "stacks")


def diagnose_chain(runner: Runner, chain: Chain, job_id: str) -> dict[str, Any]:
    """The `diagnose --json` document of a supervised job (`job_id`: any job of its chain)."""
    from cluster_kit.lifecycle.outcome import status_or_record

    current = chain.current_job_id
    try:
        status: jobs.JobStatus | None = status_or_record(runner, current)
    except ClusterRefused:
        status = None
    attempts = [attempt_entry(a, status) for a in chain.attempts]
    doc: dict[str, Any] = {"job_id": job_id, "chain_id": chain.chain_id, "state": chain_state(chain, status),
                           "attempts": attempts}
    if chain.final is not None:
        doc["final"] = chain.final
    doc["advice"] = chain_advice(chain, attempts, status)
    return doc


def attempt_entry(attempt: dict[str, Any], status: jobs.JobStatus | None) -> dict[str, Any]:
    """The record's attempt in the SPEC's shape; one the record says runs is judged by
    Slurm once its job ended (its supervisor could not write the end)."""
    entry = {k: attempt[k] for k in ATTEMPT_KEYS if attempt.get(k) not in (None, [], {}, "")}
    entry.setdefault("nodes", "")
    if (entry.get("ended") == "running" and status is not None and status.finished
            and status.job_id == entry.get("slurm_job_id")):
        entry["ended"] = ended_as(status)
        entry["why"] = f"Slurm says job {status.job_id} ended {status.state}; its supervisor did not record the end"
    return entry


def chain_advice(chain: Chain, attempts: list[dict[str, Any]], status: jobs.JobStatus | None) -> list[str]:
    """What to do next, from the whole chain."""
    advice = _node_advice(attempts) + _crash_advice(attempts) + _final_advice(chain)
    if chain.final is None and status is not None and not status.finished:
        advice.append(f"the job runs as job {status.job_id} ({status.state}): follow it with "
                      f"clusterkit logs -f {status.job_id}")
    return advice


def _blamed_hosts(attempt: dict[str, Any]) -> NodeSet:
    return NodeSet.of(str(h) for h in (attempt.get("culprit") or {}).get("hosts") or ())


def _nodes_fault(attempt: dict[str, Any], scripts: set[str]) -> bool:
    """Whether the attempt's culprit is a node's: not a program error, nor the first of a
    failure (a hang) that a later attempt had again as the script's (`scripts`: those signatures)."""
    culprit = attempt.get("culprit") or {}
    return culprit.get("kind") != "program" and culprit.get("signature") not in scripts


def _node_advice(attempts: list[dict[str, Any]]) -> list[str]:
    """A node blamed by two attempts, or for a hang or a node failure: check it, drain it."""
    scripts = {str(a["culprit"]["signature"]) for a in attempts
               if (a.get("culprit") or {}).get("kind") == "program" and a["culprit"].get("signature")}
    attempts = [a for a in attempts if _nodes_fault(a, scripts)]
    blamed = Counter(h for a in attempts for h in _blamed_hosts(a))
    advice = []
    for host, times in blamed.items():
        if times > 1:
            advice.append(f"{host} was blamed by {times} attempts: check it (clusterkit audit --nodes {host}) "
                          "and keep jobs off it until it is fixed (drain it; audit --drain --apply drains "
                          "a node that fails a check)")
    for attempt in attempts:
        hosts = [h for h in _blamed_hosts(attempt) if blamed[h] == 1]
        if hosts and attempt.get("ended") in ("hang", "node_failure"):
            nodes = ",".join(hosts)
            what = "hung on" if attempt["ended"] == "hang" else "lost"
            advice.append(f"attempt {attempt['attempt']} {what} {nodes}: check {nodes} (clusterkit audit "
                          f"--nodes {nodes}) before it runs jobs again; drain it if a check fails "
                          "(audit --drain --apply)")
    return advice


def _crash_advice(attempts: list[dict[str, Any]]) -> list[str]:
    """The same crash on different nodes follows the script; one crash: read its traceback."""
    crashes = [a for a in attempts if a.get("ended") == "crash" and a.get("culprit")]
    if not crashes:
        return []
    hosts = NodeSet.of(h for a in crashes for h in _blamed_hosts(a))
    shapes = {_without_hosts(a) for a in crashes}
    last = crashes[-1]
    if len(crashes) > 1 and len(shapes) == 1 and len(hosts) > 1:
        return [(f"the same failure on {', '.join(sorted(hosts))} follows the script, not a node: fix it "
                 f"(clusterkit logs {last['slurm_job_id']}): {last['culprit']['evidence']}")]
    return [f"read the traceback of attempt {a['attempt']}: clusterkit logs {a['slurm_job_id']}" for a in crashes]


def _without_hosts(attempt: dict[str, Any]) -> str:
    evidence = str(attempt["culprit"].get("evidence") or "")
    for host in _blamed_hosts(attempt):
        evidence = evidence.replace(host, "HOST")
    return evidence


def _final_advice(chain: Chain) -> list[str]:
    """Restarts or requeues used up, or a restart sbatch refused."""
    final = chain.final
    if final is None:
        return []
    ended, resilience = final.get("ended"), chain.resilience
    failures = sum(1 for a in chain.attempts if a.get("ended") in FAILURES)
    requeues = sum(1 for a in chain.attempts if a.get("ended") in REQUEUES)
    if ended in FAILURES and failures > int(resilience.get("max_restarts", 0)):
        return [(f"the chain stopped: max_restarts ({resilience.get('max_restarts')}) are used up after "
                 f"{failures} failures: fix the culprit above, or raise resilience.max_restarts "
                 "in the job file, and submit it again")]
    if ended in REQUEUES and requeues > int(resilience.get("max_time_requeues", 0)):
        return [(f"the chain stopped: max_time_requeues ({resilience.get('max_time_requeues')}) are used up: "
                 "raise the job's time or resilience.max_time_requeues, and submit it again (the checkpoints "
                 "in its checkpoint_dir let it resume)")]
    if str(final.get("why") or "").startswith("the script "):
        return [(f"the chain stopped: {final.get('why')}: no node is to blame; fix the script at that place "
                 "(its stack is above), then submit the job again")]
    if ended in FAILURES + REQUEUES:
        return [f"the chain stopped: {final.get('why')}: submit the job again once that is fixed"]
    return []
