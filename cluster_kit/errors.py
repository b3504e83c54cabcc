"""One family of errors: each carries its exit code and, where known, the fix.

Exit codes are the product contract (SPEC): 1 a check failed / node unreachable /
job failed, 2 bad input, 3 the cluster refused.
"""
from __future__ import annotations

import re
from typing import IO, Any

import click

# The one sanitizer's characters: C0 controls, DEL and C1 controls (what could end a
# line or start a terminal escape sequence), the Unicode line and paragraph separators,
# and lone surrogates (which YAML's "\ud800" escape can produce and no encoder takes).
CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def escaped(char: str) -> str:
    """One character as an escape a terminal shows verbatim: `\\x1b`, `\\u2028`."""
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_LINE_CHARS = {"\n": "\\n", "\t": "\\t"}  # kept, or written as Python writes them


def printable(text: str, keep_newlines: bool = True) -> str:
    """`text` with terminal controls and unencodable characters shown as escapes (`\\x1b`).

    Newlines and tabs stay as they are with `keep_newlines`, else they become `\\n`, `\\t`.
    """
    def escape(match: re.Match[str]) -> str:
        char = match.group()
        if char in _LINE_CHARS:
            return char if keep_newlines else _LINE_CHARS[char]
        return escaped(char)

    return CONTROL_CHARS.sub(escape, text)


class ClusterKitError(click.ClickException):
    """Base error: printed as one line (plus the fix), never as a traceback."""

    exit_code = 2

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix

    def format_message(self) -> str:
        if self.fix:
            return f"{self.message}\n  fix: {self.fix}"
        return self.message

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(printable(f"clusterkit: error: {self.format_message()}"), err=True)


class InputError(ClusterKitError):
    """Bad user input: YAML, validation, template, usage (exit 2)."""

    exit_code = 2


class ValidationError(InputError):
    """Several `FILE:LINE: message` problems found at once (exit 2)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))

    def show(self, file: IO[Any] | None = None) -> None:
        for line in self.problems:
            click.echo(printable(line), err=True)


class CheckFailed(ClusterKitError):
    """A check failed, a node was unreachable, or the job failed (exit 1)."""

    exit_code = 1


class ClusterRefused(ClusterKitError):
    """sbatch/squeue/scontrol or the SSH login said no (exit 3)."""

    exit_code = 3


class SshConnectError(ClusterRefused):
    """The login host could not be reached over SSH (exit 3)."""

    def __init__(self, host: str, reason: str, fix: str | None = None) -> None:
        super().__init__(f"cannot reach {host} over SSH: {reason}",
                         fix=fix or f"check that `ssh {host}` works with the profile's settings")
        self.host = host
        self.reason = reason
        self.known_fix = fix


class ExitStatus(CheckFailed):
    """A command's verdict is already printed; only the exit code is left to give.

    Raised instead of calling `sys.exit`, so that `cli.main()` is the one place
    that turns outcomes into exit codes. Prints nothing.
    """

    def __init__(self, code: int) -> None:
        super().__init__(f"exit status {code}")
        self.exit_code = code  # type: ignore[misc]  # the code is per instance here

    def show(self, file: IO[Any] | None = None) -> None:
        pass


def exit_with(code: int) -> None:
    """End the command with `code` (through `cli.main`): nothing when it is 0."""
    if code:
        raise ExitStatus(code)
