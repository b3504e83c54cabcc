"""What every command shares: the search path, the Slurm runner and the SSH fan-out.

Modules that touch processes or the network are imported inside the methods,
so commands that do not need them (render, validate) never load them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

DEEP_COMMAND_TIMEOUT_S = 90

class App:
    """What every command needs, built once from the global options."""

    def __init__(self, profile_paths: tuple[str, ...], verbose: bool) -> None:
        from cluster_kit.config import SearchPath

        self.search = SearchPath.from_environment([Path(p) for p in profile_paths])
        self.verbose = verbose
        self._runners: dict[str, Any] = {}

    def job(self, path: str) -> Any:
        from cluster_kit.config import load_job

        return load_job(Path(path), self.search)

    def profile(self, ref: str) -> Any:
        from cluster_kit.config import load_profile

        return load_profile(ref, self.search)

    def runner(self, profile_data: dict[str, Any]) -> Any:
        """Where sbatch/squeue run: on login.host over SSH, or here.

        One runner per login section for the whole command, so that the steps of
        a command (sinfo, sbatch, squeue while waiting) share it.
        """
        from cluster_kit import slurm_runner

        login = profile_data.get("login") or {}
        key = repr(sorted(login.items())) if login.get("host") else ""
        if key not in self._runners:
            self._runners[key] = slurm_runner.LoginRunner(login) if key else slurm_runner.LocalRunner()
            if key:
                click.get_current_context().call_on_close(self._runners[key].close)
        return self._runners[key]

    def fan_out(self, profile_data: dict[str, Any], deep: bool = False) -> Any:
        """A fan_out bound to the profile's SSH settings.

        `deep` allows for the probe's torch import (up to 60 s on a cold node).
        """
        import dataclasses

        from cluster_kit import remote

        settings = remote.SshSettings.from_profile(profile_data.get("ssh") or {})
        if deep and settings.command_timeout < DEEP_COMMAND_TIMEOUT_S:
            settings = dataclasses.replace(settings, command_timeout=DEEP_COMMAND_TIMEOUT_S)

        def run(hosts: list[str], command: str, stdin: bytes | None = None, on_result: Any = None) -> list:
            return remote.fan_out(hosts, command, settings, stdin=stdin, on_result=on_result)

        return run


pass_app = click.make_pass_decorator(App)
