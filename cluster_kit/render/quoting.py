"""Quoting filters: shell words, variable names, #SBATCH values, comment text."""
from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Any

from cluster_kit.config.validators import ENV_NAME_RE
from cluster_kit.errors import CONTROL_CHARS, InputError

# Bare #SBATCH values need none of sbatch's quoting; anything else is quoted.
_SBATCH_BARE = re.compile(r"[A-Za-z0-9_.,:/%@+=^~-]+\Z")


# sbatch reads a line containing either word as a heterogeneous-job separator.
_HETJOB_WORDS = ("hetjob", "packjob")


# Which effective-settings key each #SBATCH option comes from (for messages).
_SETTING_FOR_OPTION = {
    "job-name": "name",
    "nodes": "nodes",
    "ntasks-per-node": "ntasks_per_node",
    "gpus-per-node": "gpus_per_node",
    "cpus-per-task": "slurm.cpus_per_task",
    "mem": "slurm.mem",
    "time": "slurm.time",
    "partition": "slurm.partition",
    "account": "slurm.account",
    "qos": "slurm.qos",
    "constraint": "slurm.constraint",
    "nodelist": "slurm.nodelist",
    "exclude": "slurm.exclude",
    "exclusive": "slurm.exclusive",
    "output": "output",
    "chdir": "workdir",
}


# ----------------------------------------------------------------------------
# Quoting filters


def shq(value: Any) -> str:
    """Quote one value as a single POSIX shell word (`shlex.quote` semantics).

    Numbers and booleans are quoted as their text; None is refused because it
    always means a template forgot to test whether a setting is unset.
    """
    if value is None:
        raise InputError(
            "a template quoted an unset value",
            fix="guard optional settings with `{% if x is not none %}` in the template",
        )
    quoted = shlex.quote(setting_text(value))
    # A bare word starting with "=" is valid shell, but `export X==y` reads as
    # a typo to people and to shellcheck; single quotes change nothing else.
    return f"'{quoted}'" if quoted.startswith("=") else quoted


def shjoin(values: Sequence[Any]) -> str:
    """Quote each value with `shq` and join them with spaces (an argv)."""
    return " ".join(shq(value) for value in values)


def shname(name: Any) -> str:
    """Pass through a shell variable name, refusing anything that is not one."""
    text = str(name)
    if not ENV_NAME_RE.fullmatch(text):
        raise InputError(
            f"{text!r} is not a valid environment variable name",
            fix="use letters, digits and underscores, not starting with a digit",
        )
    return text


def sbatch_value(value: Any, option: str = "") -> str:
    """Render one `#SBATCH --option=VALUE` value, or refuse it.

    sbatch splits `#SBATCH` lines itself: whitespace separates words, `"` and
    `'` quote, `\\` escapes and an unquoted `#` starts a comment. Plain values
    are written bare; others are double-quoted with `\\` and `"` escaped.
    Control characters (newline, CR, NUL, ...) and the words `hetjob`/`packjob`
    cannot be made safe and raise InputError naming the setting.
    """
    text = setting_text(value)
    where = _describe_option(option)
    bad = next((ch for ch in text if ord(ch) < 0x20 or ord(ch) == 0x7F), None)
    if bad is not None:
        raise InputError(
            f"{where}: value {text!r} contains the control character {bad!r}; "
            "#SBATCH values must be one line",
            fix="remove the newline or control character from the value",
        )
    lowered = text.lower()
    for word in _HETJOB_WORDS:
        if word in lowered:
            raise InputError(
                f"{where}: value {text!r} contains {word!r}, which sbatch reads as a "
                "heterogeneous-job separator",
                fix=f"choose a value without {word!r}",
            )
    if _SBATCH_BARE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def oneline(value: Any) -> str:
    """Text safe inside a `#` comment line: control characters become spaces."""
    return CONTROL_CHARS.sub(" ", setting_text(value))


def _describe_option(option: str) -> str:
    if not option:
        return "#SBATCH value"
    setting = _SETTING_FOR_OPTION.get(option, f"slurm.sbatch.{option}")
    return f"{setting} (#SBATCH --{option})"


def setting_text(value: Any) -> str:
    """The text of a setting value: booleans as `true`/`false`, the rest as str()."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
