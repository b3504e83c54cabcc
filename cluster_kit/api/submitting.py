"""Submit a job file, or a sweep of it as one array job, as `clusterkit submit` does.

The same implementation (lifecycle/request.py): overrides are validated like the job
file, preflight routes around failing nodes, every job gets a record.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from cluster_kit.api.job import Job, PathLike, make_app

if TYPE_CHECKING:
    from cluster_kit.app import App

After = Union[str, Job, Sequence[Union[str, Job]], None]  # noqa: UP007 (a value: evaluated on 3.9)


def submit(job_file: PathLike, overrides: Mapping[str, Any] | None = None, *, preflight: bool = True,
           strict: bool = False, after: After = None, profile_path: Sequence[PathLike] = ()) -> Job:
    """Submit a job file, as `clusterkit submit` does; the Job.

    `overrides`: dotted keys of the job file and their values (`{"slurm.time":
    "01:00:00", "env.LR": "3e-4"}`), validated like the file (InputError, exit 2,
    naming the key). `preflight`: check the candidate nodes over SSH first and route
    around failing ones (`strict`: refuse instead). `after`: a job (or job id, with
    `:ok`, `:any` or `:notok`) that must end first. `profile_path`: folders searched
    first for profiles and templates.
    """
    from cluster_kit.config.overrides import from_mapping

    app = make_app(profile_path)
    done = _submit(app, job_file, from_mapping(overrides), preflight, strict, after)
    assert done.job_id is not None
    return Job(done.job_id, profile=str(done.job.profile.path), values=None,
               excluded=dict(done.route.excluded) if done.route else None, app=app)


def submit_sweep(job_file: PathLike, sweep: Mapping[str, Sequence[Any]], overrides: Mapping[str, Any] | None = None,
                 *, max_parallel: int | None = None, preflight: bool = True, strict: bool = False,
                 after: After = None, profile_path: Sequence[PathLike] = ()) -> list[Job]:
    """Submit the product of the swept values as ONE Slurm array job, as
    `clusterkit submit --sweep` does; one Job per array task (`123_0`, `123_1`, ...),
    each with its `values`. `sweep`: `{"env.LR": ["1e-3", "3e-4"], "env.BS": ["32", "64"]}`
    (the last key varies fastest); `max_parallel`: at most that many tasks at a time."""
    from cluster_kit.config.overrides import from_mapping, sweep_points

    app = make_app(profile_path)
    points = sweep_points(sweep, "sweep")
    done = _submit(app, job_file, from_mapping(overrides), preflight, strict, after, points, max_parallel)
    excluded = dict(done.route.excluded) if done.route else None
    return [Job(f"{done.job_id}_{index}", profile=str(done.job.profile.path), values=values, excluded=excluded,
                app=app) for index, values in enumerate(done.sweep)]


def _submit(app: App, job_file: PathLike, overrides: Sequence[Any], preflight: bool, strict: bool,
            after: After, points: Sequence[Mapping[str, Any]] = (), max_parallel: int | None = None) -> Any:
    from cluster_kit import lifecycle
    from cluster_kit.lifecycle import SubmitRequest, submit_job

    request = SubmitRequest(os.fspath(job_file), overrides=overrides, preflight=preflight, strict=strict,
                            sweep=points, sweep_source="sweep", max_parallel=max_parallel,
                            after=_after_ids(after))
    done = submit_job(app, request)
    assert done.job_id is not None  # neither a dry run nor --test-only
    lifecycle.refuse_never_start(app.runner(done.job.profile.data), done.job_id)
    return done


def _after_ids(after: After) -> list[str]:
    if after is None:
        return []
    items = [after] if isinstance(after, (str, Job)) else list(after)
    return [item.id if isinstance(item, Job) else str(item) for item in items]
