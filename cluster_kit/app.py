"""What every command shares: the search path, the Slurm runner and the SSH fan-out.

Modules that touch processes or the network are imported inside the methods,
so commands that do not need them (render, validate) never load them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from cluster_kit.config.documents import Job, Profile
    from cluster_kit.config.overrides import Override
    from cluster_kit.fleet.preflight import FanOut
    from cluster_kit.slurm.runner import Runner
    from cluster_kit.ssh import HostResult, SshSettings

DEEP_COMMAND_TIMEOUT_S = 90

class App:
    """What every command needs, built once from the global options."""

    def __init__(self, profile_paths: tuple[str, ...], verbose: bool) -> None:
        from cluster_kit.config.search import SearchPath

        self.search = SearchPath.from_environment([Path(p) for p in profile_paths])
        self.verbose = verbose
        self._runners: dict[str, Runner] = {}

    def job(self, path: str, overrides: Sequence[Override] = ()) -> Job:
        """The job file loaded and validated, `overrides` (config.overrides.Override) set first."""
        from cluster_kit.config.load import load_job

        return load_job(Path(path), self.search, overrides)

    def checked_job(self, path: str, offline: bool = False, overrides: Sequence[Override] = ()) -> Job:
        """The job file loaded, with its script checked (ValidationError, exit 2, at
        the `script:` line when it is missing). `offline` checks only what is on
        this machine: a profile with a login host has its script looked up there."""
        from cluster_kit.errors import ValidationError

        job = self.job(path, overrides)
        problem = self.script_problem(job, offline)
        if problem:
            raise ValidationError([f"{job.where('script')}: {problem}"])
        return job

    def script_problem(self, job: Job, offline: bool = False) -> str | None:
        """The `script:` problem of a loaded job, None when the script is there or,
        `offline`, when it lives on the login host and is not looked for."""
        import os

        from cluster_kit.config import jobscript

        host = (job.profile.data.get("login") or {}).get("host")
        if host and offline:
            return None
        exists = self._exists_on_login(job.profile.data) if host else os.path.isfile
        return jobscript.check(job.data["script"], job.data["workdir"], job.path, exists, host)

    def _exists_on_login(self, profile_data: dict[str, Any]) -> Callable[[str], bool]:
        from cluster_kit.config import jobscript
        from cluster_kit.slurm import runner as slurm_runner

        runner = self.runner(profile_data)

        def exists(path: str) -> bool:
            try:
                return bool(runner.run(jobscript.build_exists_command(path)).returncode == 0)
            except slurm_runner.LoginRefused as exc:
                raise slurm_runner.LoginRefused(
                    f"cannot look for the job's script {path} on {profile_data['login']['host']}: {exc.reason}", exc.reason,
                    fix=exc.fix) from None
        return exists

    def job_problems(self, job: Job, offline: bool = False) -> list[tuple[str, str]]:
        """What `validate` finds beyond the files: a missing script, a template that
        does not render. (key, message) pairs; the message names the fix."""
        from cluster_kit.config.effective import effective
        from cluster_kit.errors import ClusterKitError
        from cluster_kit.render.environment import render_job

        problems = []
        script = self.script_problem(job, offline)
        if script:
            problems.append(("script", script))
        try:
            render_job(effective(job), self.search.template_dirs())
        except ClusterKitError as exc:
            fix = f"; {exc.fix}" if exc.fix else ""
            problems.append(("template", f"template: {exc.message}{fix}"))
        return problems

    def profile(self, ref: str) -> Profile:
        from cluster_kit.config.load import load_profile

        return load_profile(ref, self.search)

    def runner(self, profile_data: dict[str, Any]) -> Runner:
        """Where sbatch/squeue run: on login.host over SSH, or here.

        One runner per login section for the whole command, so that the steps of
        a command (sinfo, sbatch, squeue while waiting) share it.
        """
        from cluster_kit.slurm import runner as slurm_runner

        login = profile_data.get("login") or {}
        key = repr(sorted(login.items())) if login.get("host") else ""
        if key not in self._runners:
            log = self.log if self.verbose else None
            if key:
                remote = slurm_runner.LoginRunner(login, log=log)
                context = click.get_current_context(silent=True)
                if context is not None:  # else (the Python API) close() closes it
                    context.call_on_close(remote.close)
                self._runners[key] = remote
            else:
                self._runners[key] = slurm_runner.LocalRunner(log=log)
        return self._runners[key]

    def job_runner(self, profile_ref: str | None, job_id: str) -> Runner:
        """The runner of a job's login host: `profile_ref`'s, else that of the profile
        the job's record names, else a local one."""
        from cluster_kit.lifecycle import records

        if not profile_ref:
            record = records.find(job_id)
            if record is not None and record.where != "local" and record.profile:
                profile_ref = record.profile
        return self.runner(self.profile(profile_ref).data if profile_ref else {})

    def close(self) -> None:
        """Close the runners' SSH connections (a command's close on its own, through click)."""
        for runner in self._runners.values():
            close = getattr(runner, "close", None)
            if close is not None:
                close()
        self._runners.clear()

    def fan_out(self, profile_data: dict[str, Any], deep: bool = False) -> FanOut:
        """A fan_out bound to the profile's SSH settings.

        `deep` allows for the probe's torch import (up to 60 s on a cold node).
        """
        import dataclasses

        from cluster_kit import ssh

        settings = ssh.SshSettings.from_profile(profile_data.get("ssh") or {})
        if deep and settings.command_timeout < DEEP_COMMAND_TIMEOUT_S:
            settings = dataclasses.replace(settings, command_timeout=DEEP_COMMAND_TIMEOUT_S)

        def run(hosts: list[str], command: str, stdin: bytes | None = None,
                on_result: Callable[[HostResult], None] | None = None) -> list[HostResult]:
            if self.verbose:
                self.log(f"ssh to {len(hosts)} node(s) {describe_ssh(hosts, settings)}: {command}")
            return ssh.fan_out(hosts, command, settings, stdin=stdin, on_result=on_result)

        return run


    def log(self, line: str) -> None:
        """One `--verbose` line on stderr."""
        click.echo(f"clusterkit: {line}", err=True)


def describe_ssh(hosts: list[str], settings: SshSettings) -> str:
    """`n[1-2] as ckuser, port 22` (the targets of a fan-out, for --verbose)."""
    from cluster_kit.hostlist import fold

    user = getattr(settings, "user", None)
    port = getattr(settings, "port", None)
    who = f" as {user}" if user else ""
    return fold(hosts) + who + (f", port {port}" if port else "")


pass_app = click.make_pass_decorator(App)
