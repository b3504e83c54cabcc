"""What one host's command came to: `HostResult` and the failures worth one line."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class HostResult:
    """What one host did: exit status and output, or a one-line error.

    `error` is None whenever the command ran to completion (then `exit_status`
    is its status); `ok` means that and status 0.
    """

    host: str
    ok: bool
    exit_status: int | None
    stdout: str
    stderr: str
    error: str | None
    elapsed_s: float
    fix: str | None = None  # what to do about `error`, where the failing step knows it

    @property
    def reached(self) -> bool:
        """True when SSH connected, authenticated and the command finished."""
        return self.error is None


class HostError(Exception):
    """A host failed in a way worth one line: the message is that line; `fix`,
    when the step knows it, is what to do."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


class CommandTimeout(HostError):
    """The command outran command_timeout; keeps what it printed so far."""

    def __init__(self, timeout: float, out: bytes, err: bytes) -> None:
        super().__init__(f"no answer within {timeout:g}s: the command was still running "
                         "(command_timeout)")
        self.out = out
        self.err = err


# ----------------------------------------------------------------------------
# One host, start to finish


def one_line(value: object) -> str:
    return " ".join(str(value).split())


def short_path(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home != "/" and path.startswith(home + os.sep) else path
