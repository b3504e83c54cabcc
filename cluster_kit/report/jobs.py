"""What the job commands print: `submit --json`, `status` (table and JSON), `jobs`,
`cancel` and `diagnose` text, from the data the lifecycle returns."""
from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from cluster_kit.errors import printable
from cluster_kit.render.array import describe as describe_values
from cluster_kit.text import format_table
from cluster_kit.text import printable as one_line

STACK_LINES = 6  # of a culprit rank's stack shown in diagnose's text


def submit_document(job_id: str | None, route: Any, report: dict[str, Any] | None,
                    test_only: str | None = None, submitted: Any = None) -> dict[str, Any]:
    """`submit --json`: job id, the nodes routed around with their checks, the preflight;
    a sweep's array and each index's values; the dependency."""
    doc: dict[str, Any] = {"job_id": job_id, "excluded": dict(route.excluded) if route else {},
                           "preflight": report}
    if test_only is not None:
        doc["test_only"] = test_only
    if submitted is not None and submitted.array:
        doc["array"] = submitted.array
        doc["sweep"] = submitted.sweep_map()
    if submitted is not None and submitted.dependency:
        doc["dependency"] = submitted.dependency
    return doc



def status_document(status: Any, result: Any, chain: Any = None,
                    attempts: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """`status --json`: Slurm's fields, each array task's, how the job ended and,
    for a supervised job, its chain and `attempts` (without their stacks)."""
    doc = {name: str(value) if name == "exit_code" else value for name, value in status.items()}
    doc["job_id"] = status.job_id
    if status.tasks:
        doc["tasks"] = [dict(task.items()) | {"exit_code": str(task.exit_code) if task.exit_code else None}
                        for task in status.tasks]
    if result is not None:
        doc["outcome"] = result.as_dict()
    if chain is not None:
        doc["attempts"] = list(attempts)
        doc["chain"] = {"job_id": chain.chain_id, "current_job_id": chain.current_job_id,
                        "final": chain.final, "record": chain.path}
    return doc


def status_table(status: Any, sweep: dict[str, dict[str, Any]]) -> str:
    """`status`'s FIELD/VALUE table: Slurm's fields, then each array task (with a sweep's values)."""
    rows = [[k, str(v)] for k, v in status.items()]
    rows += [[f"task {t.job_id}", (f"{t.state} exit {t.exit_status}" if t.finished else t.state)
              + task_values_text(sweep, t.job_id)] for t in status.tasks]
    job_id = status.job_id
    if sweep and not status.tasks:
        rows += [[f"task {job_id.split('_', 1)[0]}_{index}", describe(values)] for index, values in sweep.items()
                 if "_" not in job_id or job_id.endswith(f"_{index}")]
    return format_table(["FIELD", "VALUE"], rows)


def chain_lines(chain: Any, progress: str) -> list[str]:
    """`status` of a supervised job: its attempts' table, where the chain is, and the
    last attempt's checkpoint lines (the interval and why, the last save, anything set aside)."""
    lines = [format_table(["ATTEMPT", "JOB", "NODES", "ENDED", "CULPRIT"], attempt_rows(chain)), printable(progress)]
    saved: list[str] = next((a["checkpoints"] for a in reversed(chain.attempts) if a.get("checkpoints")), [])
    return lines + [printable(str(line)) for line in saved]


def attempt_rows(chain: Any) -> list[list[str]]:
    """One row per attempt: number, job, nodes, how it ended, the culprit and the nodes left out."""
    rows = []
    for attempt in chain.attempts:
        blamed = (attempt.get("culprit") or {}).get("evidence") or ""
        excluded = ",".join(map(str, attempt.get("excluded") or ()))
        culprit = "; ".join(part for part in (blamed, f"excluded {excluded}" if excluded else "") if part)
        job = str(attempt.get("step") or attempt.get("slurm_job_id"))  # `123.1`: a step of an allocation
        released = ",".join(map(str, attempt.get("released") or ()))
        culprit += f"; released {released}" if released else ""
        rows.append([str(attempt.get("attempt", "?")), job,
                     str(attempt.get("nodes") or "-"), str(attempt.get("ended")), culprit or "-"])
    return [[one_line(cell) for cell in row] for row in rows]


def task_index(task_id: str) -> str:
    """`12_3` -> `3` (a folded pending range `12_[4-9]` -> `[4-9]`)."""
    return task_id.partition("_")[2]


def task_values_text(sweep: dict[str, dict[str, Any]], task_id: str) -> str:
    values = sweep.get(task_index(task_id))
    return f" ({describe(values)})" if values else ""


def describe(values: dict[str, Any]) -> str:
    return printable(describe_values(values), keep_newlines=False)


def with_sweep(doc: dict[str, Any], sweep: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`status --json` of a sweep: `sweep` maps each array index to its values, and
    each task of `tasks` has its `values`."""
    if not sweep:
        return doc
    doc["sweep"] = sweep
    for task in doc.get("tasks", []):
        if task_index(str(task.get("job_id"))) in sweep:
            task["values"] = sweep[task_index(str(task["job_id"]))]
    if "_" in doc["job_id"]:
        doc["values"] = sweep.get(task_index(doc["job_id"]))
    return doc


def jobs_table(found: Sequence[Any], states: Sequence[str]) -> str:
    """`jobs`: one row per job record, with its state."""
    rows = []
    for record, state in zip(found, states):
        when = datetime.datetime.fromtimestamp(record.submitted_at).strftime("%Y-%m-%d %H:%M")
        what = f"array {record.array}: {len(record.sweep)} tasks" if record.sweep else ""
        if record.dependency:
            what = f"{what}, after {record.dependency}".lstrip(", ")
        rows.append([record.job_id, printable(record.name, keep_newlines=False), state, when, record.where,
                     printable(what, keep_newlines=False) or "-"])
    return format_table(["JOB", "NAME", "STATE", "SUBMITTED", "WHERE", "NOTE"], rows)


def cancel_line(job_id: str, cancelled_id: str, cancelled: bool, role: str) -> str | None:
    """What `cancel JOB_ID` says of one job it asked Slurm to cancel (None: nothing)."""
    chain = {"chain": f" (the chain of job {job_id} ran as it)",
             "standby": f" (the standby job of job {job_id}'s chain)"}.get(role, "")
    if cancelled:
        return f"cancelled {cancelled_id}{chain}"
    if not role or role == "chain":
        return f"job {cancelled_id} had already ended"
    return None


def diagnosis_lines(doc: dict[str, Any]) -> list[str]:
    """`diagnose`'s text: each attempt, its culprit and what came next; the chain's end; advice."""
    chain = "chain_id" in doc
    lines = []
    for attempt in doc["attempts"]:
        code = f" (exit code {attempt['exit_code']})" if chain and attempt.get("exit_code") is not None else ""
        found = (f", found after {attempt['detected_after_s']:g} s"
                 if isinstance(attempt.get("detected_after_s"), (int, float)) else "")
        step = f" step {attempt['step']}" if attempt.get("step") else ""
        lines.append(f"attempt {attempt['attempt']} (job {attempt['slurm_job_id']}{step}, nodes "
                     f"{attempt['nodes'] or '-'}): {attempt['ended']}{code}{found}")
        if attempt.get("explanation"):
            lines.append(f"  {attempt['explanation']}")
        if attempt.get("culprit"):
            lines.append(f"  culprit: {attempt['culprit']['evidence']}")
        if chain:
            lines += chain_attempt_lines(attempt)
    if chain:
        final = doc.get("final")
        end = (f"{final.get('why') or final.get('ended')} (exit code {final.get('exit_code')})" if final
               else "not over")
        lines.append(f"chain of job {doc['chain_id']}: {end}; Slurm state {doc['state']}")
    return lines + [f"advice: {line}" for line in doc["advice"]]


def chain_attempt_lines(attempt: dict[str, Any]) -> list[str]:
    """A supervised attempt's blamed ranks and hosts, excluded nodes, what came next, and
    the last lines of each culprit rank's stack."""
    lines = []
    if attempt.get("waited_s") is not None:
        lines.append(f"  waited {attempt['waited_s']:g} s to run after the attempt before it ended")
    culprit = attempt.get("culprit") or {}
    if culprit.get("ranks") or culprit.get("hosts"):
        ranks = ",".join(map(str, culprit.get("ranks") or ())) or "-"
        lines.append(f"  blamed: rank(s) {ranks} on {','.join(map(str, culprit.get('hosts') or ())) or '-'}")
    for rank in culprit.get("ranks") or ():
        stack = (attempt.get("stacks") or {}).get(str(rank))
        if stack:
            lines.append(f"  stack of rank {rank} (last lines):")
            lines += [f"    {line}" for line in [s for s in str(stack).splitlines() if s.strip()][-STACK_LINES:]]
    if attempt.get("excluded"):
        lines.append(f"  excluded from the next attempts: {','.join(map(str, attempt['excluded']))}")
    if attempt.get("released"):
        lines.append(f"  handed back to Slurm: {','.join(map(str, attempt['released']))}")
    lines += [f"  {line}" for line in attempt.get("checkpoints") or ()]
    if attempt.get("culprit", {}).get("kind") == "program":
        lines.append("  a program error: no node is blamed for it")
    if attempt.get("why"):
        after = f"; restarted as job {attempt['next_job_id']}" if attempt.get("next_job_id") else ""
        lines.append(f"  then: {attempt['why']}{after}")
    return lines
