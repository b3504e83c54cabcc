"""Why a job ended, from what srun and slurmstepd wrote into its output (pure).

A job's exit code hides its failure: when one rank raises, srun terminates the
others and the batch script ends with srun's 143. srun itself names the task
that failed first (`srun: error: n2: task 3: Exited with exit code 1`), and
slurmstepd says why it stopped a job (`*** JOB 5 ON n1 CANCELLED AT ... DUE TO
TIME LIMIT ***`). The parsers are tested on verbatim Slurm 22.05 output in
tests/data/slurm/.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# `srun: error: n2: task 3: Exited with exit code 1`, `...: tasks 0-1: Terminated`
_TASK_LINE = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.+?)\s*$")
_EXIT = re.compile(r"Exited with exit code (\d+)")
# slurmstepd's banner for a job or step it stopped, with the cause when it has one.
_CANCELLED = re.compile(r"\*\*\* (?:JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
                        r"(?: DUE TO (?P<cause>[A-Z][A-Z ]*[A-Z]))?(?:,| \*\*\*|$)")
_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (?P<node>\S+)")
_OOM = re.compile(r"Detected (\d+) oom[_-]kill event")
# What srun says of tasks it stopped itself after another task failed.
COLLATERAL = frozenset({"Terminated", "Killed"})


@dataclass(frozen=True)
class TaskFailure:
    """One `srun: error: NODE: task(s) N: WHAT` line."""

    node: str
    tasks: tuple[int, ...]
    what: str  # "Exited with exit code 1", "Terminated", "Segmentation fault", ...

    @property
    def exit_code(self) -> int | None:
        match = _EXIT.fullmatch(self.what)
        return int(match.group(1)) if match else None

    @property
    def collateral(self) -> bool:
        """Stopped by srun after another task failed, not a failure of its own."""
        return self.what in COLLATERAL

    def describe(self, ranks: bool = True) -> str:
        """`rank 3 on n2 exited with exit code 1` (`task` instead of `rank`
        where a task is not one rank, as with torchrun's one task per node)."""
        word = ("rank" if ranks else "task") + ("s" if len(self.tasks) > 1 else "")
        what = self.what[0].lower() + self.what[1:] if self.exit_code is not None else f"died: {self.what}"
        return f"{word} {_fold_ints(self.tasks)} on {self.node} {what}"


@dataclass(frozen=True)
class OutputVerdict:
    """What a job's output says about how it ended."""

    failures: tuple[TaskFailure, ...]
    cause: str | None      # slurmstepd's "TIME LIMIT", "NODE FAILURE", "PREEMPTION", ...
    failed_nodes: tuple[str, ...]
    oom_kills: int

    @property
    def first_failure(self) -> TaskFailure | None:
        """The first task that failed on its own; None when srun or Slurm stopped
        every task (a time limit, a cancel): then no task is to blame."""
        own = [f for f in self.failures if not f.collateral]
        return own[0] if own else None


def parse_job_output(text: str) -> OutputVerdict:
    """srun's task failures (in the order srun printed them), slurmstepd's
    cancellation cause, failed nodes and OOM kills found in a job's output."""
    failures: list[TaskFailure] = []
    cause = None
    failed_nodes: list[str] = []
    oom = 0
    for line in text.splitlines():
        task = _TASK_LINE.match(line.strip())
        if task:
            failures.append(TaskFailure(task.group("node"), _expand_ints(task.group("tasks")),
                                        task.group("what")))
            continue
        cancelled = _CANCELLED.search(line)
        if cancelled and cancelled.group("cause") and cause is None:
            cause = cancelled.group("cause").strip()
        node_failure = _NODE_FAILURE.match(line.strip())
        if node_failure and node_failure.group("node") not in failed_nodes:
            failed_nodes.append(node_failure.group("node"))
        oom_match = _OOM.search(line)
        if oom_match:
            oom += int(oom_match.group(1))
    return OutputVerdict(tuple(failures), cause, tuple(failed_nodes), oom)


def base_state(text: str) -> str:
    """`CANCELLED by 0` (sacct) or `RUNNING` -> the bare upper-case state name."""
    words = text.split()
    return words[0].rstrip("+").upper() if words else ""


# Slurm's terminal job states that need words beside the state's name.
STATE_WORDS = {
    "TIMEOUT": "reached its time limit",
    "NODE_FAIL": "a node failed",
    "OUT_OF_MEMORY": "ran out of memory",
    "PREEMPTED": "preempted",
    "BOOT_FAIL": "its nodes did not boot",
    "DEADLINE": "missed its deadline",
}


def explain(job_id: str, state: str, exit_status: int | None, verdict: OutputVerdict | None,
            ranks: bool = True) -> str:
    """One sentence on how the job ended: its exit code, Slurm's state, and the
    first failing task with its own exit code or signal (`job 44 finished with
    exit code 143: FAILED; first failure: rank 3 on n2 exited with exit code 1`)."""
    name = base_state(state) or "UNKNOWN"
    words = f" ({STATE_WORDS[name]})" if name in STATE_WORDS else ""
    code = f"finished with exit code {exit_status}" if exit_status is not None else "ended"
    details = []
    first = verdict.first_failure if verdict else None
    if name != "COMPLETED" and first is not None:
        details.append(f"first failure: {first.describe(ranks)}")
    if verdict and verdict.cause and name != "TIMEOUT":
        details.append(f"Slurm stopped it due to {verdict.cause.lower()}")
    if verdict and verdict.failed_nodes:
        details.append(f"failed node(s): {', '.join(verdict.failed_nodes)}")
    if verdict and verdict.oom_kills:
        details.append(f"{verdict.oom_kills} task(s) killed for using too much memory")
    return f"job {job_id} {code}: {name}{words}" + "".join(f"; {d}" for d in details)


def _expand_ints(text: str) -> tuple[int, ...]:
    """`0-1,3` -> (0, 1, 3)."""
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            out.extend(range(int(low), int(high) + 1) if high.isdigit() else [int(low)])
    return tuple(out)


def _fold_ints(values: tuple[int, ...]) -> str:
    """(0, 1, 3) -> `0-1,3`."""
    runs: list[list[int]] = []
    for value in sorted(set(values)):
        if runs and runs[-1][1] == value - 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
