"""The one owner of a supervised chain: its record, its folder, its standby job, its next job
(stdlib only, Python 3.8+).

Which chain a job belongs to comes from Slurm and the record, never from the
environment: a restart carries `clusterkit-chain=<first job id>` in its Slurm
comment, and its record (a folder of this user that nobody else can write,
private.py) must list it as the attempt that comes next. Only the script attempt 0
kept (by its digest) is ever submitted again.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping

from cluster_kit.hostlist import NodeSet
from cluster_kit.supervisor import decide, private, record, slurmctl
from cluster_kit.supervisor.attempt import say
from cluster_kit.supervisor.record import AttemptRecord, ChainRecord, Final
from cluster_kit.supervisor.settings import Settings

SCRIPT_NAME = "job.sbatch"


class Refused(RuntimeError):
    """The job does not train: the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """This batch job: its id and `scontrol show job`'s fields when it started."""

    id: str
    fields: Mapping[str, str]

    @property
    def output(self) -> str:
        return self.fields.get("StdOut", "")


class Chain:
    """A chain's record, read and written through this object only, and the Slurm jobs it
    submits: the standby job beside each attempt, the next attempt's job."""

    def __init__(self, job: SlurmJob, chain_id: str, folder: str, rec: ChainRecord) -> None:
        self.job = job
        self.chain_id = chain_id
        self.folder = folder
        self.rec = rec

    @classmethod
    def open(cls, job: SlurmJob, comment: str, settings: Settings) -> Chain:
        """The chain of this job (`comment`: its Slurm comment), trusted; Refused when it cannot be."""
        chain_id = slurmctl.chain_of(comment) or job.id
        folder = record.folder_for(job.output, chain_id)
        record.make_private_dir(folder)
        rec = record.load(folder)
        if chain_id != job.id:
            if rec is None or rec.job_id != chain_id or not lists_job(rec, job.id):
                raise Refused(f"job {job.id} was submitted as an attempt of the chain of job {chain_id}, but that "
                              f"chain's record ({os.path.join(folder, record.RECORD_NAME)}) does not name it as "
                              "its next attempt; nothing was run")
            return cls(job, chain_id, folder, rec)
        if rec is not None and rec.job_id != job.id:
            raise Refused(f"{folder} holds the record of job {rec.job_id}, not of job {job.id}; nothing was run")
        return cls(job, chain_id, folder, rec or record.new_record(job.id, settings.resilience.to_dict()))

    def reload(self) -> None:
        """Read the record again (another supervisor of the chain may have written it last)."""
        self.rec = record.load(self.folder) or self.rec

    def save(self) -> None:
        record.save(self.folder, self.rec)

    @property
    def exclude(self) -> list[str]:
        """The nodes every start of the chain goes without: the first submit's --exclude and
        the nodes the chain excluded."""
        named = slurmctl.hostnames(",".join(self.rec.start_exclude + self.rec.excluded_nodes()))
        return list(dict.fromkeys(named))

    # --- the script -----------------------------------------------------------------------
    def keep_script(self, script_path: str) -> None:
        """Copy the batch script into the record folder (attempt 0) and keep its digest, and
        the job's own --exclude: only that script is ever submitted again."""
        with open(script_path, "rb") as f:
            data = f.read()
        private.write(os.path.join(self.folder, SCRIPT_NAME), data)
        self.rec.script_digest = private.digest(data)
        excluded = self.job.fields.get("ExcNodeList", "(null)")
        self.rec.start_exclude = [] if excluded in ("", "(null)") else slurmctl.hostnames(excluded)

    def kept_script(self) -> bytes:
        """The bytes of the script copy, once they match the digest kept at attempt 0."""
        path = os.path.join(self.folder, SCRIPT_NAME)
        data = private.read(path)
        if data is None or not self.rec.script_digest or private.digest(data) != self.rec.script_digest:
            raise Refused(f"{path} is not the script attempt 0 kept (its digest differs, or it is gone): "
                          "the next attempt was not submitted")
        return data

    def submit_next(self, without: list[str], after: str = "afterany") -> str:
        """sbatch the kept script as the chain's next job, once this one ended."""
        return slurmctl.submit_next(self.kept_script(), self.job.id, self.chain_id, without, after)

    # --- the standby job --------------------------------------------------------------------
    def keep_standby(self) -> None:
        """A job that goes on with the chain only if this one dies with its batch script (its
        node failed: with --no-kill Slurm does not requeue the job then, it fails it):
        `--dependency=afternotok` on this job. Every end the supervisor sees cancels it."""
        standby = self.rec.standby or {}
        if standby.get("after") == self.job.id:
            return  # this job runs again (Slurm requeued it): its standby still waits
        try:
            self.rec.standby = {"job_id": self.submit_next(self.exclude, after="afternotok"), "after": self.job.id}
        except (RuntimeError, private.Untrusted) as exc:
            say(f"no standby job (the chain ends if the batch script's node fails): {exc}")
            self.rec.standby = None

    def exclude_standby(self) -> None:
        """The waiting standby job leaves out what the chain excludes now (its list was
        fixed when it was submitted)."""
        standby = self.rec.standby or {}
        if standby.get("job_id") and not slurmctl.set_excluded(standby["job_id"], self.exclude):
            say(f"cannot update the excluded nodes of the standby job {standby['job_id']}; it leaves them out "
                "when it starts")

    def drop_standby(self, after: str) -> None:
        """Cancel the standby of job `after`: the supervisor saw its attempt end and took the next step."""
        standby = self.rec.standby or {}
        if standby.get("after") != after:
            return
        try:
            slurmctl.cancel(standby["job_id"])
        except RuntimeError as exc:
            say(f"cannot cancel the standby job {standby['job_id']}: {exc}")
        self.rec.standby = None

    # --- attempts that lost their batch script --------------------------------------------
    def close_lost_attempts(self) -> bool:
        """An attempt still `running` in the record lost its batch script: the node of the
        batch script failed (this is the standby job, or Slurm requeued the job). It ended as
        a node failure of the nodes Slurm says failed. False when no node failed behind the
        standby job: the batch script was ended by a cancel, and the chain ends as cancelled."""
        for attempt in self.rec.attempts:
            if attempt.ended != "running":
                continue
            down = slurmctl.failed_nodes(slurmctl.hostnames(attempt.allocation or attempt.nodes))
            now = round(time.time(), 3)
            attempt.ended, attempt.ended_at = "node_failure", now
            attempt.why = f"its batch script was killed (job {self.job.id} took over)"
            if not down and attempt.slurm_job_id != self.job.id:
                attempt.ended = "cancelled"
                attempt.why = (f"its batch script ended and no node of it failed: the chain was cancelled (job "
                               f"{self.job.id}, its standby, does not train)")
                self.rec.final = Final("cancelled", 1, attempt.why)
                return False
            if down:
                self._blame_lost(attempt, down, now)
        return True

    def _blame_lost(self, attempt: AttemptRecord, down: list[str], now: float) -> None:
        attempt.culprit = decide.recorded_culprit(decide.culprit_of(
            [], down, "Slurm reports node {} failed; the batch script ran on {}".format(
                ",".join(down), attempt.batch_host or "?")))
        attempt.excluded = [n for n in down if n not in self.rec.exclude]
        self.rec.exclude = self.rec.excluded_nodes() + attempt.excluded
        marked = [t for t in (decide.slurm_time(at) for at in slurmctl.reason_times(down).values()) if t]
        attempt.detected_after_s = round(max(0.0, now - max(marked)), 1) if marked else 0.0

    # --- the next step --------------------------------------------------------------------
    def finish(self, attempt: AttemptRecord, step: decide.Step) -> int:
        """Record the next step: nothing to submit when Slurm requeued the job (it gets the
        chain's excluded nodes), a new job without them, or the chain's end. The
        supervisor's exit code."""
        attempt.why = step.why
        if step.action != "requeued":
            self.drop_standby(self.job.id)
        if step.action == "requeued":
            self._requeued()
        elif step.action == "restart":
            self._restart(attempt, step)
        else:
            self.rec.final = Final(attempt.ended, step.exit_code or 0, step.why)
        self.save()
        if self.rec.final is not None and attempt.ended == "preempted":
            self._cancel_requeued()
        told = f"attempt {attempt.attempt} ended: {attempt.ended}"
        if (attempt.culprit or {}).get("evidence"):
            told += f" ({(attempt.culprit or {})['evidence']})"
        if attempt.next_job_id:
            without = f" without {NodeSet.of(attempt.without)}" if attempt.without else ""
            say(f"{told}; {step.why}; next attempt: job {attempt.next_job_id}{without}")
        else:
            say(f"{told}; {self.rec.final.why if self.rec.final else step.why}")
        return (step.exit_code or 0) if self.rec.final is None else self.rec.final.exit_code

    REQUEUE_UPDATE_S = 3.0  # what Slurm's KillWait leaves for setting a requeued job's excluded nodes

    def _requeued(self) -> None:
        """The same job runs again: Slurm takes an ExcNodeList while the requeued job
        completes. The record first: Slurm's KillWait may end this script any moment."""
        self.save()
        if self.exclude and not slurmctl.set_excluded(self.job.id, self.exclude, self.REQUEUE_UPDATE_S):
            say(f"cannot set the excluded nodes of the requeued job {self.job.id} now; its next run leaves them out")

    def _restart(self, attempt: AttemptRecord, step: decide.Step) -> None:
        added = [n for n in step.exclude if n not in self.rec.exclude]
        if added:
            attempt.excluded = added
        self.rec.exclude = list(step.exclude)
        attempt.without = self.exclude  # (Slurm gives a new job no drained node by itself)
        try:
            attempt.next_job_id = self.submit_next(attempt.without)
        except (RuntimeError, private.Untrusted) as exc:
            self.rec.final = Final(attempt.ended, 1, f"{step.why}; the next attempt could not be submitted: {exc}")

    def _cancel_requeued(self) -> None:
        """The chain ended on a requeue by Slurm: cancel the requeued job (its run, if it
        starts anyway, reads the record's end and stops at once)."""
        try:
            slurmctl.cancel(self.job.id)
        except RuntimeError as exc:
            say(f"cannot cancel the requeued job {self.job.id}: {exc}")


def lists_job(rec: ChainRecord, job_id: str) -> bool:
    """Whether the record names `job_id` as one of its attempts, as the one submitted next,
    or as the standby job."""
    return (any(job_id in (a.slurm_job_id, a.next_job_id) for a in rec.attempts)
            or (rec.standby or {}).get("job_id") == job_id)
