"""Runs one built Slurm command: here (subprocess) or on login.host over SSH.

The only place in the package that starts a process.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cluster_kit.errors import ClusterRefused
from cluster_kit.slurm import builders as slurm

DEFAULT_TIMEOUT_S = 60.0


# Variables that change what Slurm's clients do. Inside a job (clusterkit run
# from salloc/srun or a batch script) SLURM_* describe *that* job; sbatch would
# take SLURM_/SBATCH_ ones as options or copy them into the new job, whose srun
# then fails (e.g. SLURM_MEM_PER_CPU vs SLURM_MEM_PER_NODE). SQUEUE_/SINFO_/
# SACCT_/SCANCEL_ ones filter or reformat the output the parsers read.
SCRUBBED_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_",
                     "SACCT_", "SCANCEL_", "SCONTROL_",
                     # clusterkit's own: a job submitted from inside a supervised job
                     # must not carry its control folder, attempt or checkpoint folder
                     "CLUSTERKIT_")


# Set by the user to pick the cluster, never by Slurm for a job: kept.
KEPT_VARIABLES = frozenset({"SLURM_CONF", "SLURM_CLUSTERS"})


NOT_FOUND_FIX = "run on a login node or set login.host in the profile"


@dataclass(frozen=True)
class Completed:
    """One finished command: argv, exit status and its text output."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Runner(Protocol):
    """Runs one argv (locally or remotely) and returns its Completed."""

    where: str

    def run(self, argv: Sequence[str], stdin: str | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> Completed: ...


def scrubbed_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the variables that would leak into Slurm's clients."""
    return {
        name: value for name, value in environ.items()
        if name in KEPT_VARIABLES or not name.startswith(SCRUBBED_PREFIXES)
    }


class LocalRunner:
    """Runs Slurm's commands on this machine."""

    where = "on this machine"

    def __init__(self, environ: Mapping[str, str] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.env = scrubbed_environment(os.environ if environ is None else environ)
        self.log = log

    def run(self, argv: Sequence[str], stdin: str | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> Completed:
        """Run argv; ClusterRefused if it is missing or outlives `timeout`."""
        argv = list(argv)
        if self.log is not None:
            self.log(f"run {self.where}: {shlex.join(argv)}")
        try:
            proc = subprocess.run(
                argv, input=stdin, capture_output=True, env=self.env, timeout=timeout,
                encoding="utf-8", errors="replace", check=False,
            )
        except FileNotFoundError:
            raise ClusterRefused(f"{argv[0]} not found on this machine", fix=NOT_FOUND_FIX) from None
        except subprocess.TimeoutExpired:
            raise ClusterRefused(
                f"{argv[0]} did not finish within {timeout:g} s",
                fix="check that slurmctld answers (scontrol ping)",
            ) from None
        return Completed(argv, proc.returncode, proc.stdout, proc.stderr)


class LoginRefused(ClusterRefused):
    """The login host could not run a command: SSH failed (`reason` says how)."""

    def __init__(self, message: str, reason: str, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.reason = reason


class LoginRunner:
    """Runs Slurm's commands on the profile's `login.host` over SSH.

    `login` is the profile's `login` section (host plus SSH settings). One SSH
    connection serves every command of the runner (submit, then each poll of
    `--wait`); it is opened on first use, opened again if it dropped between
    commands (a command is never re-run), and closed by `close`. The SSH module
    is imported only when a command runs, so rendering never loads paramiko.
    """

    def __init__(self, login: Mapping[str, Any], settings: Any = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.host = str(login["host"])
        self.log = log
        self.login = dict(login)
        self.settings = settings
        self.where = f"on {self.host}"
        self._session: Any = None
        self._opened: contextlib.ExitStack | None = None

    def run(self, argv: Sequence[str], stdin: str | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> Completed:
        """Run argv on the login host; ClusterRefused if SSH fails or it is missing.

        The timeout is the profile's `login.command_timeout` (SSH applies it).
        """
        argv = list(argv)
        if self.log is not None:
            self.log(f"run on {self.host} over SSH: {shlex.join(argv)}")
        data = stdin.encode() if stdin is not None else None
        result = self._connected(argv[0]).run(shlex.join(argv), stdin=data)
        if result.error is not None or result.exit_status is None:
            raise self._refusal(argv[0], result.error or "no exit status", result.fix)
        if result.exit_status == 127 and "not found" in result.stderr:
            raise ClusterRefused(f"{argv[0]} not found on {self.host}",
                                 fix="set login.host to a node with Slurm's client commands")
        return Completed(argv, result.exit_status, result.stdout, result.stderr)

    def close(self) -> None:
        """Close the SSH connection, if one is open."""
        if self._opened is not None:
            self._opened.close()
        self._opened = self._session = None

    def _connected(self, program: str) -> Any:
        """The session to the login host, (re)opened when there is none alive."""
        from cluster_kit import errors, ssh

        if self._session is not None and not self._session.active:
            self.close()
        if self._session is None:
            opened = contextlib.ExitStack()
            try:
                self._session = opened.enter_context(ssh.open_client(self.host, self._ssh_settings()))
            except errors.SshConnectError as exc:
                raise self._refusal(program, exc.reason, exc.known_fix) from None
            self._opened = opened
        return self._session

    def _refusal(self, program: str, reason: str, fix: str | None = None) -> LoginRefused:
        return LoginRefused(f"cannot run {program} on {self.host}: {reason}", reason,
                            fix=fix or f"check that `ssh {self.host}` works with the profile's login settings")

    def _ssh_settings(self) -> Any:
        if self.settings is None:
            from cluster_kit.ssh import SshSettings

            self.settings = SshSettings.from_profile(self.login)
        return self.settings


# ----------------------------------------------------------------------------
# helpers


def refusal(command: str, completed: Completed, runner: Runner) -> ClusterRefused:
    """ClusterRefused carrying Slurm's own message and, where known, the fix."""
    message = slurm.slurm_error_message(completed.stderr, completed.stdout)
    return ClusterRefused(f"{command} failed {runner.where}: {message}",
                          fix=slurm.fix_for(message, completed.argv))


def run_checked(runner: Runner, argv: list[str], stdin: str | None = None) -> Completed:
    """Run argv; ClusterRefused with Slurm's message if it exits nonzero."""
    completed = runner.run(argv, stdin=stdin)
    if not completed.ok:
        raise refusal(argv[0], completed, runner)
    return completed
