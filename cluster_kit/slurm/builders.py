"""Pure builders and parsers for Slurm's commands (no process is started here).

Every backend call has one shape: a `build_*` function returns an argv list,
`slurm_runner` runs it, and a `parse_*` function reads the text Slurm printed.
The parsers are tested on verbatim Slurm 22.05 output in tests/data/slurm/.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

from cluster_kit.slurm.outcome import base_state

OptionValue = Union[str, int, float, bool, None]  # noqa: UP007 (evaluated at run time; Python 3.9)

# Delimiter of the squeue/sinfo formats below; free text (job name, reason) goes last.
FIELD_SEP = "|"

SQUEUE_FIELDS = ("job_id", "state", "reason", "nodes", "elapsed", "time_limit",
                 "num_nodes", "partition", "name")
_SQUEUE_FORMAT = FIELD_SEP.join(["%i", "%T", "%r", "%N", "%M", "%l", "%D", "%P", "%j"])

SACCT_FIELDS = ("JobID", "State", "ExitCode", "Elapsed", "NodeList", "JobName")

SINFO_FIELDS = ("node", "state", "reason")
_SINFO_FORMAT = FIELD_SEP.join(["%N", "%T", "%E"])

NODE_STATES = ("DRAIN", "RESUME", "DOWN", "UNDRAIN")

# An sbatch long option name as job files write it (`mail-type`, no leading --).
SBATCH_OPTION_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")
_JOB_ID = re.compile(r"\d+(?:[_+]\d+)?\Z")


# ---------------------------------------------------------------- job states

PENDING_STATES = frozenset({
    "PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD",
})
RUNNING_STATES = frozenset({
    "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING",
    "STAGE_OUT", "RESIZING",
})
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED",
})


def job_phase(state: str) -> str:
    """`pending`, `running`, `terminal` or `unknown` for a Slurm job state."""
    name = base_state(state)
    if name in PENDING_STATES:
        return "pending"
    if name in RUNNING_STATES:
        return "running"
    if name in TERMINAL_STATES:
        return "terminal"
    return "unknown"


@dataclass(frozen=True)
class ExitCode:
    """Slurm's `EXIT:SIGNAL` pair (`0:0`, `3:0`, `0:15`)."""

    status: int
    signal: int

    def __str__(self) -> str:
        return f"{self.status}:{self.signal}"


def parse_exit_code(text: str) -> ExitCode:
    """`3:0` -> ExitCode(3, 0); ValueError for anything else."""
    match = re.fullmatch(r"\s*(\d+):(\d+)\s*", text)
    if not match:
        raise ValueError(f"not a Slurm exit code (EXIT:SIGNAL): {text!r}")
    return ExitCode(int(match.group(1)), int(match.group(2)))


def job_exit_code(state: str, exit_code: ExitCode | None) -> int:
    """The exit status `submit --wait` reports for a job that ended in `state`.

    COMPLETED is 0. Otherwise the script's own nonzero status, else 128+signal
    as a shell reports a killed process, else 1: a CANCELLED, TIMEOUT,
    NODE_FAIL or OUT_OF_MEMORY job never reads as success.
    """
    name = base_state(state)
    if name == "COMPLETED":
        return 0
    if exit_code is not None and exit_code.status:
        return exit_code.status
    if exit_code is not None and exit_code.signal:
        return min(128 + exit_code.signal, 255)
    return 1


# ---------------------------------------------------------------- sbatch


def build_sbatch_options(options: Mapping[str, OptionValue]) -> list[str]:
    """sbatch long options -> `--name=value` argv items.

    `True` gives a bare flag (`--exclusive`), `False`/`None` leaves the option
    out; underscores in names become dashes. Raises ValueError for a bad name
    or a value with a newline (it would end an `#SBATCH` line early).
    """
    argv: list[str] = []
    for raw_name, value in options.items():
        name = raw_name.lstrip("-").replace("_", "-")
        if not SBATCH_OPTION_NAME.match(name):
            raise ValueError(f"not an sbatch long option name: {raw_name!r}")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(f"--{name}")
            continue
        text = str(value)
        if any(ch in text for ch in "\n\r\0"):
            raise ValueError(f"sbatch option --{name}: the value {text!r} contains a newline")
        argv.append(f"--{name}={text}")
    return argv


def build_sbatch(
    options: Mapping[str, OptionValue] | None = None,
    test_only: bool = False,
    parsable: bool = True,
) -> list[str]:
    """argv of `sbatch`; the script goes on stdin (or use the `wrap` option)."""
    argv = ["sbatch"]
    if parsable:
        argv.append("--parsable")
    if test_only:
        argv.append("--test-only")
    return argv + build_sbatch_options(options or {})


def parse_sbatch(stdout: str) -> str:
    """The job id from sbatch's stdout: `--parsable`'s `jobid[;cluster]`, or
    the plain `Submitted batch job N`."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        plain = re.fullmatch(r"Submitted batch job (\d+)(?: on cluster \S+)?", line)
        if plain:
            return plain.group(1)
        job_id = line.split(";", 1)[0]
        if _JOB_ID.match(job_id):
            return job_id
    raise ValueError(f"sbatch printed no job id: {stdout!r}")


@dataclass(frozen=True)
class TestOnlyResult:
    """What `sbatch --test-only` predicts for an acceptable job."""

    __test__ = False  # not a pytest test class despite the name

    job_id: str
    start: str
    processors: int
    nodes: str
    partition: str
    message: str


_TEST_ONLY = re.compile(
    r"sbatch: Job (?P<job_id>\d+) to start at (?P<start>\S+) using (?P<processors>\d+) "
    r"processors on nodes (?P<nodes>\S+) in partition (?P<partition>\S+)"
)


def parse_sbatch_test_only(stderr: str) -> TestOnlyResult:
    """Read `sbatch --test-only`'s stderr (it prints nothing on stdout).

    Raises ValueError when the line is not there (the request was refused:
    see `slurm_error_message`).
    """
    match = _TEST_ONLY.search(stderr)
    if not match:
        raise ValueError(f"sbatch --test-only printed no start estimate: {stderr!r}")
    return TestOnlyResult(
        job_id=match.group("job_id"),
        start=match.group("start"),
        processors=int(match.group("processors")),
        nodes=match.group("nodes"),
        partition=match.group("partition"),
        message=match.group(0)[len("sbatch: "):],
    )


def slurm_error_message(stderr: str, stdout: str = "") -> str:
    """Slurm's own complaint, one line per message, without `sbatch: error: `."""
    lines = []
    for line in (stderr or stdout).splitlines():
        line = re.sub(r"^\w+: (?:error|fatal): ", "", line.strip())
        if line:
            lines.append(line)
    return "; ".join(lines) or "no message"


# Slurm's refusals that have one usual cause, and what to change.
_FIXES = (
    ("Requested node configuration is not available",
     "ask for no more nodes, GPUs, CPUs or memory per node than its nodes have (sinfo)"),
    ("Invalid partition name", "check slurm.partition against `sinfo -s`"),
    ("Invalid account", "check slurm.account (sacctmgr show assoc user=$USER)"),
    ("Invalid qos", "check slurm.qos (sacctmgr show assoc user=$USER format=qos)"),
    ("time limit", "lower time: below the partition's limit (sinfo -o '%P %l')"),
    ("Invalid generic resource", "check gpus_per_node against the nodes' GRES (sinfo -o '%N %G')"),
    ("Node count specification invalid", "lower nodes to what the partition holds"),
    ("Unable to contact slurm controller", "check that slurmctld is up (scontrol ping)"),
    ("Invalid node name specified", "check the node names against `sinfo -N`"),
    ("Invalid job id specified", "check the job id (squeue --me)"),
)


# How Slurm (20.11-23.x) says that this user may not update nodes (scontrol update).
NODE_UPDATE_DENIED = ("invalid user id", "access/permission denied")
NODE_UPDATE_FIX = ("only root, SlurmUser or an operator (sacctmgr AdminLevel) may drain nodes: "
                   "run --apply as one of them, or run the printed commands with sudo")


def fix_for(message: str, argv: Sequence[str] = ()) -> str | None:
    """What to do about a Slurm error message (of `argv`), where the cause is well known."""
    lowered = message.lower()
    fix = next((fix for needle, fix in _FIXES if needle.lower() in lowered), None)
    updates_nodes = list(argv[:2]) == ["scontrol", "update"]
    if fix is None and updates_nodes and any(words in lowered for words in NODE_UPDATE_DENIED):
        return NODE_UPDATE_FIX
    return fix


# ---------------------------------------------------------------- pending reasons

# Pending reasons (squeue %r) that never clear by themselves: the job waits
# forever unless it is changed or cancelled. Each with what to change.
NEVER_START_FIXES = {
    "PartitionTimeLimit": "lower time below the partition's limit (sinfo -o '%P %l')",
    "BadConstraints": "check slurm.constraint against the nodes' features (sinfo -o '%N %f')",
    "InvalidAccount": "check slurm.account (sacctmgr show assoc user=$USER)",
    "InvalidQOS": "check slurm.qos (sacctmgr show assoc user=$USER format=qos)",
    "DependencyNeverSatisfied": "the job it depends on failed: fix the dependency option",
    "AssocMaxNodesPerJobLimit": "ask for fewer nodes: your association's per-job node limit is lower",
    "QOSMaxNodePerJobLimit": "ask for fewer nodes, or use a QOS with a higher per-job node limit",
    "AssocMaxWallDurationPerJobLimit": "lower time below your association's per-job limit",
    "QOSMaxWallDurationPerJobLimit": "lower time below the QOS's per-job limit, or use another QOS",
}
# Reasons Slurm shows before its scheduler has judged the job: 22.05 shows
# PartitionConfig for a few seconds before PartitionNodeLimit.
UNSETTLED_REASONS = frozenset({"PartitionConfig"})


def never_start_fix(reason: str, job_nodes: int | None, partition_nodes: int | None) -> str | None:
    """The fix when a pending job with `reason` can never start; None when it may.

    PartitionNodeLimit also means "some of the partition's nodes are down or
    drained right now", which clears: it never clears only when the job asks
    more nodes than the partition has (`partition_nodes`, from sinfo).
    """
    if reason == "PartitionNodeLimit":
        if job_nodes is not None and partition_nodes is not None and job_nodes > partition_nodes:
            return (f"ask for at most {partition_nodes} node(s) (nodes: in the job file), "
                    "or use a larger partition (sinfo -s)")
        return None
    return NEVER_START_FIXES.get(reason)


# ---------------------------------------------------------------- squeue


@dataclass(frozen=True)
class SqueueRow:
    """One job line of `squeue` in the format of `build_squeue`."""

    job_id: str
    state: str
    reason: str
    nodes: str
    elapsed: str
    time_limit: str
    num_nodes: str
    partition: str
    name: str


def build_squeue(job_id: str) -> list[str]:
    """argv of squeue for one job: delimited fields, no header, any state."""
    return ["squeue", "--noheader", f"--jobs={check_job_id(job_id)}", "--states=all",
            f"--format={_SQUEUE_FORMAT}"]


def parse_squeue(stdout: str) -> list[SqueueRow]:
    """Rows of `build_squeue`'s output (the job name, last, may hold `|`)."""
    return [SqueueRow(*fields) for fields in _delimited_rows(stdout, SQUEUE_FIELDS, "squeue")]


def _delimited_rows(stdout: str, names: tuple[str, ...], command: str) -> Iterator[list[str]]:
    """The `|`-separated fields of each non-blank line; the last field keeps any
    further `|`. ValueError for a line with too few fields."""
    for line in stdout.splitlines():
        if line.strip():
            fields = line.split(FIELD_SEP, len(names) - 1)
            if len(fields) != len(names):
                raise ValueError(f"unexpected {command} line: {line!r}")
            yield fields


def is_unknown_job(text: str) -> bool:
    """squeue/scontrol/scancel saying the id names no job it knows (scontrol says
    `Job 12_5 not found`, on stdout, for a task its array does not have)."""
    return "Invalid job id specified" in text or re.search(r"^Job \S+ not found$", text, re.MULTILINE) is not None


# ---------------------------------------------------------------- sacct


@dataclass(frozen=True)
class SacctRow:
    """One line of `build_sacct`'s output: the job or one of its steps."""

    job_id: str
    state: str
    exit_code: ExitCode
    elapsed: str
    nodes: str
    name: str

    @property
    def is_step(self) -> bool:
        """`12.batch`, `12.extern`, `12.0` are steps of job 12."""
        return "." in self.job_id


@dataclass(frozen=True)
class AccountingDisabled:
    """sacct cannot answer: the cluster keeps no accounting (no slurmdbd)."""

    message: str


def build_sacct(job_id: str) -> list[str]:
    """argv of sacct for one job and its steps, `|`-separated, no header."""
    return ["sacct", "--parsable2", "--noheader", f"--jobs={check_job_id(job_id)}",
            "--format=" + ",".join(SACCT_FIELDS)]


def parse_sacct(stdout: str, stderr: str = "") -> list[SacctRow] | AccountingDisabled:
    """The job's rows (job first, then steps), or AccountingDisabled."""
    if "accounting storage is disabled" in stderr.lower():
        return AccountingDisabled(slurm_error_message(stderr))
    rows = _delimited_rows(stdout, SACCT_FIELDS, "sacct")
    return [SacctRow(job_id, state, parse_exit_code(exit_code), elapsed, nodes, name)
            for job_id, state, exit_code, elapsed, nodes, name in rows]


def sacct_job_row(rows: list[SacctRow], job_id: str) -> SacctRow | None:
    """The job's own row (not a step); the last one if it was requeued."""
    own = [row for row in rows if row.job_id == job_id]
    return own[-1] if own else None


# ---------------------------------------------------------------- scontrol show job

# Keys whose value runs to the end of the line (paths and free text may hold
# blanks and `=`); scontrol prints each of them on a line of its own.
_WHOLE_LINE_KEYS = frozenset({
    "Command", "WorkDir", "StdOut", "StdErr", "StdIn", "Comment", "AdminComment",
    "SystemComment", "Reason", "Power", "MailUser", "Features", "Prolog", "Epilog",
})
_KEY_AT = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/]*)=")


def build_scontrol_show_job(job_id: str) -> list[str]:
    """argv of `scontrol show job ID` (the multi-line format, not --oneliner)."""
    return ["scontrol", "show", "job", check_job_id(job_id)]


def parse_scontrol_show_job(stdout: str) -> list[dict[str, str]]:
    """One dict of `Key=Value` fields per job record (records are blank-line separated)."""
    records: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in stdout.splitlines():
        if not line.strip():
            if current:
                records.append(current)
            current = {}
            continue
        current.update(_parse_scontrol_line(line))
    if current:
        records.append(current)
    return records


def _parse_scontrol_line(line: str) -> dict[str, str]:
    text = line.strip()
    key, sep, rest = text.partition("=")
    if sep and key in _WHOLE_LINE_KEYS:
        return {key: rest}
    return dict(_split_key_values(text))


def _split_key_values(text: str) -> Iterator[tuple[str, str]]:
    """`A=1 B=x y C=2` -> (A, 1), (B, x y), (C, 2): a blank-containing value
    runs until the next ` Key=`."""
    starts = list(_KEY_AT.finditer(text))
    for match, following in zip(starts, starts[1:] + [None]):
        end = following.start() if following else len(text)
        yield match.group(1), text[match.end():end].strip()


# ---------------------------------------------------------------- scancel


def build_scancel(job_id: str, signal: str | None = None) -> list[str]:
    """argv of scancel for one job (optionally only a signal, e.g. `USR1`).

    `--verbose` because scancel exits 0 and prints nothing for an unknown or
    finished job otherwise; see `parse_scancel`.
    """
    argv = ["scancel", "--verbose"]
    if signal:
        if not re.fullmatch(r"[A-Z0-9]+", signal):
            raise ValueError(f"not a signal name: {signal!r}")
        argv.append(f"--signal={signal}")
    return argv + [check_job_id(job_id)]


@dataclass(frozen=True)
class ScancelResult:
    """What `scancel --verbose` said: nothing wrong, or Slurm's error."""

    error: str | None

    @property
    def already_finished(self) -> bool:
        return self.error is not None and "already completing or completed" in self.error

    @property
    def unknown_job(self) -> bool:
        return self.error is not None and is_unknown_job(self.error)


def parse_scancel(stderr: str) -> ScancelResult:
    """Read `scancel --verbose`'s stderr (its exit status is 0 either way)."""
    for line in stderr.splitlines():
        match = re.match(r"scancel: error: (.*)", line.strip())
        if match:
            return ScancelResult(match.group(1))
    return ScancelResult(None)


# ---------------------------------------------------------------- nodes


@dataclass(frozen=True)
class NodeRow:
    """One node of `sinfo --Node` in the format of `build_sinfo_nodes`."""

    node: str
    state: str
    reason: str

    @property
    def drained(self) -> bool:
        """DRAINED/DRAINING: `drained`, `draining`, `drained*`, `mixed+drain`..."""
        return "drain" in self.state.lower()


def build_sinfo_nodes(partition: str | None = None) -> list[str]:
    """argv of sinfo listing one line per node: name, state, reason."""
    argv = ["sinfo", "--Node", "--noheader", f"--format={_SINFO_FORMAT}"]
    if partition:
        argv.append(f"--partition={_check_word(partition, 'partition')}")
    return argv


def parse_sinfo_nodes(stdout: str) -> list[NodeRow]:
    """Rows of `build_sinfo_nodes`' output; a node in two partitions shows once."""
    rows: dict[str, NodeRow] = {}
    for node, state, reason in _delimited_rows(stdout, SINFO_FIELDS, "sinfo"):
        rows.setdefault(node, NodeRow(node, state, "" if reason == "none" else reason))
    return list(rows.values())


@dataclass(frozen=True)
class SlurmNode:
    """A node of `scontrol show node --oneliner`: Slurm's name for it and where it is."""

    name: str  # NodeName: what sbatch --exclude and the job's node list use
    host_name: str  # NodeHostName: the node's host name (an FQDN or a cloud name on many clusters)
    address: str  # NodeAddr: a name or an IP address that reaches it
    state: str  # State: IDLE, MIXED, DOWN+DRAIN, IDLE*, ...


def build_scontrol_show_nodes(nodes: str | None = None) -> list[str]:
    """argv of `scontrol show node --oneliner [NODES]`: one line per node (all without NODES)."""
    argv = ["scontrol", "show", "node", "--oneliner"]
    return argv + [_check_word(nodes, "node list")] if nodes else argv


def parse_scontrol_show_nodes(stdout: str) -> list[SlurmNode]:
    """The nodes of `build_scontrol_show_nodes`' output (values may hold blanks, as OS= does)."""
    found = []
    for line in stdout.splitlines():
        fields = dict(_split_key_values(line.strip()))
        if fields.get("NodeName"):
            found.append(SlurmNode(fields["NodeName"], fields.get("NodeHostName", ""), fields.get("NodeAddr", ""),
                                   fields.get("State", "")))
    return found


def build_scontrol_update_nodes(nodes: str, state: str, reason: str | None = None) -> list[str]:
    """argv of `scontrol update NodeName=... State=... Reason=...`.

    DRAIN and DOWN need a reason (Slurm refuses them without one); the reason
    is one argv item, so it may hold blanks but no newline.
    """
    state = state.upper()
    if state not in NODE_STATES:
        raise ValueError(f"node state {state!r}: use one of {', '.join(NODE_STATES)}")
    argv = ["scontrol", "update", f"NodeName={_check_word(nodes, 'node list')}", f"State={state}"]
    if state in ("DRAIN", "DOWN") and not reason:
        raise ValueError(f"State={state} needs a reason")
    if reason:
        if any(ch in reason for ch in "\n\r\0"):
            raise ValueError(f"node reason {reason!r} contains a newline")
        argv.append(f"Reason={reason}")
    return argv


# ---------------------------------------------------------------- checks


def check_job_id(job_id: str) -> str:
    """A job id as Slurm writes it (`12`, `12_3` array task, `12+1` het part)."""
    job_id = str(job_id).strip()
    if not _JOB_ID.match(job_id):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return job_id


def _check_word(value: str, what: str) -> str:
    if not value or not re.fullmatch(r"[A-Za-z0-9._,\[\]-]+", value):
        raise ValueError(f"{what} {value!r} has characters Slurm does not take there")
    return value
