"""Job and node lifecycle over a runner: submit, status, wait, cancel, logs, node states."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cluster_kit.errors import ClusterRefused
from cluster_kit.hostlist import fold
from cluster_kit.slurm import builders as slurm
from cluster_kit.slurm.runner import refusal, run_checked

if TYPE_CHECKING:
    from cluster_kit.slurm.runner import Runner


# ----------------------------------------------------------------------------
# jobs


def sbatch_argv(test_only: bool = False, options: Mapping[str, slurm.OptionValue] | None = None) -> list[str]:
    """The sbatch argv `submit` runs (what `--dry-run` prints)."""
    return slurm.build_sbatch(options, test_only=test_only)


def submit(runner: Runner, script: str, test_only: bool = False,
           options: Mapping[str, slurm.OptionValue] | None = None) -> str:
    """sbatch `script` (on stdin): the job id, or with `test_only` Slurm's
    estimate (`Job 3 to start at ... in partition debug`).

    Raises ClusterRefused with Slurm's message when sbatch refuses the job.
    """
    argv = sbatch_argv(test_only, options)
    completed = runner.run(argv, stdin=script)
    if not completed.ok:
        raise refusal("sbatch --test-only" if test_only else "sbatch", completed, runner)
    try:
        if test_only:
            return slurm.parse_sbatch_test_only(completed.stderr).message
        return slurm.parse_sbatch(completed.stdout)
    except ValueError as exc:
        raise ClusterRefused(f"unexpected sbatch output {runner.where}: {exc}") from None


@dataclass(frozen=True)
class JobStatus:
    """A job's state as the first Slurm source that knows it reports it."""

    job_id: str
    state: str
    reason: str
    nodes: str
    elapsed: str
    exit_code: slurm.ExitCode | None
    stdout_path: str | None
    source: str  # squeue | scontrol | sacct
    num_nodes: str = ""  # nodes the job asked for (squeue %D)
    partition: str = ""
    tasks: tuple[JobStatus, ...] = ()  # an array job's tasks (`12_0`, `12_[3-5]`), in task order

    @property
    def phase(self) -> str:
        return slurm.job_phase(self.state)

    @property
    def finished(self) -> bool:
        return self.phase == "terminal"

    @property
    def exit_status(self) -> int | None:
        """The exit status `submit --wait` reports; None while the job runs.
        An array job's is its first failed task's (0 only when every task completed)."""
        if not self.finished:
            return None
        failed = self.failed_tasks
        if failed:
            return failed[0].exit_status
        return slurm.job_exit_code(self.state, self.exit_code)

    @property
    def failed_tasks(self) -> list[JobStatus]:
        """An array job's tasks that ended in any state but COMPLETED."""
        return [task for task in self.tasks
                if task.finished and slurm.base_state(task.state) != "COMPLETED"]

    def items(self) -> Iterator[tuple[str, object]]:
        """(field, value) pairs to print, the unset ones left out."""
        pairs = [("job_id", self.job_id), ("state", self.state), ("phase", self.phase),
                 ("reason", self.reason), ("nodes", self.nodes), ("elapsed", self.elapsed),
                 ("exit_code", self.exit_code), ("exit_status", self.exit_status),
                 ("stdout", self.stdout_path), ("source", self.source)]
        # squeue says reason "None" for a job with nothing to wait for: not shown
        return iter([(name, value) for name, value in pairs
                     if value not in (None, "") and not (name == "reason" and value == "None")])


def job_status(runner: Runner, job_id: str) -> JobStatus:
    """squeue for a queued or running job; scontrol, then sacct, once it ended.

    Raises ClusterRefused when no source knows the job or a command fails.
    """
    job_id = slurm.check_job_id(job_id)
    status = _find_status(runner, job_id)
    if status is None:
        raise ClusterRefused(
            f"Slurm {runner.where} does not know job {job_id}",
            fix="check the id (squeue --me); without accounting (slurmdbd) Slurm forgets "
                "a job MinJobAge seconds after it ends",
        )
    return status


def _find_status(runner: Runner, job_id: str) -> JobStatus | None:
    """The (checked) job's status from the first source that knows it; None if none does."""
    status = _status_from_squeue(runner, job_id)
    if status is not None and not status.finished:
        return status
    return _status_from_scontrol(runner, job_id) or _status_from_sacct(runner, job_id) or status


def _status_from_squeue(runner: Runner, job_id: str) -> JobStatus | None:
    completed = runner.run(slurm.build_squeue(job_id))
    if not completed.ok:
        if slurm.is_unknown_job(completed.stderr):
            return None
        raise refusal("squeue", completed, runner)
    rows = slurm.parse_squeue(completed.stdout)
    for row in rows:
        if row.job_id == job_id:
            return _squeue_status(row)
    tasks = [_squeue_status(row) for row in rows if row.job_id.startswith(f"{job_id}_")]
    return array_status(job_id, tasks, "squeue") if tasks else None


def _squeue_status(row: slurm.SqueueRow) -> JobStatus:
    return JobStatus(row.job_id, row.state, row.reason, row.nodes, row.elapsed,
                     None, None, "squeue", row.num_nodes, row.partition)


def array_status(job_id: str, tasks: Sequence[JobStatus], source: str) -> JobStatus:
    """One status for an array job from its tasks': pending or running while any
    task is; once all ended, COMPLETED only if every task completed, else the
    state and exit code of the first task (in task order) that did not."""
    ordered = tuple(sorted(tasks, key=lambda t: _task_order(t.job_id)))
    live = [t for t in ordered if not t.finished]
    running = [t for t in live if t.phase == "running"]
    failed = [t for t in ordered if t.finished and slurm.base_state(t.state) != "COMPLETED"]
    lead = (running or live or failed or list(ordered))[0]
    nodes = fold(list(dict.fromkeys(n for t in ordered for n in _expand_nodes(t.nodes)))) if ordered else ""
    return JobStatus(job_id, lead.state, lead.reason, nodes, lead.elapsed, lead.exit_code,
                     None, source, lead.num_nodes, lead.partition, ordered)


def _task_order(task_id: str) -> tuple[int, str]:
    """`12_3` -> (3, ...); folded pending tasks (`12_[4-9%2]`) sort by their first."""
    digits = "".join(ch if ch.isdigit() else " " for ch in task_id.partition("_")[2]).split()
    return (int(digits[0]) if digits else 0, task_id)


def _expand_nodes(nodes: str) -> list[str]:
    from cluster_kit.hostlist import expand

    try:
        return expand(nodes) if nodes and nodes != "(null)" else []
    except ValueError:
        return []


def _scontrol_records(runner: Runner, job_id: str) -> list[dict[str, str]]:
    completed = runner.run(slurm.build_scontrol_show_job(job_id))
    if not completed.ok:
        if slurm.is_unknown_job(completed.stderr + completed.stdout):
            return []
        raise refusal("scontrol show job", completed, runner)
    return slurm.parse_scontrol_show_job(completed.stdout)


def _status_from_scontrol(runner: Runner, job_id: str) -> JobStatus | None:
    records = _scontrol_records(runner, job_id)
    tasks = array_records(records, job_id)
    if tasks:
        return array_status(job_id, [_record_status(r, task_id) for task_id, r in tasks], "scontrol")
    record = next((r for r in records if r.get("JobId") == job_id), records[0] if records else None)
    return None if record is None else _record_status(record, job_id)


def array_records(records: Sequence[dict[str, str]], job_id: str) -> list[tuple[str, dict[str, str]]]:
    """(`12_3`, record) for each task of array job `job_id` scontrol listed."""
    return [(f"{job_id}_{r['ArrayTaskId']}", r) for r in records
            if r.get("ArrayJobId") == job_id and r.get("ArrayTaskId")]


def _record_status(record: dict[str, str], job_id: str) -> JobStatus:
    exit_code = record.get("ExitCode")
    return JobStatus(
        job_id, record.get("JobState", ""), record.get("Reason", ""),
        record.get("NodeList", ""), record.get("RunTime", ""),
        slurm.parse_exit_code(exit_code) if exit_code else None,
        record.get("StdOut") or None, "scontrol",
    )


def _status_from_sacct(runner: Runner, job_id: str) -> JobStatus | None:
    completed = runner.run(slurm.build_sacct(job_id))
    result = slurm.parse_sacct(completed.stdout, completed.stderr)
    if isinstance(result, slurm.AccountingDisabled):
        return None
    if not completed.ok:
        raise refusal("sacct", completed, runner)
    row = slurm.sacct_job_row(result, job_id)
    if row is None:
        return None
    return JobStatus(job_id, row.state, "", row.nodes, row.elapsed, row.exit_code, None, "sacct")


def cancel(runner: Runner, job_id: str) -> bool:
    """scancel the job: True if Slurm cancelled it, False if it had already ended.

    Raises ClusterRefused for a job id Slurm does not know.
    """
    completed = runner.run(slurm.build_scancel(job_id))
    result = slurm.parse_scancel(completed.stderr)
    if result.already_finished:
        return False
    if result.error or not completed.ok:
        raise refusal("scancel", completed, runner)
    return True


def never_start_refusal(runner: Runner, status: JobStatus) -> ClusterRefused | None:
    """ClusterRefused (exit 3) naming the reason and fix when the pending job can
    never start; None while it may. sinfo is asked only for PartitionNodeLimit."""
    if status.phase != "pending":
        return None
    size = None
    if status.reason == "PartitionNodeLimit":
        size = len(node_states(runner, status.partition or None))
    nodes = int(status.num_nodes) if status.num_nodes.isdigit() else None
    fix = slurm.never_start_fix(status.reason, nodes, size)
    if fix is None:
        return None
    detail = (f": it asks for {nodes} nodes, partition {status.partition} has {size}"
              if status.reason == "PartitionNodeLimit" else "")
    return ClusterRefused(f"Slurm {runner.where} can never start job {status.job_id}: pending "
                          f"with reason {status.reason}{detail}", fix=fix)


def settle(runner: Runner, job_id: str, timeout: float = 6.0, poll: float = 0.5,
           sleep: Callable[[float], None] = time.sleep) -> JobStatus:
    """The job's status once Slurm has judged it: polled while its reason is one
    Slurm shows before deciding (PartitionConfig), for at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        status = job_status(runner, job_id)
        if status.reason not in slurm.UNSETTLED_REASONS or time.monotonic() >= deadline:
            return status
        sleep(poll)


def watch(runner: Runner, job_id: str, poll: float = 5.0, sleep: Callable[[float], None] = time.sleep,
          cancel_never_start: bool = False, first: JobStatus | None = None) -> Iterator[JobStatus]:
    """The job's status every `poll` s until it ended (the last one yielded); `first`:
    its status just read, if the caller has it.

    Raises ClusterRefused if the job vanishes, and, with `cancel_never_start`, cancels
    a job that can never start and raises ClusterRefused with the reason.
    """
    while True:
        status, first = first or job_status(runner, job_id), None
        yield status
        if status.exit_status is not None:
            return
        refused = never_start_refusal(runner, status) if cancel_never_start else None
        if refused is not None:
            cancel(runner, job_id)
            raise ClusterRefused(f"{refused.message}; cancelled it", fix=refused.fix)
        sleep(poll)


def is_finished(runner: Runner, job_id: str) -> bool:
    """True once the job ended, or once Slurm no longer knows it."""
    status = _find_status(runner, slurm.check_job_id(job_id))
    return status is None or status.finished


def job_output_paths(runner: Runner, job_id: str) -> dict[str, str]:
    """{job or array task id: its StdOut path} as scontrol reports them (a
    pending array's not-yet-started tasks left out); {} once Slurm forgot the job."""
    job_id = slurm.check_job_id(job_id)
    records = _scontrol_records(runner, job_id)
    tasks = array_records(records, job_id)
    if tasks:
        return {task_id: r["StdOut"] for task_id, r in sorted(tasks, key=lambda t: _task_order(t[0]))
                if r.get("StdOut") and r["ArrayTaskId"].isdigit()}
    record = next((r for r in records if r.get("JobId") == job_id), records[0] if records else None)
    return {job_id: record["StdOut"]} if record and record.get("StdOut") else {}


def job_output_path(runner: Runner, job_id: str) -> str | None:
    """The job's StdOut path as scontrol reports it; None once Slurm forgot the job."""
    paths = job_output_paths(runner, job_id)
    return paths.get(slurm.check_job_id(job_id)) or next(iter(paths.values()), None)


def read_output(runner: Runner, job_id: str, offset: int = 0) -> str:
    """The job's output file from byte `offset` on ("" while it does not exist yet).

    Read through the runner, so it works where the file is: on the login
    host's shared file system, or here.
    """
    path = job_output_path(runner, job_id)
    if path is None:
        job_status(runner, job_id)  # a job Slurm does not know at all is said so
        raise ClusterRefused(f"Slurm {runner.where} no longer knows job {job_id}'s output file",
                             fix="read the file the job's --output option names")
    return read_path(runner, path, offset)


def read_tail(runner: Runner, path: str, size: int = 256 * 1024) -> str:
    """The last `size` bytes of a file, read through the runner ("" while it does not exist)."""
    completed = runner.run(["tail", "-c", str(int(size)), "--", path])
    if not completed.ok:
        return ""
    return completed.stdout


def read_path(runner: Runner, path: str, offset: int = 0) -> str:
    """A file from byte `offset` on, read through the runner ("" while it does not exist)."""
    completed = runner.run(["tail", "-c", f"+{int(offset) + 1}", "--", path])
    if not completed.ok:
        if "No such file" in completed.stderr:
            return ""
        raise ClusterRefused(f"cannot read {path} {runner.where}: {completed.stderr.strip()}")
    return completed.stdout


# ----------------------------------------------------------------------------
# nodes


def node_states(runner: Runner, partition: str | None = None) -> list[slurm.NodeRow]:
    """Every node of the partition (or cluster) with its state and reason."""
    completed = run_checked(runner, slurm.build_sinfo_nodes(partition))
    return slurm.parse_sinfo_nodes(completed.stdout)


def partition_nodes(runner: Runner, partition: str | None) -> list[str]:
    """Node names of the partition; ClusterRefused if it has none."""
    nodes = [row.node for row in node_states(runner, partition)]
    if not nodes:
        raise ClusterRefused(f"sinfo lists no nodes for partition {partition!r} {runner.where}",
                             fix="check slurm.partition in the profile, or set nodes")
    return nodes


def update_nodes(runner: Runner, nodes: Sequence[str], state: str,
                 reason: str | None = None) -> None:
    """DRAIN/DOWN (with a reason), RESUME or UNDRAIN the nodes via scontrol."""
    run_checked(runner, slurm.build_scontrol_update_nodes(fold(nodes), state, reason))
