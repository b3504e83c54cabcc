"""The Python API: submit a job (or a sweep as one array job) from a script or a
notebook, and follow it.

    import cluster_kit
    job = cluster_kit.submit("job.yaml", overrides={"env.LR": "3e-4"})
    result = job.wait()            # JobResult: exit_code, state, explanation, ...
    print("".join(job.logs()))

The same implementation as `clusterkit submit` (lifecycle/request.py): overrides are
validated like the job file, preflight routes around failing nodes, every job gets
a record. Nothing here prints or exits: failures raise `ClusterKitError` subclasses
whose `exit_code` is the CLI's and whose `fix` says what to do.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from cluster_kit.errors import ClusterKitError, ClusterRefused, InputError

if TYPE_CHECKING:
    from cluster_kit.app import App
    from cluster_kit.lifecycle import Outcome

PathLike = Union[str, "os.PathLike[str]"]
After = Union[str, "Job", Sequence[Union[str, "Job"]], None]

__all__ = ["ClusterKitError", "Job", "JobResult", "submit", "submit_sweep"]


@dataclass(frozen=True)
class JobResult:
    """How a job ended.

    `exit_code`: the job's own exit code (0 only when it completed; for an array job
    its first failed task's); `state`: Slurm's word (COMPLETED, FAILED, TIMEOUT,
    CANCELLED, ...); `explanation`: the sentence `clusterkit submit --wait` prints;
    `attempts`: the attempts of a job with `resilience:`; `excluded`: the nodes
    submit routed around, with their failing checks; `tasks`: an array job's tasks.
    """

    job_id: str
    exit_code: int | None
    state: str
    explanation: str
    output: str | None = None
    attempts: tuple[dict[str, Any], ...] = ()
    excluded: dict[str, list[str]] = field(default_factory=dict)
    tasks: tuple[JobResult, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the job completed with exit code 0."""
        return self.exit_code == 0

    @classmethod
    def from_outcome(cls, outcome: Outcome, excluded: Mapping[str, list[str]] | None = None) -> JobResult:
        return cls(outcome.job_id, outcome.exit_status, outcome.state, outcome.explanation, outcome.output,
                   tuple(outcome.attempts), dict(excluded or {}),
                   tuple(cls.from_outcome(task) for task in outcome.tasks))


class Job:
    """A Slurm job clusterkit submitted (or one attached by its id).

    `id` is Slurm's job id (`123`, or `123_4` for one task of a sweep's array);
    `values` a sweep task's values; `excluded` the nodes submit routed around.
    """

    def __init__(self, job_id: str, *, profile: str | None = None, profile_path: Sequence[PathLike] = (),
                 values: Mapping[str, Any] | None = None, excluded: Mapping[str, list[str]] | None = None,
                 app: App | None = None) -> None:
        from cluster_kit.slurm import builders as slurm

        try:
            self.id = slurm.check_job_id(str(job_id))
        except ValueError as exc:
            raise InputError(f"{exc}", fix="use the id sbatch printed, e.g. 1234 (1234_5 for an array task)") from None
        self.profile = profile
        self.values = dict(values or {})
        self.excluded = dict(excluded or {})
        self._app = app or _make_app(profile_path)
        self._runner: Any = None

    def __repr__(self) -> str:
        values = f", values={self.values!r}" if self.values else ""
        return f"Job({self.id!r}{values})"

    @classmethod
    def attach(cls, job_id: str, profile: str | None = None, profile_path: Sequence[PathLike] = ()) -> Job:
        """A Job for an id submitted earlier (by the CLI, or another process). The
        profile (for its login host) defaults to the one the job's record names."""
        return cls(job_id, profile=profile, profile_path=profile_path)

    @property
    def array_id(self) -> str:
        """The array job's id of a sweep task (`123` of `123_4`); the id itself otherwise."""
        return self.id.split("_", 1)[0]

    def state(self) -> str:
        """Slurm's state now: PENDING, RUNNING, COMPLETED, FAILED, ... (from the job's
        record once Slurm forgot it, UNKNOWN when that says nothing)."""
        from cluster_kit import lifecycle

        return str(lifecycle.status_or_record(self._get_runner(), self.id).state)

    def wait(self, timeout: float | None = None, poll: float = 5.0) -> JobResult:
        """Block until the job ends (a job with `resilience:` through its restarts);
        how it ended. A job Slurm can never start is cancelled (ClusterRefused, exit 3);
        `timeout` seconds passing raises ClusterRefused and leaves the job running."""
        from cluster_kit import lifecycle

        deadline = None if timeout is None else time.monotonic() + timeout

        def sleep(seconds: float) -> None:
            if deadline is not None and time.monotonic() + seconds > deadline:
                raise ClusterRefused(f"job {self.id} has not ended after {timeout:g} s",
                                     fix=f"wait longer, or cancel it: job.cancel() (clusterkit cancel {self.id})")
            time.sleep(seconds)

        outcome = lifecycle.wait(self._get_runner(), self.id, poll=poll, sleep=sleep)
        return JobResult.from_outcome(outcome, self.excluded)

    def logs(self, follow: bool = False, poll: float = 1.0) -> Iterator[str]:
        """The job's output, line by line (every task's, each under a `==> ID: PATH <==`
        line, for an array job; every attempt's, each under `==> attempt N: job ID: PATH <==`,
        for a job with `resilience:`). `follow`: keep reading until the job ends (through
        its restarts), as `logs -f`."""
        from cluster_kit import lifecycle
        from cluster_kit.slurm import jobs

        runner = self._get_runner()
        chain = self._chain(runner, wait=follow, poll=poll)
        if chain is not None:
            yield from _lines(_chain_text(runner, chain, follow, poll))
            return
        offsets: dict[str, int] = {}
        partial: dict[str, str] = {}
        headed: set[str] = set()
        while True:
            info = lifecycle.status_or_record(runner, self.id)
            paths = self._output_paths()
            for task_id, path in paths.items():
                chunk = jobs.read_path(runner, path, offsets.get(task_id, 0))
                offsets[task_id] = offsets.get(task_id, 0) + len(chunk.encode())
                if chunk and len(paths) > 1 and task_id not in headed:
                    headed.add(task_id)
                    yield f"==> {task_id}: {path} <==\n"
                text = partial.get(task_id, "") + chunk
                *whole, rest = text.split("\n")
                partial[task_id] = rest
                yield from (line + "\n" for line in whole)
            if not follow or info.finished or info.source == "record":
                break
            time.sleep(poll)
        yield from (rest for rest in partial.values() if rest)

    def cancel(self) -> bool:
        """scancel the job (and, for a job with `resilience:`, the job its chain runs as
        now): True if Slurm cancelled any, False if they had already ended."""
        from cluster_kit import lifecycle

        return any(cancelled for _, cancelled, role in lifecycle.cancel(self._get_runner(), self.id)
                   if role != "standby")

    def close(self) -> None:
        """Close an SSH connection to the login host (reopened when needed)."""
        self._app.close()
        self._runner = None

    def _chain(self, runner: Any, wait: bool, poll: float) -> Any:
        """The chain of attempts of a job with `resilience:` (None for any other job). Its
        supervisor writes the chain's record as the job starts: `wait` for that while the
        job is queued, when clusterkit's record says it was submitted with `resilience:`."""
        from cluster_kit import lifecycle
        from cluster_kit.lifecycle import records, where_key

        record = records.find(self.id, where_key(runner))
        supervised = record is not None and record.supervised
        while True:
            info = lifecycle.status_or_record(runner, self.id)
            chain = lifecycle.find_chain(runner, self.id, info.stdout_path)
            if chain is not None or not (wait and supervised) or info.finished or info.source == "record":
                return chain
            time.sleep(poll)

    def _output_paths(self) -> dict[str, str]:
        from cluster_kit.lifecycle import records, where_key
        from cluster_kit.slurm import jobs

        runner = self._get_runner()
        paths = jobs.job_output_paths(runner, self.id)
        if paths:
            return paths
        record = records.find(self.id, where_key(runner))
        if record is not None and record.outputs:
            wanted = {k: v for k, v in record.outputs.items() if k == self.id}
            return wanted or dict(record.outputs)
        return {}

    def _get_runner(self) -> Any:
        if self._runner is None:
            self._runner = job_runner(self._app, self.profile, self.id)
        return self._runner


def _chain_text(runner: Any, chain: Any, follow: bool, poll: float) -> Iterator[str]:
    """A chain's output as it comes: every attempt's so far, then (`follow`) the newest
    attempt's through each restart, until the chain ends or its last job ends with no
    restart after it."""
    from cluster_kit import lifecycle

    output = lifecycle.ChainOutput(runner)
    yield output.read(chain, every=True)
    while follow and chain.final is None:
        status = lifecycle.status_or_record(runner, chain.current_job_id)
        if status.finished or status.source == "record":
            # once the record says how that job's attempt ended: a restart, or none
            chain = lifecycle.settled_chain(runner, chain, None, status, time.sleep) or chain
            if chain.after(status.job_id) is None:
                break
        else:
            chain = lifecycle.read_chain(runner, chain.folder) or chain
        yield output.read(chain)
        time.sleep(poll)
    yield output.read(chain)


def _lines(chunks: Iterator[str]) -> Iterator[str]:
    """Text as it comes, as whole lines (the last one as it ends)."""
    rest = ""
    for chunk in chunks:
        *whole, rest = (rest + chunk).split("\n")
        yield from (line + "\n" for line in whole)
    if rest:
        yield rest


def job_runner(app: App, profile: str | None, job_id: str) -> Any:
    """The runner of `profile` (its login host), else of the profile the job's
    record names, else a local one."""
    from cluster_kit.lifecycle import records

    if not profile:
        record = records.find(job_id)
        if record is not None and record.where != "local" and record.profile:
            profile = record.profile
    return app.runner(app.profile(profile).data if profile else {})


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

    app = _make_app(profile_path)
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

    app = _make_app(profile_path)
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


def _make_app(profile_path: Sequence[PathLike]) -> App:
    from cluster_kit.app import App

    if isinstance(profile_path, (str, os.PathLike)):
        profile_path = [profile_path]
    for folder in profile_path:
        if not os.path.isdir(folder):
            raise InputError(f"profile_path {os.fspath(folder)!r} is not a folder",
                             fix="give folders that hold profiles (NAME.yaml) or templates")
    return App(tuple(os.fspath(p) for p in profile_path), verbose=False)
