"""Declarative key specs of cluster profiles and job files, and the checker.

A spec is a tree of four node kinds: `Field` (a scalar with a check and a
default), `ListOf`, `MapOf` (open mappings such as `env`) and `Section` (a
mapping with named keys, optionally open to more keys through `extra`).
`check(data, spec)` walks a loaded file and returns every problem at once as
`(key path, message)` pairs; config.py turns those into `FILE:LINE: message`.

Values that end up on an `#SBATCH` line must match a safe character set for
their kind: `#SBATCH` lines are read by sbatch, not by a shell, so quoting
cannot protect them. Values that end up in the shell body (env values, setup
lines, args) may hold `$(...)`: the renderer quotes them, and `setup` lines are
shell commands by design. No string anywhere may hold a newline or NUL.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:  # only a type: render.py imports this module and must not load yaml
    from cluster_kit.yamlfile import KeyPath

Check = Callable[[Any], Optional[str]]  # noqa: UP045 - evaluated at runtime on 3.9
Problem = tuple["KeyPath", str]

# Strings hold no newline or NUL anywhere (the walker refuses them for every scalar).
ONE_LINE = r"^[^\n\u0000]*$"


@dataclass(frozen=True)
class Rule:
    """A check together with the JSON Schema that says the same, for editors.

    `json_schema.py` builds `clusterkit schema` from these fragments, so the
    schema an editor sees and the validator are one definition.
    """

    check: Check
    json: dict[str, Any]

    def __call__(self, value: Any) -> str | None:
        return self.check(value)


def _anycase(word: str) -> str:
    """A regex matching `word` in any case ("unlimited" -> "[Uu][Nn]...")."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in word)


# --------------------------------------------------------------------------- spec nodes

@dataclass(frozen=True)
class Field:
    """A scalar key: `check(value)` returns a problem (text after `key: `) or None."""

    check: Check
    default: Any = None


@dataclass(frozen=True)
class ListOf:
    """A list whose items all follow `item`."""

    item: Field
    default: tuple[Any, ...] = ()


@dataclass(frozen=True)
class MapOf:
    """An open mapping: each key passes `key_check`, each value `value`."""

    key_check: Check
    value: Field


@dataclass(frozen=True)
class Section:
    """A mapping with named keys; other keys go to `extra` or are errors.

    `present=False` keeps an absent section absent (`login`: absent = run locally).
    `fill=False` leaves absent keys absent (the job's `nccl` overrides only what it names).
    `extra_hint` is how the valid-keys list describes what `extra` accepts.
    `extra_accepts(key)` says whether a key that is not a field belongs to `extra`.
    """

    fields: dict[str, Spec]
    extra: MapOf | None = None
    extra_hint: str = ""
    present: bool = True
    fill: bool = True
    suggest_from: tuple[str, ...] = ()
    extra_accepts: Callable[[Any], bool] = lambda key: True


Spec = Union[Field, ListOf, MapOf, Section]  # noqa: UP007 - evaluated at runtime on 3.9


# --------------------------------------------------------------------------- scalar checks

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _type_name(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a mapping", type(None): "empty"}
    return names.get(type(value), type(value).__name__)


def _got(value: Any) -> str:
    if isinstance(value, (dict, list)) or value is None:
        return _type_name(value)
    return f"{_type_name(value)} ({_quoted(value)})"


def _shown(value: Any) -> str:
    """A rejected value as messages name it: a string quoted, anything else by its type."""
    return _quoted(value) if isinstance(value, str) else _got(value)


def _quoted(value: Any) -> str:
    """`repr(value)`, cut after 60 characters: a value of a megabyte stays a one-line message."""
    text = repr(value)
    if len(text) <= 80:
        return text
    return f"{text[:60]}... ({len(str(value)):,} characters)"


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    """An integer, optionally within [lo, hi]."""
    def check(value: Any) -> str | None:
        if not _is_int(value):
            return f"expected an integer, got {_got(value)}"
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
    """GPUs per node: a count, or `type:count` as sbatch accepts (h100:8)."""
    def check(value: Any) -> str | None:
        if _is_int(value) and value >= 1:
            return None
        if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_.-]+:[1-9]\d*", value):
            return None
        return f"{_shown(value)} is not a GPU count; use a number such as 8, or type:count such as h100:8"
    return Rule(check, {"anyOf": [{"type": "integer", "minimum": 1},
                                  {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+:[1-9][0-9]*$"}]})


def gpu_count(value: Any) -> int:
    """8 or "h100:8" -> 8 (sbatch accepts a type prefix on --gpus-per-node)."""
    return int(str(value).rsplit(":", 1)[-1])


def positive_number() -> Check:
    """A measure such as a rate or a timeout: a number > 0."""
    def check(value: Any) -> str | None:
        if not _is_number(value):
            return f"expected a number, got {_got(value)}"
        if value <= 0:
            return f"{value} must be greater than 0"
        return None
    return Rule(check, {"type": "number", "exclusiveMinimum": 0})


def boolean() -> Check:
    """true or false."""
    def check(value: Any) -> str | None:
        return None if isinstance(value, bool) else f"expected true or false, got {_got(value)}"
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
                      {"type": "string", "pattern": "^(?:" + "|".join(_anycase(c) for c in choices) + ")$"}]}


def text() -> Check:
    """Any string (newline and NUL are refused for every string by the walker)."""
    def check(value: Any) -> str | None:
        if isinstance(value, str) and value.strip():
            return None
        return "expected a non-empty string" if isinstance(value, str) \
            else f"expected a string, got {_got(value)}"
    return Rule(check, {"type": "string", "pattern": r"^[^\n\u0000]*\S[^\n\u0000]*$"})


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
        return f"{_quoted(value)} contains {shown}, which {what} must not carry; use {self.allowed}"

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
        "^(?:" + "|".join(_TIME_FORMS + [_anycase("unlimited"), _anycase("infinite")]) + ")$")}]})


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
        r"^(?:[0-9]+[KMGTkmgt]?|" + _anycase("unlimited") + ")$")}]})


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


def exclusive() -> Check:
    """--exclusive: true/false or user | mcs | topo."""
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or value in ("user", "mcs", "topo"):
            return None
        return f"{_quoted(value)} is not valid; use true, false, user, mcs or topo"
    return Rule(check, {"anyOf": [{"type": "boolean"}, {"enum": ["user", "mcs", "topo"]}]})


def dotted_version() -> Check:
    """A dotted version such as "535.104.05"; quoted, so trailing zeros survive."""
    def check(value: Any) -> str | None:
        if isinstance(value, float):
            return (f"{_quoted(value)} was read as a number, which loses trailing zeros "
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
            return f"expected a quoted version specifier such as \">=2.18\", got {_got(value)}"
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            return f"{_quoted(value)} is not a version specifier; use e.g. \">=2.18\" or \">=2.18,<3\""
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
        problem = safe_string(HOST_CHARS, "a hostlist")(value)
        if problem:
            return problem
        try:
            from cluster_kit.hostlist import expand
        except ImportError:  # the hostlist module is optional at validation time
            return None
        try:
            expand(value)
        except ValueError as exc:
            return f"{_quoted(value)} is not a Slurm hostlist ({exc}); use e.g. gpu[001-064]"
        return None
    return Rule(check, {"type": "string", "pattern": r"^[A-Za-z0-9_.,\[\]-]+$"})


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_name() -> Check:
    """A shell variable name."""
    def check(key: Any) -> str | None:
        if isinstance(key, str) and ENV_NAME_RE.fullmatch(key):
            return None
        return (f"{_quoted(key)} is not a valid environment variable name; "
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
        return f"expected a string or a number, got {_got(value)}"
    return Rule(check, {"type": ["string", "number"], "pattern": ONE_LINE})


def arg() -> Check:
    """A command-line argument: string or number."""
    return env_value()


# --------------------------------------------------------------------------- containers

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
            return (f"{_quoted(value)} contains {shown}; an image is one word: a .sqsh/.sif path "
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
            return f"{_quoted(value)} is not an absolute path; write it from / (e.g. /workspace)"
        if "," in value or any(ch.isspace() for ch in value):
            return f"{_quoted(value)} contains a comma or a space, which srun's container flags cannot carry"
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
            return (f"{_quoted(value)} is not SRC:DST or SRC:DST:ro (e.g. /scratch:/scratch:ro); "
                    f"flags: {', '.join(MOUNT_FLAGS)}")
        for part in parts[:2]:
            problem = absolute_path()(part)
            if problem:
                return problem
        return None
    return Rule(check, {"type": "string", "pattern": r"^/[^\s,:]*:/[^\s,:]*(:(ro|rw))?$"})


# --------------------------------------------------------------------------- NCCL names

def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# The NCCL_* variables of NCCL's "Environment Variables" documentation
# (2.4 through 2.2x), including renamed and deprecated ones that still appear there.
NCCL_VARIABLES = _words("""
NCCL_ALGO NCCL_ALLOC_P2P_NET_LL_BUFFERS NCCL_BUFFSIZE NCCL_CHECK_POINTERS
NCCL_CHECKS_DISABLE NCCL_COLLNET_ENABLE NCCL_COLLNET_NODE_THRESHOLD NCCL_COMM_BLOCKING
NCCL_COMM_ID NCCL_COMM_SPLIT_SHARE_RESOURCES NCCL_CONF_FILE NCCL_CREATE_THREAD_CONTEXT
NCCL_CROSS_NIC NCCL_CTA_POLICY NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE NCCL_DEBUG
NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS NCCL_DEBUG_TIMESTAMP_FORMAT NCCL_DEBUG_TIMESTAMP_LEVELS
NCCL_DMABUF_ENABLE NCCL_GDRCOPY_ENABLE NCCL_GDRCOPY_FLUSH_ENABLE NCCL_GRAPH_MIXING_SUPPORT
NCCL_GRAPH_REGISTER NCCL_HOSTID NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_ADDR_FAMILY
NCCL_IB_ADDR_RANGE NCCL_IB_AR_THRESHOLD NCCL_IB_CUDA_SUPPORT NCCL_IB_DATA_DIRECT
NCCL_IB_DISABLE NCCL_IB_ECE_ENABLE NCCL_IB_FIFO_TC NCCL_IB_GDR_LEVEL NCCL_IB_GID_INDEX
NCCL_IB_HCA NCCL_IB_MERGE_NICS NCCL_IB_MERGE_VFS NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_PKEY
NCCL_IB_QPS_PER_CONNECTION NCCL_IB_RETRY_CNT NCCL_IB_RETURN_ASYNC_EVENTS
NCCL_IB_ROCE_VERSION_NUM NCCL_IB_ROUTABLE_FLID_GID_INDEX NCCL_IB_SL NCCL_IB_SPLIT_DATA_ON_QPS
NCCL_IB_TC NCCL_IB_TIMEOUT NCCL_IB_USE_INLINE NCCL_IGNORE_CPU_AFFINITY
NCCL_IGNORE_DISABLED_P2P NCCL_LAUNCH_MODE NCCL_LAUNCH_ORDER_IMPLICIT
NCCL_LEGACY_CUDA_REGISTER NCCL_LL_THRESHOLD NCCL_LOCAL_REGISTER NCCL_MAX_CTAS
NCCL_MAX_NCHANNELS NCCL_MAX_NRINGS NCCL_MEM_SYNC_DOMAIN NCCL_MIN_CTAS NCCL_MIN_NCHANNELS
NCCL_MIN_NRINGS NCCL_MNNVL_CLIQUE_ID NCCL_MNNVL_ENABLE NCCL_MNNVL_UUID
NCCL_NCHANNELS_PER_NET_PEER NCCL_NET NCCL_NET_DISABLE_INTRA NCCL_NET_FORCE_FLUSH
NCCL_NET_GDR_C2C NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_PLUGIN
NCCL_NET_SHARED_BUFFERS NCCL_NET_SHARED_COMMS NCCL_NSOCKS_PERTHREAD NCCL_NTHREADS
NCCL_NVB_DISABLE NCCL_NVLS_ENABLE NCCL_NVLS_NCHANNELS NCCL_NVLSTREE_MAX_CHUNKSIZE
NCCL_OOB_NET_ENABLE NCCL_OOB_NET_IFNAME NCCL_P2P_DIRECT_DISABLE NCCL_P2P_DISABLE
NCCL_P2P_LEVEL NCCL_P2P_LL_THRESHOLD NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE
NCCL_P2P_PCI_CHUNKSIZE NCCL_P2P_PXN_LEVEL NCCL_P2P_USE_CUDA_MEMCPY NCCL_PROFILER_PLUGIN
NCCL_PROGRESS_APPENDOP_FREQ NCCL_PROTO NCCL_PXN_DISABLE NCCL_RAS_ADDR NCCL_RAS_ENABLE
NCCL_RAS_TIMEOUT_FACTOR NCCL_RINGS NCCL_RUNTIME_CONNECT NCCL_SET_STACK_SIZE
NCCL_SET_THREAD_NAME NCCL_SHM_DISABLE NCCL_SHM_LOCALITY NCCL_SHM_MEMCPY_MODE
NCCL_SHM_USE_CUDA_MEMCPY NCCL_SINGLE_RING_THRESHOLD NCCL_SOCKET_FAMILY NCCL_SOCKET_IFNAME
NCCL_SOCKET_NTHREADS NCCL_SOCKET_POLL_TIMEOUT_MSEC NCCL_SOCKET_RETRY_CNT
NCCL_SOCKET_RETRY_SLEEP_MSEC NCCL_TOPO_DUMP_FILE NCCL_TOPO_FILE NCCL_TREE_THRESHOLD
NCCL_TUNER_PLUGIN NCCL_UID_STAGGER_RATE NCCL_UID_STAGGER_THRESHOLD NCCL_WORK_FIFO_DEPTH
""")

# Variables the profile sets through a dedicated key; a second spelling would conflict.
NCCL_OWNED = {
    "NCCL_IB_HCA": "network.ib_hca",
    "NCCL_IB_GID_INDEX": "network.gid_index",
    "NCCL_IB_TIMEOUT": "network.ib_timeout",
    "NCCL_SOCKET_IFNAME": "network.socket_ifname",
    "NCCL_DEBUG": "the job's nccl.debug",
}


def nccl_name() -> Check:
    """A documented NCCL_* variable not owned by a dedicated key."""
    def check(key: Any) -> str | None:
        if not isinstance(key, str):
            return f"{_quoted(key)} is not an NCCL variable name"
        if key in NCCL_OWNED:
            return f"{key} is set from {NCCL_OWNED[key]}; set it there instead"
        if key in NCCL_VARIABLES:
            return None
        if not key.startswith("NCCL_"):
            return (f"{_quoted(key)} is not an NCCL variable (those start with NCCL_); "
                    "put other variables in environment.env")
        close = difflib.get_close_matches(key, sorted(NCCL_VARIABLES), n=1, cutoff=0.8)
        hint = f"; did you mean '{close[0]}'?" if close else \
            "; see the Environment Variables page of the NCCL documentation"
        return f"{_quoted(key)} is not a known NCCL variable{hint}"
    return Rule(check, {"enum": sorted(NCCL_VARIABLES - set(NCCL_OWNED))})


def nccl_value() -> Check:
    """An NCCL variable's value: string or number."""
    return env_value()


# --------------------------------------------------------------------------- sbatch options

# Long options of sbatch(1), Slurm 20.11 to 24.x.
SBATCH_OPTIONS = _words("""
account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment
constraint container container-id contiguous core-spec cores-per-socket cpu-freq
cpus-per-gpu cpus-per-task deadline delay-boot dependency distribution error exclude
exclusive export export-file extra extra-node-info get-user-env gid gpu-bind gpu-freq gpus
gpus-per-node gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs input
job-name kill-on-invalid-dep license licenses mail-type mail-user mcs-label mem mem-bind
mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes
ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket oom-kill-step
open-mode output overcommit oversubscribe parsable partition power prefer priority profile
propagate qos quiet reboot requeue reservation resv-ports signal sockets-per-node
spread-job switches test-only thread-spec threads-per-core time time-min tmp tres-bind
tres-per-task uid usage use-min-nodes verbose version wait wait-all-nodes wckey wrap
""")

# Options clusterkit writes itself, or that only make sense on sbatch's command line.
SBATCH_MANAGED = {
    "job-name": "the job's `name`",
    "nodes": "the job's `nodes`",
    "ntasks": "`ntasks_per_node` and the launcher",
    "output": "the job's `output`",
    "chdir": "the job's `workdir`",
    "wrap": "the rendered script",
    "parsable": "clusterkit itself",
    "test-only": "`clusterkit submit --test-only`",
    "wait": "`clusterkit submit --wait`",
    "help": "nothing (it is not a job option)",
    "usage": "nothing (it is not a job option)",
    "version": "nothing (it is not a job option)",
}


def sbatch_option(key: str) -> str:
    """The sbatch spelling of a YAML key: mail_type -> mail-type."""
    return key.replace("_", "-")


def sbatch_option_name() -> Check:
    """A real sbatch long option that the user may set."""
    def check(key: Any) -> str | None:
        if not isinstance(key, str):
            return f"{_quoted(key)} is not an sbatch option name"
        if key.startswith("-"):
            return f"write {_quoted(key)} without the leading dashes: {key.lstrip('-')}"
        option = sbatch_option(key)
        if option.replace("-", "_") in SLURM_NAMED:
            return f"{_quoted(key)} has its own key; write it as slurm.{option.replace('-', '_')}"
        if option in SBATCH_MANAGED:
            return f"--{option} is set from {SBATCH_MANAGED[option]}; remove it here"
        if option in SBATCH_OPTIONS:
            return None
        close = difflib.get_close_matches(option, sorted(SBATCH_OPTIONS), n=1, cutoff=0.75)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"{_quoted(key)} is not an sbatch option{hint}"
    return Rule(check, {"enum": allowed_sbatch_keys()})


def allowed_sbatch_keys() -> list[str]:
    """Every key `sbatch_option_name` accepts: options not set elsewhere, _ and - spellings."""
    keys = []
    for option in sorted(SBATCH_OPTIONS):
        underscored = option.replace("-", "_")
        if underscored in SLURM_NAMED or option in SBATCH_MANAGED:
            continue
        keys += [underscored] + ([option] if option != underscored else [])
    return keys


def sbatch_value() -> Check:
    """Value of an extra sbatch option: safe text, a number, or true (a bare flag)."""
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or _is_number(value):
            return None
        return safe_string(SBATCH_VALUE_CHARS)(value)
    return Rule(check, {"anyOf": [{"type": ["boolean", "number"]},
                                  {"type": "string", "pattern": SBATCH_VALUE_CHARS.json_pattern()}]})


# --------------------------------------------------------------------------- the specs

def _str(default: Any = None) -> Field:
    return Field(text(), default)


SSH_FIELDS: dict[str, Spec] = {
    "user": Field(safe_string(NAME_CHARS, "a user name")),
    # No default: unset means ssh_config's Port, then 22, as with OpenSSH.
    "port": Field(integer(1, 65535)),
    "identity_file": _str(),
    "proxy_jump": Field(safe_string(HOST_CHARS, "a ProxyJump")),
    "config_file": _str(),  # the ssh_config to resolve hosts through; unset: ~/.ssh/config
}

# How one host is trusted and waited for: the login host's section has them too
# (a login host's key need not be in ~/.ssh/known_hosts).
HOST_KEY_AND_TIMEOUT_FIELDS: dict[str, Spec] = {
    "known_hosts": _str(),  # unset: ssh_config's UserKnownHostsFile, then OpenSSH's files
    "host_key_policy": Field(one_of("strict", "accept-new"), "strict"),
    "connect_timeout": Field(positive_number(), 10),
    "command_timeout": Field(positive_number(), 60),
}

LOGIN = Section({"host": Field(safe_string(HOST_CHARS, "a host name")), **SSH_FIELDS,
                 **HOST_KEY_AND_TIMEOUT_FIELDS}, present=False)

SSH = Section({
    **SSH_FIELDS,
    **HOST_KEY_AND_TIMEOUT_FIELDS,
    "fanout": Field(positive_int(), 64),
})

SLURM_NAMED: dict[str, Spec] = {
    "partition": Field(sbatch_text(NAME_CHARS)),
    "account": Field(sbatch_text(NAME_CHARS)),
    "qos": Field(sbatch_text(NAME_CHARS)),
    "constraint": Field(sbatch_text(CONSTRAINT_CHARS)),
    "gpus_per_node": Field(gpus()),
    "ntasks_per_node": Field(positive_int()),
    "cpus_per_task": Field(positive_int()),
    "mem": Field(slurm_memory()),
    "time": Field(slurm_time()),
    "exclusive": Field(exclusive()),
    "nodelist": Field(hostlist()),  # nodes the job must get (sbatch --nodelist)
    "exclude": Field(hostlist()),   # nodes it must not get; submit adds failing ones
}

SBATCH_EXTRA = MapOf(sbatch_option_name(), Field(sbatch_value()))

SLURM = Section(
    {**SLURM_NAMED, "sbatch": SBATCH_EXTRA},
    extra=SBATCH_EXTRA,
    extra_hint="or any sbatch long option (e.g. mail_type)",
    suggest_from=tuple(sorted(o.replace("-", "_") for o in SBATCH_OPTIONS)),
    extra_accepts=lambda key: isinstance(key, str)
    and sbatch_option(key.lstrip("-")) in SBATCH_OPTIONS,
)

NETWORK_FIELDS: dict[str, Spec] = {
    "fabric": Field(one_of("infiniband", "roce", "ethernet")),
    "ib_hca": ListOf(Field(ib_hca())),
    "gid_index": Field(integer(lo=0)),
    "ib_timeout": Field(integer(0, 31)),
    "socket_ifname": Field(safe_string(IFNAME_CHARS, "NCCL_SOCKET_IFNAME")),
    "nccl_env": MapOf(nccl_name(), Field(nccl_value())),
}

ENVIRONMENT = Section({
    "modules": ListOf(Field(text())),
    "setup": ListOf(Field(text())),
    "python": _str("python3"),
    "env": MapOf(env_name(), Field(env_value())),
})

EXPECT = Section({
    "gpus_per_node": Field(positive_int()),
    "gpu_model": _str(),
    "min_driver": Field(dotted_version()),
    "nccl": Field(pep440_specifier()),
    "ib_rate_gbps": Field(positive_number()),
    "peermem": Field(boolean()),
    "memlock": Field(memlock()),
    "allreduce_busbw_gbps": Field(positive_number()),
    "xid_window": Field(duration_window()),
    # Counter names as the kernel's /sys/class/infiniband/<hca>/ports/<p>/counters/ files;
    # unset ones keep the defaults of cluster_kit.checks.rdma_errors.
    "ib_error_thresholds": Section({name: Field(integer(lo=0)) for name in (
        "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
        "local_link_integrity_errors", "excessive_buffer_overrun_errors",
        "port_rcv_remote_physical_errors")}, fill=False),
})

PROFILE = Section({
    "name": Field(safe_string(NAME_CHARS, "a profile name")),
    "extends": _str(),
    "login": LOGIN,
    "ssh": SSH,
    "nodes": Field(hostlist()),
    "slurm": SLURM,
    "network": Section(NETWORK_FIELDS),
    "environment": ENVIRONMENT,
    "expect": EXPECT,
})

CONTAINER = Section({
    "image": Field(container_image()),
    "runtime": Field(one_of(*CONTAINER_RUNTIMES), "pyxis"),
    "mounts": ListOf(Field(container_mount())),
    "workdir": Field(absolute_path()),
    "writable": Field(boolean(), False),
    "mount_home": Field(boolean(), False),
    "env": ListOf(Field(variable_name())),
}, present=False)
CONTAINER_REQUIRED = ("image",)

JOB_NCCL = Section({**NETWORK_FIELDS, "debug": Field(one_of("VERSION", "WARN", "INFO", "TRACE", ignore_case=True))},
                   fill=False)

JOB = Section({
    "name": Field(sbatch_text(NAME_CHARS)),
    "profile": _str(),
    "nodes": Field(positive_int(), 1),
    "gpus_per_node": Field(gpus()),
    "time": Field(slurm_time()),
    "launcher": Field(one_of("srun", "torchrun"), "srun"),
    "script": _str(),
    "args": ListOf(Field(arg())),
    "workdir": Field(sbatch_text(PATH_CHARS)),
    "output": Field(sbatch_text(PATH_CHARS)),
    "env": MapOf(env_name(), Field(env_value())),
    "nccl": JOB_NCCL,
    "preflight": Field(boolean(), True),
    "cuda_graphs": Field(boolean(), False),
    "template": _str("ddp"),
    "master_port": Field(integer(1024, 65535)),
    "slurm": SLURM,
    "container": CONTAINER,
})

JOB_REQUIRED = ("profile", "script")


# --------------------------------------------------------------------------- the walker

def dotted(path: KeyPath) -> str:
    """`network.ib_hca[1]` for ("network", "ib_hca", 1)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def check(data: dict[str, Any], spec: Section) -> list[Problem]:
    """Every problem in `data` against `spec`, in document order of the keys."""
    problems: list[Problem] = []
    _check_section(data, spec, (), problems)
    return problems


def _report(problems: list[Problem], path: KeyPath, message: str) -> None:
    problems.append((path, f"{dotted(path)}: {message}" if path else message))


def _check_node(value: Any, spec: Spec, path: KeyPath, problems: list[Problem]) -> None:
    if isinstance(spec, Section):
        if isinstance(value, dict):
            _check_section(value, spec, path, problems)
        else:
            _report(problems, path, f"expected a mapping of keys, got {_got(value)}")
    elif isinstance(spec, MapOf):
        _check_map(value, spec, path, problems)
    elif isinstance(spec, ListOf):
        _check_list(value, spec, path, problems)
    else:
        _check_scalar(value, spec, path, problems)


def _check_scalar(value: Any, spec: Field, path: KeyPath, problems: list[Problem]) -> None:
    if isinstance(value, str) and ("\n" in value or "\0" in value):
        kind = "a newline" if "\n" in value else "a NUL character"
        _report(problems, path, f"contains {kind}; values must be a single line")
        return
    problem = spec.check(value)
    if problem:
        _report(problems, path, problem)


def _check_list(value: Any, spec: ListOf, path: KeyPath, problems: list[Problem]) -> None:
    if not isinstance(value, list):
        _report(problems, path, f"expected a list, got {_got(value)}")
        return
    for index, item in enumerate(value):
        _check_scalar(item, spec.item, path + (index,), problems)


def _check_map(value: Any, spec: MapOf, path: KeyPath, problems: list[Problem]) -> None:
    if not isinstance(value, dict):
        _report(problems, path, f"expected a mapping, got {_got(value)}")
        return
    for key, item in value.items():
        problem = spec.key_check(key)
        if problem:
            _report(problems, path + (key,), problem)
        else:
            _check_scalar(item, spec.value, path + (key,), problems)


def _check_section(data: dict[str, Any], spec: Section, path: KeyPath,
                   problems: list[Problem]) -> None:
    for key, value in data.items():
        if key in spec.fields:
            _check_node(value, spec.fields[key], path + (key,), problems)
        elif spec.extra is not None and spec.extra_accepts(key):
            _check_map({key: value}, spec.extra, path, problems)
        else:
            problems.append((path + (key,), unknown_key(key, spec, path)))


def unknown_key(key: Any, spec: Section, path: KeyPath) -> str:
    """`unknown key 'x' in s; did you mean 'y'? valid keys: ...` for a section."""
    valid = list(spec.fields)
    candidates = list(dict.fromkeys(valid + list(spec.suggest_from)))
    close = difflib.get_close_matches(str(key), candidates, n=1, cutoff=0.6)
    where = f" in {dotted(path)}" if path else ""
    hint = f"; did you mean '{close[0]}'? " if close else "; "
    listed = ", ".join(valid) + (f", {spec.extra_hint}" if spec.extra_hint else "")
    return f"unknown key '{key}'{where}{hint}valid keys: {listed}"


# --------------------------------------------------------------------------- defaults

def with_defaults(data: dict[str, Any], spec: Section) -> dict[str, Any]:
    """A copy of `data` with every absent key of `spec` filled with its default."""
    if not spec.fill:
        return dict(data)
    out: dict[str, Any] = {}
    for key, sub in spec.fields.items():
        if key in data:
            out[key] = _default_inside(data[key], sub)
        elif isinstance(sub, Section):
            out[key] = with_defaults({}, sub) if sub.present else None
        elif isinstance(sub, ListOf):
            out[key] = list(sub.default)
        elif isinstance(sub, MapOf):
            out[key] = {}
        else:
            out[key] = sub.default
    for key, value in data.items():
        out.setdefault(key, value)
    return out


def _default_inside(value: Any, spec: Spec) -> Any:
    if isinstance(spec, Section) and isinstance(value, dict):
        return with_defaults(value, spec)
    return value


# --------------------------------------------------------------------------- descriptions

# What each key means, for `clusterkit schema` (editors show these on hover).
# Profile keys by dotted path; job keys as "job.<path>". `login.*` falls back to
# `ssh.*`, the job's `nccl.*` to `network.*` and its `slurm.*` to the profile's.
DESCRIPTIONS: dict[str, str] = {
    "": "A clusterkit cluster profile: how to reach the cluster and what its nodes must look like.",
    "name": "Profile name; defaults to the file name.",
    "extends": "A parent profile (name on the search path or path to a .yaml), deep-merged; the child wins.",
    "login": "Where sbatch/squeue run, over SSH; absent = run them locally.",
    "login.host": "The login host, resolved through ssh_config as OpenSSH does.",
    "ssh": "How preflight and audit reach the compute nodes.",
    "ssh.user": "User name; unset: ssh_config's User, then the local user.",
    "ssh.port": "SSH port; unset: ssh_config's Port, then 22.",
    "ssh.identity_file": "Private key file, tried before ssh_config's IdentityFile and ssh-agent.",
    "ssh.proxy_jump": "Jump host(s) as OpenSSH ProxyJump: [user@]host[:port], comma-separated.",
    "ssh.config_file": "The ssh_config host names resolve through; unset: ~/.ssh/config.",
    "ssh.known_hosts": "known_hosts file; unset: ssh_config's UserKnownHostsFile, then OpenSSH's files.",
    "ssh.host_key_policy": "strict: unknown host keys are refused; accept-new: recorded on first use. Never silently trusted.",
    "ssh.connect_timeout": "Seconds to connect and authenticate (a lower ssh_config ConnectTimeout wins).",
    "ssh.command_timeout": "Seconds the probe may run per node.",
    "ssh.fanout": "Concurrent SSH connections.",
    "nodes": "Slurm hostlist of the compute nodes, e.g. gpu[001-064]; absent: `sinfo -p <partition>`.",
    "slurm": "sbatch options of every job; any other sbatch long option may be given too (without --).",
    "slurm.partition": "--partition.",
    "slurm.nodelist": "--nodelist: nodes the job must get (Slurm hostlist).",
    "slurm.exclude": "--exclude: nodes the job must not get; submit adds failing ones.",
    "slurm.account": "--account.",
    "slurm.qos": "--qos.",
    "slurm.constraint": "--constraint (node features joined with & | , ...).",
    "slurm.gpus_per_node": "--gpus-per-node: a count, or type:count such as h100:8.",
    "slurm.ntasks_per_node": "--ntasks-per-node; default: gpus_per_node with srun, 1 with torchrun.",
    "slurm.cpus_per_task": "--cpus-per-task.",
    "slurm.mem": "--mem: megabytes, or a size such as 500M, 64G (0 = all of the node's memory).",
    "slurm.time": "--time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED (quote it).",
    "slurm.exclusive": "--exclusive: true, false, user, mcs or topo.",
    "slurm.sbatch": "Any other sbatch long option, without the leading --; true = a bare flag.",
    "network": "The NCCL network settings the job script exports.",
    "network.fabric": "infiniband | roce | ethernet (ethernet sets NCCL_IB_DISABLE=1 and skips RDMA checks).",
    "network.ib_hca": "HCA ports NCCL uses, e.g. [mlx5_0:1, mlx5_3:1] -> NCCL_IB_HCA==mlx5_0:1,mlx5_3:1 (exact match).",
    "network.gid_index": "NCCL_IB_GID_INDEX; on RoCE the RoCE v2 GID holding the IPv4-mapped address.",
    "network.ib_timeout": "NCCL_IB_TIMEOUT (0-31).",
    "network.socket_ifname": "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: prefixes, ^ to exclude, = for exact names.",
    "network.nccl_env": "More NCCL_* variables; names are checked against NCCL's documented list.",
    "environment": "What the job script sets up before training.",
    "environment.modules": "`module load` lines.",
    "environment.setup": "Shell lines run before training, e.g. activating a virtual environment.",
    "environment.python": "Interpreter with torch on the nodes.",
    "environment.env": "Environment variables exported to the training processes.",
    "expect": "Preflight thresholds: what every node must have.",
    "expect.gpus_per_node": "GPUs nvidia-smi must list (gpu.count).",
    "expect.gpu_model": "Substring of every GPU's name, case-insensitive (gpu.model).",
    "expect.min_driver": "Lowest NVIDIA driver version, quoted (gpu.driver).",
    "expect.nccl": "PEP 440 specifier the loadable libnccl must meet, e.g. \">=2.18\" (nccl.library).",
    "expect.ib_rate_gbps": "Lowest link rate of the listed ports in Gb/s (rdma.link_rate).",
    "expect.peermem": "nvidia_peermem or nv_peer_mem must be loaded (rdma.peermem).",
    "expect.memlock": "Lowest RLIMIT_MEMLOCK: unlimited or a size such as 8M, 64G; a bare number is KiB (sys.memlock).",
    "expect.allreduce_busbw_gbps": "`bench allreduce` fails below this bus bandwidth (GB/s, large messages).",
    "job.container": "Run every srun step of the job inside this image (pyxis/enroot or Apptainer).",
    "job.container.image": "A .sqsh/.sif path on the nodes, or [USER@][REGISTRY#]IMAGE[:TAG] for pyxis.",
    "job.container.runtime": "pyxis (srun --container-image, the default) or apptainer (apptainer exec in each task).",
    "job.container.mounts": "SRC:DST or SRC:DST:ro bind mounts, absolute paths.",
    "job.container.workdir": "The working directory inside the container (absolute).",
    "job.container.writable": "A writable container filesystem (pyxis --container-writable, Apptainer --writable-tmpfs).",
    "job.container.mount_home": "Mount the user's home directory into the container (default false).",
    "job.container.env": "More variables whose host value must win over the image's (every clusterkit export already does).",
    "expect.xid_window": "gpu.xid looks at Xid events this recent: seconds or 30m, 24h, 7d (default 24h, at most 7d).",
    "expect.ib_error_thresholds": "rdma.port_errors: per-port counter values that fail a port (defaults in the README).",
    **{f"expect.ib_error_thresholds.{name}": f"Fail a port whose {name} counter reaches this (rdma.port_errors)."
       for name in ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                    "local_link_integrity_errors", "excessive_buffer_overrun_errors",
                    "port_rcv_remote_physical_errors")},
    "job": "A clusterkit job file: what to run, on which profile.",
    "job.name": "Job name (--job-name); defaults to the file name.",
    "job.profile": "Cluster profile: a name on the search path, or a path to a .yaml.",
    "job.nodes": "Number of nodes.",
    "job.gpus_per_node": "GPUs per node; overrides the profile's slurm.gpus_per_node.",
    "job.time": "Time limit; overrides the profile's slurm.time.",
    "job.launcher": "srun (one task per GPU) | torchrun (one task per node).",
    "job.script": "The training script, relative to workdir (else to this file's folder).",
    "job.args": "The script's arguments.",
    "job.workdir": "Working directory of the job (--chdir).",
    "job.output": "Output file (--output), e.g. logs/%x-%j.out.",
    "job.env": "Environment variables, merged over the profile's environment.env.",
    "job.nccl": "Overrides of the profile's network keys, plus debug (NCCL_DEBUG).",
    "job.nccl.debug": "NCCL_DEBUG: VERSION, WARN, INFO or TRACE.",
    "job.preflight": "Check every allocated node inside the job before training starts.",
    "job.cuda_graphs": "The example trainer captures the DDP step in a CUDA graph.",
    "job.template": "Built-in template name or path to a .j2 file.",
    "job.master_port": "MASTER_PORT; unset: derived from the job id in a fixed high range.",
    "job.slurm": "Per-job sbatch overrides, same rules as the profile's slurm.",
}


def describe(kind: str, path: str) -> str | None:
    """The description of a key path of a profile or job ("job"), with the fallbacks above."""
    if kind == "job":
        head, _, rest = path.partition(".")
        candidates = ["job." + path if path else "job"]
        if head == "nccl" and rest:
            candidates.append("network." + rest)
        elif head == "slurm" and rest:
            candidates.append(path)
    else:
        candidates = [path]
        if path.startswith("login."):
            candidates.append("ssh." + path[len("login."):])
    return next((DESCRIPTIONS[c] for c in candidates if c in DESCRIPTIONS), None)
