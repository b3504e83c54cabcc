"""A Slurm job clusterkit submitted, as the Python API hands it out: wait for it,
read its output, cancel it; how it ended (JobResult). Nothing here prints or exits.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from cluster_kit.errors import ClusterRefused, InputError

if TYPE_CHECKING:
    from cluster_kit.app import App
    from cluster_kit.lifecycle import Outcome

PathLike = Union[str, "os.PathLike[str]"]


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
        self._app = app or make_app(profile_path)
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

        outcome = lifecycle.wait(self._get_runner(), self.id, how=lifecycle.Following(poll=poll, sleep=sleep))
        return JobResult.from_outcome(outcome, self.excluded)

    def logs(self, follow: bool = False, poll: float = 1.0) -> Iterator[str]:
        """The job's output, line by line (every task's, each under a `==> ID: PATH <==`
        line, for an array job; every attempt's, each under `==> attempt N: job ID: PATH <==`,
        for a job with `resilience:`). `follow`: keep reading until the job ends (through
        its restarts), as `logs -f`."""
        from cluster_kit import lifecycle

        runner = self._get_runner()
        output = lifecycle.Output(runner, self.id)
        if follow:
            how = lifecycle.Following(poll=poll, output=output, cancel_never_start=False)
            yield from _lines(e.text for e in lifecycle.follow(runner, self.id, how) if isinstance(e, lifecycle.Wrote))
        else:
            yield from _lines(iter([lifecycle.look(runner, self.id).read(output)]))

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

    def _get_runner(self) -> Any:
        if self._runner is None:
            self._runner = self._app.job_runner(self.profile, self.id)
        return self._runner


def _lines(chunks: Iterator[str]) -> Iterator[str]:
    """Text as it comes, as whole lines (the last one as it ends)."""
    rest = ""
    for chunk in chunks:
        *whole, rest = (rest + chunk).split("\n")
        yield from (line + "\n" for line in whole)
    if rest:
        yield rest


def make_app(profile_path: Sequence[PathLike]) -> App:
    from cluster_kit.app import App

    if isinstance(profile_path, (str, os.PathLike)):
        profile_path = [profile_path]
    for folder in profile_path:
        if not os.path.isdir(folder):
            raise InputError(f"profile_path {os.fspath(folder)!r} is not a folder",
                             fix="give folders that hold profiles (NAME.yaml) or templates")
    return App(tuple(os.fspath(p) for p in profile_path), verbose=False)
