"""Scalar checks: each returns the problem text (after `key: `) or None."""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cluster_kit.config.spec import (
    ONE_LINE,
    Rule,
    anycase,
    quoted_value,
    type_and_value,
)
from cluster_kit.config.vocab import NCCL_OWNED, NCCL_VARIABLES
from cluster_kit.trainer import compile_options

if TYPE_CHECKING:
    from cluster_kit.config.spec import Check


# ----------------------------------------------------------------------------
# scalar checks


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    """A rejected value as messages name it: a string quoted, anything else by its type."""
    return quoted_value(value) if isinstance(value, str) else type_and_value(value)


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    """An integer, optionally within [lo, hi]."""
    def check(value: Any) -> str | None:
        if not _is_int(value):
            return f"expected an integer, got {type_and_value(value)}"
        if lo is not None and hi is not None and not lo <= value <= hi:
            return f"{value} is out of range; use {lo}-{hi}"
        if lo is not None and value < lo:
            return f"{value} is too small; use {lo} or more"
        return None
    return Rule(check, {"type": "integer", **({"minimum": lo} if lo is not None else {}),
                        **({"maximum": hi} if hi is not None else {})})


def positive_int() -> Check:
    """A count: an integer >= 1."""
    return integer(lo=1)


def gpus() -> Check:
    """GPUs per node: a count (0: no GPU request, a CPU job), or `type:count` as sbatch
    accepts (h100:8)."""
    def check(value: Any) -> str | None:
        if _is_int(value) and value >= 0:
            return None
        if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_.-]+:[1-9]\d*", value):
            return None
        if _is_int(value):
            return f"{value} is below 0; use 0 for a job without GPUs, or a number such as 8"
        return (f"{_shown(value)} is not a GPU count; use a number such as 8 (0 for a job without "
                "GPUs), or type:count such as h100:8")
    return Rule(check, {"anyOf": [{"type": "integer", "minimum": 0},
                                  {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+:[1-9][0-9]*$"}]})


def gpu_count(value: Any) -> int:
    """8 or "h100:8" -> 8 (sbatch accepts a type prefix on --gpus-per-node); unset -> 0."""
    return 0 if value is None else int(str(value).rsplit(":", 1)[-1])


def asks_no_gpus(value: Any) -> bool:
    """`gpus_per_node: 0`: the job asks Slurm for no GPUs (unset is the profile's business)."""
    return _is_int(value) and value == 0


def positive_number() -> Check:
    """A measure such as a rate or a timeout: a number > 0."""
    def check(value: Any) -> str | None:
        if not _is_number(value):
            return f"expected a number, got {type_and_value(value)}"
        if value <= 0:
            return f"{value} must be greater than 0"
        return None
    return Rule(check, {"type": "number", "exclusiveMinimum": 0})


def boolean() -> Check:
    """true or false."""
    def check(value: Any) -> str | None:
        return None if isinstance(value, bool) else f"expected true or false, got {type_and_value(value)}"
    return Rule(check, {"type": "boolean"})


def one_of(*choices: str, ignore_case: bool = False) -> Check:
    """One of a fixed set of strings."""
    def check(value: Any) -> str | None:
        if value in choices:
            return None
        if ignore_case and isinstance(value, str) and value.upper() in choices:
            return None
        return f"{_shown(value)} is not one of {' | '.join(choices)}"
    return Rule(check, _choices_json(choices, ignore_case))


def _choices_json(choices: tuple[str, ...], ignore_case: bool) -> dict[str, Any]:
    if not ignore_case:
        return {"enum": list(choices)}
    return {"anyOf": [{"enum": list(choices)},
                      {"type": "string", "pattern": "^(?:" + "|".join(anycase(c) for c in choices) + ")$"}]}


def text() -> Check:
    """Any string (newline and NUL are refused for every string by the walker)."""
    def check(value: Any) -> str | None:
        if isinstance(value, str) and value.strip():
            return None
        return "expected a non-empty string" if isinstance(value, str) \
            else f"expected a string, got {type_and_value(value)}"
    return Rule(check, {"type": "string", "pattern": r"^[^\n\u0000]*\S[^\n\u0000]*$"})


def cluster_path(example: str) -> Check:
    """A path the job uses on the nodes; `example` is the full path the fix shows.

    `~` is refused: the job passes the value quoted, so nothing would expand it, and
    this machine's home need not be the nodes'.
    """
    def check(value: Any) -> str | None:
        problem = text()(value)
        if problem:
            return problem
        if value.startswith("~"):
            return (f"{quoted_value(value)} starts with ~, which the job does not expand (the value is "
                    f"quoted); write the full path, e.g. {example}")
        return None
    return Rule(check, {"type": "string", "pattern": r"^(?!~)[^\n\u0000]*\S[^\n\u0000]*$"})


def interpreter() -> Check:
    """environment.python: a command name looked up on the nodes' PATH, or a path to one."""
    return cluster_path("/home/alice/venv/bin/python")


@dataclass(frozen=True)
class Charset:
    """A safe character set for one kind of value, with words for the fix."""

    pattern: str
    allowed: str

    def check(self, value: Any, what: str) -> str | None:
        """Problem text when `value` holds characters outside the set."""
        bad = sorted({ch for ch in value if not re.fullmatch(self.pattern, ch)})
        if not bad:
            return None
        shown = ", ".join(repr(ch) for ch in bad[:10]) + (", ..." if len(bad) > 10 else "")
        return f"{quoted_value(value)} contains {shown}, which {what} must not carry; use {self.allowed}"

    def json_pattern(self) -> str:
        """The JSON Schema pattern of a non-empty string within the set."""
        return "^" + self.pattern + "+$"


SBATCH_WHAT = "an #SBATCH line"


NAME_CHARS = Charset(r"[A-Za-z0-9_.,+-]", "letters, digits and _ . , + -")


CONSTRAINT_CHARS = Charset(r"[A-Za-z0-9_.,:&|*!()\[\]-]",
                           "feature names joined with & | , * [ ] ( ) !")


PATH_CHARS = Charset(r"[A-Za-z0-9_./%@+,=:-]", "a path of letters, digits and _ . / % @ + , = : -")


SBATCH_VALUE_CHARS = Charset(r"[A-Za-z0-9_./%@+,:=*&|!()\[\]^~-]",
                             "letters, digits and _ . / % @ + , : = * & | ! ( ) [ ] ^ ~ -")


HOST_CHARS = Charset(r"[A-Za-z0-9_.@:,%\[\]-]", "a host name, user@host or host:port")


# What a Slurm hostlist may hold: host names and bracketed ranges (no user@ or :port).
HOSTLIST_CHARS = Charset(r"[A-Za-z0-9_.,\[\]-]", "host names and ranges, e.g. gpu[001-064],login01")


IFNAME_CHARS = Charset(r"[A-Za-z0-9_.:@=,^-]", "interface names or prefixes, e.g. eth0 or =eth0,eth1")


def safe_string(chars: Charset, what: str = SBATCH_WHAT) -> Check:
    """A non-empty string within `chars`."""
    def check(value: Any) -> str | None:
        problem = text()(value)
        return problem or chars.check(value, what)
    return Rule(check, {"type": "string", "pattern": chars.json_pattern()})


def sbatch_text(chars: Charset) -> Check:
    """A value of a named #SBATCH option: a safe string, or a number (written as its text)."""
    check_text = safe_string(chars, SBATCH_WHAT)

    def check(value: Any) -> str | None:
        return check_text(str(value) if _is_number(value) else value)
    return Rule(check, {"anyOf": [{"type": "number"}, {"type": "string", "pattern": chars.json_pattern()}]})


_TIME_FORMS = [
    r"\d+",                              # minutes
    r"\d+:[0-5]?\d",                     # MM:SS
    r"\d+:[0-5]?\d:[0-5]?\d",            # HH:MM:SS
    r"\d+-(?:[01]?\d|2[0-3])",           # D-HH
    r"\d+-(?:[01]?\d|2[0-3]):[0-5]?\d",  # D-HH:MM
    r"\d+-(?:[01]?\d|2[0-3]):[0-5]?\d:[0-5]?\d",  # D-HH:MM:SS
]


_TIME_RE = re.compile("|".join(f"(?:{form})" for form in _TIME_FORMS))


def slurm_time() -> Check:
    """A Slurm time limit in any form sbatch accepts."""
    def check(value: Any) -> str | None:
        if _is_int(value) and value >= 0:
            return None
        if isinstance(value, str) and (
                _TIME_RE.fullmatch(value) or value.upper() in ("UNLIMITED", "INFINITE")):
            return None
        return (f"{_shown(value)} is not a Slurm time limit; use minutes, MM:SS, HH:MM:SS, D-HH, "
                "D-HH:MM, D-HH:MM:SS or UNLIMITED (quoted, e.g. \"04:00:00\")")
    return Rule(check, {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": (
        "^(?:" + "|".join(_TIME_FORMS + [anycase("unlimited"), anycase("infinite")]) + ")$")}]})


def time_limit_seconds(value: Any) -> int | None:
    """A Slurm time limit in seconds; None for no limit (0, UNLIMITED) or a value that is
    not a time limit (the schema reports those).

    Without a day, one number is minutes, two are MM:SS, three HH:MM:SS; after `D-`
    they are HH, HH:MM, HH:MM:SS (sbatch(1) --time).
    """
    if _is_int(value):
        return value * 60 if value > 0 else None
    if not isinstance(value, str) or not _TIME_RE.fullmatch(value):
        return None
    days, dash, clock = value.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if dash:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:
        hours, minutes, seconds = {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds or None


# sbatch --signal=[B:]SIG[@sig_time]: sig_time is 0-65535 seconds.
SIGNAL_TIME_MAX = 65535


_SIZE_RE = re.compile(r"\d+[KMGT]?", re.IGNORECASE)


def slurm_memory() -> Check:
    """--mem: megabytes as an integer, or a size such as 500M, 64G (0 = all)."""
    def check(value: Any) -> str | None:
        if (_is_int(value) and value >= 0) or (isinstance(value, str) and _SIZE_RE.fullmatch(value)):
            return None
        return f"{_shown(value)} is not a memory size; use megabytes (e.g. 0 or 16000) or 500M, 64G, 1T"
    return Rule(check, {"anyOf": [{"type": "integer", "minimum": 0},
                                  {"type": "string", "pattern": r"^[0-9]+[KMGTkmgt]?$"}]})


def memlock() -> Check:
    """expect.memlock: 'unlimited' or a size (8M, 64G, 1024K; a bare number is KiB)."""
    def check(value: Any) -> str | None:
        if _is_int(value) and value >= 0:
            return None
        if isinstance(value, str) and (value.lower() == "unlimited" or _SIZE_RE.fullmatch(value)):
            return None
        return f"{_shown(value)} is not a memlock limit; use unlimited or a size such as 1024K, 8M, 64G"
    return Rule(check, {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": (
        r"^(?:[0-9]+[KMGTkmgt]?|" + anycase("unlimited") + ")$")}]})


XID_WINDOW_MAX_S = 7 * 86400   # how far back the probe reads the journal


_DURATION_RE = re.compile(r"(\d+)([smhd]?)")


_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_window() -> Check:
    """expect.xid_window: seconds, or a number with s/m/h/d (30m, 24h, 7d), at most 7 days."""
    def check(value: Any) -> str | None:
        match = _DURATION_RE.fullmatch(value) if isinstance(value, str) else None
        if _is_int(value) and value > 0:
            seconds = value
        elif match and int(match.group(1)) > 0:
            seconds = int(match.group(1)) * _DURATION_UNITS[match.group(2)]
        else:
            return f"{_shown(value)} is not a time window; use seconds or a duration such as 30m, 24h, 7d"
        if seconds > XID_WINDOW_MAX_S:
            return f"{_shown(value)} is longer than 7d, as far back as the probe reads the kernel log"
        return None
    return Rule(check, {"anyOf": [{"type": "integer", "minimum": 1, "maximum": XID_WINDOW_MAX_S},
                                  {"type": "string", "pattern": "^[0-9]+[smhd]?$"}]})


def checkpoint_every() -> Check:
    """resilience.checkpoint_every: auto, a number of steps, or a duration (90s, 30m, 2h, 1d)."""
    from cluster_kit.trainer.checkpoint.interval import parse_every

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return f"{_shown(value)} is not auto, a number of steps (500) or a duration (90s, 30m, 2h)"
        try:
            parse_every(value)
        except ValueError as exc:
            return str(exc).split(": ", 1)[-1]
        return None
    return Rule(check, {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": (
        "^\\s*([aA][uU][tT][oO]|[0-9]*[1-9][0-9]*|[0-9]+(\\.[0-9]+)?\\s*[sSmMhHdD])\\s*$")}]})


def exclusive() -> Check:
    """--exclusive: true/false or user | mcs | topo."""
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or value in ("user", "mcs", "topo"):
            return None
        return f"{_shown(value)} is not valid; use true, false, user, mcs or topo"
    return Rule(check, {"anyOf": [{"type": "boolean"}, {"enum": ["user", "mcs", "topo"]}]})


def dotted_version() -> Check:
    """A dotted version such as "535.104.05"; quoted, so trailing zeros survive."""
    def check(value: Any) -> str | None:
        if isinstance(value, float):
            return (f"{quoted_value(value)} was read as a number, which loses trailing zeros "
                    "(535.40 becomes 535.4); quote the version, e.g. \"535.104.05\"")
        if _is_int(value) or (isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)*", value)):
            return None
        return f"{_shown(value)} is not a dotted version; use e.g. \"535.104.05\""
    return Rule(check, {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)*$"}]})


# One or more `OP version` clauses, comma-separated (PEP 440); packaging has the last word.
_PEP440_CLAUSE = r"\s*(?:~=|===|==|!=|<=|>=|<|>)\s*[A-Za-z0-9_.*+!-]+\s*"


PEP440_JSON_PATTERN = f"^(?:\\s*|{_PEP440_CLAUSE}(?:,{_PEP440_CLAUSE})*)$"


def pep440_specifier() -> Check:
    """A PEP 440 version specifier such as '>=2.18' or '>=2.18,<3'."""
    def check(value: Any) -> str | None:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        if not isinstance(value, str):
            return f"expected a quoted version specifier such as \">=2.18\", got {type_and_value(value)}"
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            return f"{quoted_value(value)} is not a version specifier; use e.g. \">=2.18\" or \">=2.18,<3\""
        return None
    return Rule(check, {"type": "string", "pattern": PEP440_JSON_PATTERN})


_HCA_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*(?::[1-9]\d*)?")


def ib_hca() -> Check:
    """One HCA, optionally with its port: mlx5_0 or mlx5_0:1."""
    def check(value: Any) -> str | None:
        if isinstance(value, str) and _HCA_RE.fullmatch(value):
            return None
        return f"{_shown(value)} is not an HCA; use a device name with an optional port, e.g. mlx5_0:1"
    return Rule(check, {"type": "string", "pattern": r"^[A-Za-z][A-Za-z0-9_.-]*(?::[1-9][0-9]*)?$"})


def hostlist() -> Check:
    """A Slurm hostlist such as gpu[001-064],login01."""
    def check(value: Any) -> str | None:
        problem = safe_string(HOSTLIST_CHARS, "a hostlist")(value)
        if problem:
            return problem
        try:
            from cluster_kit.hostlist import expand
        except ImportError:  # the hostlist module is optional at validation time
            return None
        try:
            expand(value)
        except ValueError as exc:
            return f"{quoted_value(value)} is not a Slurm hostlist ({exc}); use e.g. gpu[001-064]"
        return None
    return Rule(check, {"type": "string", "pattern": HOSTLIST_CHARS.json_pattern()})


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_name() -> Check:
    """A shell variable name."""
    def check(key: Any) -> str | None:
        if isinstance(key, str) and ENV_NAME_RE.fullmatch(key):
            return None
        return (f"{quoted_value(key)} is not a valid environment variable name; "
                "use letters, digits and _, not starting with a digit")
    return Rule(check, {"pattern": "^" + ENV_NAME_RE.pattern + "$"})


def variable_name() -> Check:
    """A shell variable name as a value (a list item), not as a mapping key."""
    return Rule(env_name(), {"type": "string", "pattern": "^" + ENV_NAME_RE.pattern + "$"})


def env_value() -> Check:
    """An environment value: a string or a number (booleans are ambiguous)."""
    def check(value: Any) -> str | None:
        if isinstance(value, str) or _is_number(value):
            return None
        if isinstance(value, bool):
            word = str(value).lower()
            return f"{word} is a YAML boolean; quote it (\"{word}\") or write 1 / 0"
        return f"expected a string or a number, got {type_and_value(value)}"
    return Rule(check, {"type": ["string", "number"], "pattern": ONE_LINE})


def arg() -> Check:
    """A command-line argument: string or number."""
    return env_value()


# ----------------------------------------------------------------------------
# containers


CONTAINER_RUNTIMES = ("pyxis", "apptainer")


MOUNT_FLAGS = ("ro", "rw")


def container_image() -> Check:
    """A pyxis image (`[USER@][REGISTRY#]IMAGE[:TAG]` or a path) or an Apptainer image."""
    def check(value: Any) -> str | None:
        problem = text()(value)
        if problem:
            return problem
        bad = sorted({ch for ch in value if ch.isspace() or ch == ","})
        if bad:
            shown = ", ".join(repr(ch) for ch in bad)
            return (f"{quoted_value(value)} contains {shown}; an image is one word: a .sqsh/.sif path "
                    "or [USER@][REGISTRY#]IMAGE[:TAG]")
        return None
    return Rule(check, {"type": "string", "pattern": r"^[^\s,]+$"})


def absolute_path() -> Check:
    """A path inside the container: absolute, no comma (pyxis separates lists with commas)."""
    def check(value: Any) -> str | None:
        problem = text()(value)
        if problem:
            return problem
        if not value.startswith("/"):
            return f"{quoted_value(value)} is not an absolute path; write it from / (e.g. /workspace)"
        if "," in value or any(ch.isspace() for ch in value):
            return f"{quoted_value(value)} contains a comma or a space, which srun's container flags cannot carry"
        return None
    return Rule(check, {"type": "string", "pattern": r"^/[^\s,]*$"})


def container_mount() -> Check:
    """`SRC:DST[:ro|rw]` with absolute paths."""
    def check(value: Any) -> str | None:
        problem = text()(value)
        if problem:
            return problem
        parts = value.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in MOUNT_FLAGS):
            return (f"{quoted_value(value)} is not SRC:DST or SRC:DST:ro (e.g. /scratch:/scratch:ro); "
                    f"flags: {', '.join(MOUNT_FLAGS)}")
        for part, role in zip(parts, ("source", "destination")):
            if not part.strip():
                return (f"{quoted_value(value)} has no {role} path; write SRC:DST with both "
                        "paths absolute (e.g. /scratch:/scratch:ro)")
            problem = absolute_path()(part)
            if problem:
                return problem
        return None
    return Rule(check, {"type": "string", "pattern": r"^/[^\s,:]*:/[^\s,:]*(:(ro|rw))?$"})


# ----------------------------------------------------------------------------
# NCCL names


def nccl_name() -> Check:
    """A documented NCCL_* variable not owned by a dedicated key."""
    def check(key: Any) -> str | None:
        if not isinstance(key, str):
            return f"{quoted_value(key)} is not an NCCL variable name"
        if key in NCCL_OWNED:
            return f"{key} is set from {NCCL_OWNED[key]}; set it there instead"
        if key in NCCL_VARIABLES:
            return None
        if not key.startswith("NCCL_"):
            return (f"{quoted_value(key)} is not an NCCL variable (those start with NCCL_); "
                    "put other variables in environment.env")
        close = difflib.get_close_matches(key, sorted(NCCL_VARIABLES), n=1, cutoff=0.8)
        hint = f"; did you mean '{close[0]}'?" if close else \
            "; see the Environment Variables page of the NCCL documentation"
        return f"{quoted_value(key)} is not a known NCCL variable{hint}"
    return Rule(check, {"enum": sorted(NCCL_VARIABLES - set(NCCL_OWNED))})


def nccl_value() -> Check:
    """An NCCL variable's value: string or number."""
    return env_value()


# ----------------------------------------------------------------------------
# sbatch options


def sbatch_value() -> Check:
    """Value of an extra sbatch option: safe text, a number, or true (a bare flag)."""
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or _is_number(value):
            return None
        return safe_string(SBATCH_VALUE_CHARS)(value)
    return Rule(check, {"anyOf": [{"type": ["boolean", "number"]},
                                  {"type": "string", "pattern": SBATCH_VALUE_CHARS.json_pattern()}]})


# ----------------------------------------------------------------------------
# cuda_graphs: {compile: ...} (the rules are build_step's own: cluster_kit/trainer/compile_options.py)


def graphs_shorthand() -> Check:
    """`cuda_graphs: true | false`, the shorthand of its mapping."""
    def check(value: Any) -> str | None:
        if isinstance(value, bool):
            return None
        return f"expected true, false or a mapping such as {{compile: true}}, got {type_and_value(value)}"
    return Rule(check, {"type": "boolean"})


def compile_shorthand() -> Check:
    """`compile: true | false | MODE`, the shorthand of its mapping of torch.compile arguments."""
    def check(value: Any) -> str | None:
        if isinstance(value, bool):
            return None
        if isinstance(value, str):
            return compile_options.mode_problem(value)
        return (f"expected true, false, one of {' | '.join(compile_options.MODES)} or a mapping "
                f"(mode, fullgraph, dynamic, options), got {type_and_value(value)}")
    return Rule(check, {"anyOf": [{"type": "boolean"}, {"enum": list(compile_options.MODES)}]})


def compile_mode() -> Check:
    """torch.compile's `mode`, among those without CUDA graphs of their own."""
    def check(value: Any) -> str | None:
        return compile_options.mode_problem(value)
    return Rule(check, {"enum": list(compile_options.MODES)})


def inductor_option_name() -> Check:
    """An Inductor setting's dotted name, not one that records CUDA graphs."""
    def check(key: Any) -> str | None:
        return compile_options.option_name_problem(key)
    return Rule(check, {"pattern": "^" + compile_options.OPTION_NAME.pattern + "$",
                        "not": {"enum": list(compile_options.GRAPHING_OPTIONS)}})


def inductor_option_value() -> Check:
    """An Inductor setting's value: true/false, a number or a string."""
    def check(value: Any) -> str | None:
        if compile_options.option_value_problem(value) is None:
            return None
        return f"expected true, false, a number or a string, got {type_and_value(value)}"
    return Rule(check, {"type": ["boolean", "number", "string"], "pattern": ONE_LINE})
