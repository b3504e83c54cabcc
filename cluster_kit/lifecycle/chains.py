"""The chain of a job with `resilience:`: its attempts, read back from the supervisor's record.

The supervisor in the batch script (cluster_kit/supervisor) writes `attempts.json`
into the record folder beside the first job's output (`record.folder_for`); a
restart is a new Slurm job, named in the attempt before it as `next_job_id`, and
the chain is over once `final` is set. The record is read through the runner,
where the job's output is (the login host's file system, or here). A later
attempt is found from its own output: its record folder is beside it, one of the
`clusterkit-<id>` folders there whose attempts list it.
"""
from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cluster_kit.errors import ClusterRefused
from cluster_kit.hostlist import NodeSet
from cluster_kit.lifecycle import records
from cluster_kit.lifecycle.submission import where_key
from cluster_kit.slurm import builders as slurm
from cluster_kit.slurm import jobs
from cluster_kit.supervisor import record as attempts_record

if TYPE_CHECKING:
    from cluster_kit.slurm.runner import Runner

SEARCHED_FOLDERS = 16  # record folders beside a later attempt's output looked into, nearest ids first
FOLDER_PREFIX = "clusterkit-"
# Slurm's word for how a chain ended, once Slurm forgot its last job.
FINAL_STATES = {"completed": "COMPLETED", "cancelled": "CANCELLED", "time_limit": "TIMEOUT",
                "preempted": "PREEMPTED", "node_failure": "NODE_FAIL"}


@dataclass(frozen=True)
class Chain:
    """The attempts of one supervised job, as its record says (attempts are the record's dicts)."""

    folder: str
    chain_id: str  # the first job's id
    attempts: tuple[dict[str, Any], ...]
    final: dict[str, Any] | None  # {"ended", "exit_code", "why"} once the chain is over
    resilience: dict[str, Any]
    standby: dict[str, Any] | None = None  # {"job_id", "after"}: goes on if job `after` dies with its script

    @property
    def path(self) -> str:
        return posixpath.join(self.folder, attempts_record.RECORD_NAME)

    @property
    def job_ids(self) -> list[str]:
        """Every Slurm job of the chain in order, a restart not started yet included."""
        ids = [self.chain_id] + [str(a.get("slurm_job_id")) for a in self.attempts]
        ids += [str(a["next_job_id"]) for a in self.attempts if a.get("next_job_id")]
        return list(dict.fromkeys(i for i in ids if i and i != "None"))

    def attempt_of(self, job_id: str) -> dict[str, Any] | None:
        """The last attempt that ran as `job_id` (Slurm may requeue a job under its own id)."""
        found = [a for a in self.attempts if str(a.get("slurm_job_id")) == job_id]
        return found[-1] if found else None

    def after(self, job_id: str) -> str | None:
        """The job the chain went on as after `job_id`'s attempt ended; None when it did not."""
        attempt = self.attempt_of(job_id)
        if attempt is not None and attempt.get("next_job_id"):
            return str(attempt["next_job_id"])
        if attempt is not None and attempt.get("ended") == "running" and self.standby \
                and str(self.standby.get("after")) == job_id:
            return str(self.standby.get("job_id"))  # the batch script died: the standby job takes over
        if attempt is not None and attempt.get("ended") == "preempted" and self.final is None:
            return job_id  # Slurm requeued it: the chain goes on as the same job
        return None

    def ended(self, job_id: str) -> bool:
        """True once the record says how `job_id`'s attempt ended (or the chain is over)."""
        attempt = self.attempt_of(job_id)
        return self.final is not None or (attempt is not None and attempt.get("ended") != "running")

    @property
    def current_job_id(self) -> str:
        """The job the chain runs as now: the restart submitted last, else the last attempt's."""
        if not self.attempts:
            return self.chain_id
        last = str(self.attempts[-1].get("slurm_job_id"))
        if self.attempts[-1].get("ended") == "running":
            return last  # (its standby takes over only if it dies)
        following = self.after(last) if self.final is None else None
        return following or last

    @property
    def exit_code(self) -> int | None:
        """The chain's exit code once it is over (its last attempt's)."""
        code = (self.final or {}).get("exit_code")
        return code if isinstance(code, int) else None


def chain_state(chain: Chain, status: jobs.JobStatus | None) -> str:
    """Slurm's state of the job the chain runs as now; once Slurm forgot it, the record's end."""
    if status is not None and status.state and status.state != "UNKNOWN":
        return slurm.base_state(status.state) or status.state
    if chain.final is not None:
        return FINAL_STATES.get(str(chain.final.get("ended")), "FAILED")
    return "UNKNOWN"


def parse_chain(text: str, folder: str) -> Chain | None:
    """The chain in an attempts record's text (read by the supervisor's own reader); None
    when it is not one."""
    rec = attempts_record.parse(text)
    if rec is None:
        return None
    return Chain(folder, rec.job_id, tuple(a.to_dict() for a in rec.attempts),
                 rec.final.to_dict() if rec.final else None, dict(rec.resilience),
                 dict(rec.standby) if rec.standby else None)


def read_chain(runner: Runner, folder: str) -> Chain | None:
    """The chain whose record is in `folder`, read through the runner; None without one,
    and None for a record someone else could have written (the supervisor refuses
    those too: see supervisor/private.py)."""
    path = posixpath.join(_plain_path(folder), attempts_record.RECORD_NAME)
    if not _owned(runner, [_plain_path(folder), path]):
        return None
    completed = runner.run(["cat", "--", path])
    return parse_chain(completed.stdout, folder) if completed.ok else None


def _owned(runner: Runner, paths: Sequence[str]) -> bool:
    """Whether every path is the runner's user's, not a link, and not writable by others."""
    user = runner.run(["id", "-u"])
    listed = runner.run(["stat", "-c", "%u %a %F", "--", *paths])
    return user.ok and listed.ok and owned_by(listed.stdout, user.stdout.strip(), len(paths))


def owned_by(stat_lines: str, uid: str, count: int) -> bool:
    """`stat -c '%u %a %F'` lines: `count` folders and regular files of `uid` that group
    and others cannot write (a symbolic link is none of them)."""
    lines = stat_lines.splitlines()
    if len(lines) != count:
        return False
    for line in lines:
        owner, mode, kind = (line.split(" ", 2) + ["", ""])[:3]
        if owner != uid or not re.fullmatch(r"[0-7]{3,4}", mode) or int(mode, 8) & 0o022:
            return False
        if kind not in ("directory", "regular file", "regular empty file"):
            return False
    return True


def find_chain(runner: Runner, job: records.JobRecord | str, output: str | None = None) -> Chain | None:
    """The chain `job` belongs to, with its attempts; None for a job without `resilience:`
    (or whose first attempt has not started yet).

    `job` is the record of a job clusterkit submitted (its output path from `outputs`), or
    a job id with its StdOut path `output` (asked of clusterkit's records, then of Slurm,
    when not given). A job clusterkit submitted is a chain's first: its record folder is
    `record.folder_for(output, id)`. Any other job may be a later attempt: the record
    folders beside its output are searched (the SEARCHED_FOLDERS nearest ids below its own).
    """
    record = job if isinstance(job, records.JobRecord) else records.find(job, where_key(runner))
    job_id = job.job_id if isinstance(job, records.JobRecord) else job
    if record is not None and record.job_id != job_id.split("_", 1)[0]:
        record = None
    if record is not None and record.chain_id:
        first = records.find(record.chain_id, record.where)
        if first is not None and not first.chain_id:
            return find_chain(runner, first)
    if record is not None and not record.chain_id:
        return _first_jobs_chain(runner, record, job_id, output)
    output = output or (record.outputs.get(job_id) if record else None) or _slurm_output(runner, job_id)
    return search_beside(runner, output, job_id) if output else None


def _first_jobs_chain(runner: Runner, record: records.JobRecord, job_id: str, output: str | None) -> Chain | None:
    if "resilience" in record.settings and not record.settings["resilience"]:
        return None  # submitted without `resilience:`: no supervisor, no record
    output = output or record.outputs.get(job_id)
    if not output or job_id != record.job_id:
        return None
    chain = read_chain(runner, attempts_record.folder_for(output, job_id))
    return chain if chain is not None and chain.chain_id == job_id else None


def _slurm_output(runner: Runner, job_id: str) -> str | None:
    try:
        return jobs.job_output_path(runner, job_id)
    except ClusterRefused:
        return None


def search_beside(runner: Runner, output: str, job_id: str) -> Chain | None:
    """The chain listing `job_id` among the record folders beside its output file, if any."""
    if not job_id.isdigit():
        return None
    folder = posixpath.dirname(output) or "."
    listed = runner.run(["find", _plain_path(folder), "-mindepth", "1", "-maxdepth", "1", "-type", "d",
                         "-name", FOLDER_PREFIX + "*"])
    candidates = nearest_chain_ids(listed.stdout.splitlines(), int(job_id))
    if job_id in candidates:
        chain = read_chain(runner, attempts_record.folder_for(output, job_id))
        if chain is not None and job_id in chain.job_ids:
            return chain
        candidates.remove(job_id)
    if not candidates:
        return None
    paths = [posixpath.join(attempts_record.folder_for(output, c), attempts_record.RECORD_NAME)
             for c in candidates]
    matched = set(runner.run(["grep", "-l", "-F", "-e", f'"{job_id}"', "--", *map(_plain_path, paths)])
                  .stdout.splitlines())
    for chain_id, path in zip(candidates, paths):
        if _plain_path(path) in matched:
            chain = read_chain(runner, posixpath.dirname(path))
            if chain is not None and chain.chain_id == chain_id and job_id in chain.job_ids:
                return chain
    return None


def nearest_chain_ids(folders: Sequence[str], job_id: int) -> list[str]:
    """The ids of `clusterkit-<id>` folders that may hold `job_id`'s chain: a chain starts
    before its restarts, so ids up to `job_id`, nearest first, at most SEARCHED_FOLDERS."""
    ids = {int(name) for name in (posixpath.basename(f.rstrip("/"))[len(FOLDER_PREFIX):] for f in folders
                                  if posixpath.basename(f.rstrip("/")).startswith(FOLDER_PREFIX))
           if name.isdigit() and int(name) <= job_id}
    return [str(i) for i in sorted(ids, reverse=True)[:SEARCHED_FOLDERS]]


def _plain_path(path: str) -> str:
    """A path no command takes for an option."""
    return path if not path.startswith("-") else "./" + path


def restart_line(chain: Chain, job_id: str) -> str:
    """`attempt 0 ended (hang: rank 3 is not in ...); restarted as job 124 without n2`."""
    attempt = chain.attempt_of(job_id) or {}
    evidence = (attempt.get("culprit") or {}).get("evidence")
    ended = attempt.get("ended", "?")
    if ended == "running":  # its supervisor could not say: it died with its batch script
        ended = "its batch script died"
    following = chain.after(job_id)
    again = "Slurm requeued it as the same job" if following == job_id else f"restarted as job {following}"
    # the nodes the next job was submitted without, as the record says (older records: the excluded ones)
    without = (NodeSet.of(str(n) for n in attempt["without"]) if isinstance(attempt.get("without"), list)
               else excluded_through(chain, attempt))
    # One by one, as the supervisor's own lines name them, not folded.
    return (f"attempt {attempt.get('attempt', '?')} ended ({ended}{': ' + evidence if evidence else ''}); "
            + again + (f" without {','.join(without)}" if without else ""))


IN_PLACE = "; restarted in job "  # how the supervisor's why of an attempt restarted in its allocation goes on


def in_place_restarts(chain: Chain, job_id: str) -> list[tuple[int, str]]:
    """(attempt number, line) for each attempt of `job_id` after which the chain went on
    in the same allocation: `attempt 0 ended (crash: ...); restarted in job 123 on
    n[1,3] (n3 in place of n2); n2 handed back to Slurm`."""
    lines = []
    for attempt in chain.attempts:
        why = str(attempt.get("why") or "")
        if str(attempt.get("slurm_job_id")) != job_id or IN_PLACE not in why:
            continue
        evidence = (attempt.get("culprit") or {}).get("evidence")
        released = attempt.get("released") or []
        lines.append((int(attempt.get("attempt") or 0),
                      f"attempt {attempt.get('attempt', '?')} ended ({attempt.get('ended', '?')}"
                      f"{': ' + evidence if evidence else ''}); {why[why.index(IN_PLACE) + 2:]}"
                      + (f"; {NodeSet.of(str(n) for n in released)} handed back to Slurm" if released else "")))
    return lines


def excluded_through(chain: Chain, last: dict[str, Any]) -> NodeSet:
    """Every node excluded by the attempts up to `last`, in the order they were blamed."""
    out = NodeSet()
    for attempt in chain.attempts:
        out |= NodeSet.of(str(n) for n in attempt.get("excluded") or ())
        if attempt is last:
            break
    return out


def summary(chain: Chain) -> str:
    """How the chain ended, for the line after the last job's (`after 2 attempts (jobs 123, 124): completed`)."""
    count = len(chain.attempts)
    ran = ", ".join(dict.fromkeys(str(a.get("slurm_job_id")) for a in chain.attempts))
    told = f"after {count} attempt{'s' if count != 1 else ''} (job{'s' if ',' in ran else ''} {ran})"
    if chain.final is not None:
        return f"{told}: {chain.final.get('why') or chain.final.get('ended')}"
    last = chain.attempts[-1] if chain.attempts else {}
    if last.get("ended") == "running":
        return (f"{told}: the record ({chain.path}) does not say how attempt {last.get('attempt')} ended "
                "(its supervisor did not finish)")
    return f"{told}: the chain goes on as job {chain.current_job_id}"


def progress(chain: Chain) -> str:
    """Where the chain is: how it ended, else which job it runs or waits as."""
    if chain.final is not None or not chain.attempts:
        return summary(chain)
    last = chain.attempts[-1]
    if last.get("ended") == "running":
        return f"attempt {last.get('attempt')} runs as job {last.get('slurm_job_id')}"
    return f"attempt {int(last.get('attempt') or 0) + 1} is submitted as job {chain.current_job_id}"


def attempt_outputs(chain: Chain) -> list[tuple[str, str]]:
    """(`attempt 0: job 123`, output path) for each output file of the chain's attempts, in
    order; attempts that wrote the same file (an `output` without %j) share one entry."""
    shared: dict[str, list[dict[str, Any]]] = {}
    for attempt in chain.attempts:
        if isinstance(attempt.get("output"), str) and attempt["output"]:
            shared.setdefault(attempt["output"], []).append(attempt)
    return [(_attempts_label(group), path) for path, group in shared.items()]


def _attempts_label(group: list[dict[str, Any]]) -> str:
    numbers = ",".join(str(a.get("attempt")) for a in group)
    ids = ",".join(dict.fromkeys(str(a.get("slurm_job_id")) for a in group))
    return (f"attempt{'s' if len(group) > 1 else ''} {numbers}: "
            f"job{'s' if ',' in ids else ''} {ids}")


def attempt_summaries(chain: Chain) -> list[dict[str, Any]]:
    """The attempts without their stacks (diagnose has those): for `status` and `--wait --json`."""
    return [{k: v for k, v in a.items() if k != "stacks"} for a in chain.attempts]


def remember_chain(chain: Chain, where: str) -> None:
    """Keep a small record of each later attempt clusterkit submitted the first job of:
    its id, output and the chain's first job, so that `status`, `logs` and `diagnose` of
    a restart find its login host and chain once Slurm forgot it."""
    first = records.find(chain.chain_id, where)
    if first is None or first.chain_id or first.job_id != chain.chain_id:
        return
    for attempt in chain.attempts:
        job_id = str(attempt.get("slurm_job_id"))
        if not job_id.isdigit() or job_id == first.job_id or records.find(job_id, where) is not None:
            continue
        output = attempt.get("output")
        records.save(records.JobRecord(
            job_id=job_id, where=where, name=first.name, profile=first.profile, job_file=first.job_file,
            launcher=first.launcher, outputs={job_id: output} if isinstance(output, str) and output else {},
            chain_id=first.job_id))
