"""Submit a rendered job: its output folder, sbatch, its record, never-start."""
from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cluster_kit.errors import ClusterRefused
from cluster_kit.lifecycle import records
from cluster_kit.slurm import jobs

if TYPE_CHECKING:
    from cluster_kit.config.documents import Job
    from cluster_kit.config.effective import Effective
    from cluster_kit.slurm.runner import Runner


def where_key(runner: Runner) -> str:
    """Which Slurm a job id belongs to: `local`, or the login host."""
    return str(getattr(runner, "host", "") or "local")


def output_dir(settings: Mapping[str, Any]) -> str | None:
    """The folder of the job's `output` file (sbatch does not create it), if any."""
    folder = posixpath.dirname(settings.get("output") or "")
    if not folder or "%" in folder:
        return None
    workdir = settings.get("workdir")
    return posixpath.join(workdir, folder) if workdir else folder


def submit(runner: Runner, job: Job, settings: Effective, script: str, *,
           preflight: dict[str, Any] | None = None, excluded: dict[str, list[str]] | None = None,
           test_only: bool = False, record_extra: dict[str, Any] | None = None) -> str:
    """Make the output folder, sbatch the script and keep the job's record: the
    job id (with `test_only`, Slurm's verdict and no record). `record_extra`: more
    fields of the record (sweep, dependency, overrides, git commit)."""
    folder = output_dir(settings)
    if folder and not test_only:
        runner.run(["mkdir", "-p", folder])
    result = jobs.submit(runner, script, test_only=test_only)
    if not test_only:
        record = build_record(runner, job, settings, script, result, preflight, excluded)
        for name, value in (record_extra or {}).items():
            setattr(record, name, value)
        records.save(record)
    return result


def build_record(runner: Runner, job: Job, settings: Effective, script: str, job_id: str,
                 preflight: dict[str, Any] | None, excluded: dict[str, list[str]] | None) -> records.JobRecord:
    """The record of a job just submitted; its output paths as Slurm expanded them."""
    try:
        outputs = jobs.job_output_paths(runner, job_id)
    except ClusterRefused:
        outputs = {}
    return records.JobRecord(
        job_id=job_id, where=where_key(runner), name=str(settings.get("name") or ""),
        profile=str(job.profile.path.resolve()) if getattr(job.profile, "path", None) else None,
        job_file=str(job.path.resolve()) if getattr(job, "path", None) else None,
        launcher=str(settings.get("launcher") or "srun"), outputs=outputs,
        excluded=dict(excluded or {}), settings=dict(settings), script=script, preflight=preflight)


def refuse_never_start(runner: Runner, job_id: str) -> None:
    """Cancel a job Slurm can never start and raise ClusterRefused (exit 3) with
    the reason and fix; return while it may start."""
    refused = jobs.never_start_refusal(runner, jobs.settle(runner, job_id))
    if refused is not None:
        jobs.cancel(runner, job_id)
        raise ClusterRefused(f"{refused.message}; cancelled it", fix=refused.fix)
