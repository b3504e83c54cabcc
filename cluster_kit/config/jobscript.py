"""Where a job's `script` (and its `environment.python`) is, and what to say when it is not there.

A relative `script` starts at the job's `workdir` when it sets one (the job
starts there: sbatch --chdir), else at the job file's folder, as `profile:` and
`template:` paths do. The rendered script runs the same path that is checked:
with no workdir, the path resolved against the job file's folder.

Pure: the caller says whether a path exists (`os.path.isfile` here, or
`build_exists_command` run on the login host).
"""
from __future__ import annotations

import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ScriptPlace:
    """The path a job's script is looked for at, and why there.

    `start` is the folder a relative script starts at (None when the script is
    absolute); `from_workdir` says whether that folder is the job's workdir.
    """

    script: str
    path: str
    start: str | None
    from_workdir: bool


def locate(script: str, workdir: str | None, job_file: Path) -> ScriptPlace:
    """Where `script` of the job file `job_file` is (see the module docstring)."""
    if posixpath.isabs(script):
        return ScriptPlace(script, script, None, False)
    if workdir:
        return ScriptPlace(script, posixpath.join(workdir, script), workdir, True)
    folder = os.path.dirname(os.path.abspath(job_file))
    return ScriptPlace(script, os.path.join(folder, script), folder, False)


def runtime_script(script: str, workdir: str | None, job_file: Path) -> str:
    """The script path the rendered job runs: as written under a workdir (the job
    starts there) or when absolute, else resolved against the job file's folder."""
    return script if workdir or posixpath.isabs(script) else locate(script, workdir, job_file).path


def interpreter_path(python: str, start: str | None) -> str:
    """`environment.python` as the job runs it: a name (python3) is looked up on the
    nodes' PATH and an absolute path kept; a relative path (.venv/bin/python) starts at
    `start`, or stays as written when `start` is None (the job starts in its workdir)."""
    if "/" not in python or posixpath.isabs(python) or start is None:
        return python
    return posixpath.normpath(posixpath.join(start, python))


def unexpandable(script: str) -> str | None:
    """The problem of a `~` path, which the job never expands (values are quoted)."""
    if not script.startswith("~"):
        return None
    return (f"script: {script!r} starts with ~, which the job does not expand (the value is quoted); "
            "write the full path, or set workdir: and give the script relative to it")


def missing(place: ScriptPlace, host: str | None = None) -> str:
    """The `script:` problem for a script that is not at `place` (on `host`, or here)."""
    on = f" on {host}" if host else ""
    if place.start is None:
        return f"script: no file {place.path}{on}; check the path"
    if place.from_workdir:
        return (f"script: no file {place.path}{on} (workdir {place.start} + {place.script}); "
                f"check the name, or put {place.script} into the workdir")
    fix = ("set workdir: to the folder on the cluster that holds it" if host
           else "check the name, or set workdir: to the folder that holds it")
    return (f"script: no file {place.path}{on} (without a workdir a relative script starts at "
            f"the job file's folder, {place.start}); {fix}")


def check(script: str, workdir: str | None, job_file: Path, exists: Callable[[str], bool],
          host: str | None = None) -> str | None:
    """The `script:` problem of a job, or None when its script is there."""
    problem = unexpandable(script)
    if problem:
        return problem
    place = locate(script, workdir, job_file)
    return None if exists(place.path) else missing(place, host)


def build_exists_command(path: str) -> list[str]:
    """The argv that exits 0 when `path` is a file (run on the login host)."""
    return ["test", "-f", path]
