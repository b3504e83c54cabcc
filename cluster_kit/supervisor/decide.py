"""What the supervisor decides, from what it saw (pure: stdlib only, Python 3.8+).

- HangClock: when each rank last finished a step, and which ranks stalled past
  `hang_timeout`. The clock of a rank starts at its first heartbeat, or at the
  first heartbeat of any rank for one that has none yet; before any rank finished
  a step (imports, rendezvous, loading a checkpoint) the attempt has
  `startup_timeout` (default `max(hang_timeout, STARTUP_S)`). While any rank is
  inside `ddp.paused()` nobody stalls, and every clock starts again when the
  pause ends; a pause longer than its `max_s` stops nothing any more (`overdue`).
- attempt_end: how an attempt ended (SPEC's words) and who is blamed, with whose
  fault it is: the culprit's `kind` is "node" (a node fault: a hang, a failed node,
  a fatal signal, a GPU or network error) or "program" (an exception of the script,
  with its `signature`), and a crash says when it showed (`detected_after_s`).
- next_step: restart without the blamed nodes (only for node faults, unless
  `exclude_on: any_failure`), requeue after the time limit, or end the chain,
  within `max_restarts` / `max_time_requeues`; the same program error in two
  attempts ends it at once.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cluster_kit.hostlist import NodeSet

from .record import FAILURES, REQUEUES, AttemptRecord, ChainRecord

if TYPE_CHECKING:
    from cluster_kit.analysis.culprit import Crash
    from cluster_kit.slurm.outcome import TaskFailure
    from cluster_kit.trainer.contract import Heartbeat

STARTUP_S = 600.0


class HangClock:
    def __init__(self, world_size: int, hang_timeout: float, started: float,
                 startup_timeout: float | None = None) -> None:
        self.world_size = world_size
        self.hang_timeout = float(hang_timeout)
        self.startup_timeout = float(startup_timeout) if startup_timeout else max(self.hang_timeout, STARTUP_S)
        self.started = started
        self.first_beat: float | None = None
        self.progress: dict[int, tuple[int, float]] = {}  # rank -> (steps, unix time of its last finished step)
        self.paused: dict[int, tuple[float, float | None, str]] = {}  # rank -> (since, max_s, reason)
        self.resumed = started  # the end of the last pause of any rank

    def observe(self, rank: int, beat: Heartbeat) -> None:
        """A heartbeat of `rank`: its steps, when the last ended, and its pause."""
        if self.first_beat is None and beat.steps > 0:
            self.first_beat = beat.time
        seen = self.progress.get(rank)
        if (seen is None or beat.steps != seen[0]) and beat.steps > 0:
            self.progress[rank] = (beat.steps, max(beat.time, self.started))
        if beat.paused_since is not None:
            self.paused[rank] = (beat.paused_since, beat.pause_max_s, beat.pause_reason)
        else:
            self.paused.pop(rank, None)
        if beat.resumed_at is not None:
            self.resumed = max(self.resumed, beat.resumed_at)

    def since(self, rank: int) -> float:
        """When the rank's clock started: its last finished step, else the first beat,
        and never before the last pause of any rank ended."""
        seen = self.progress.get(rank)
        start = seen[1] if seen else (self.first_beat if self.first_beat is not None else self.started)
        return max(start, self.resumed)

    def overdue(self, now: float) -> dict[int, tuple[str, float, float]]:
        """{rank: (reason, seconds paused, max_s)} of the pauses past their max_s at `now`."""
        return {r: (reason, now - since, limit) for r, (since, limit, reason) in self.paused.items()
                if limit is not None and now - since > limit}

    def stalled(self, now: float) -> list[int]:
        """The ranks that finished no step for longer than allowed, at `now` (none while
        any rank is paused within its max_s: the others wait for it in a collective)."""
        if len(self.overdue(now)) < len(self.paused):
            return []
        limit = self.hang_timeout if self.first_beat is not None else self.startup_timeout
        return [r for r in range(self.world_size) if now - self.since(r) > limit]

    def stalled_since(self, ranks: Sequence[int]) -> float:
        return min(self.since(r) for r in ranks) if ranks else self.started


NODE_FAULT = "node"
PROGRAM_ERROR = "program"
OUT_OF_MEMORY = "Out Of Memory"  # srun's word for a task the step's memory cgroup OOM-killed
EXCLUDE_ON = ("node_faults", "any_failure")
# The culprit's keys kept in the attempts record (stacks and timing go beside it).
RECORDED = ("ranks", "hosts", "evidence", "kind", "why", "signature", "error", "where", "unmatched_hosts")


def culprit_of(ranks: Iterable[int], hosts: Iterable[str], evidence: str, kind: str = NODE_FAULT,
               why: str = "") -> dict[str, Any]:
    culprit: dict[str, Any] = {"ranks": sorted(ranks), "hosts": sorted({h for h in hosts if h}),
                               "evidence": evidence, "kind": kind}
    if why:
        culprit["why"] = why
    return culprit


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What was seen of an attempt whose launch ended.

    `hang`: the culprit of a diagnosed hang; `grace`: the ranks were told to stop for
    the time limit; `cancelled`; `crash`: analysis.culprit.Crash from the ranks'
    exception and fault files; `first_task`: srun's first own failure; `failed_nodes`:
    nodes srun or Slurm said failed; `now`: when the end was seen (a crash's
    `detected_after_s`); `node_of_rank`: rank -> its Slurm node, for blamed ranks that
    named none; `memory`: the job's memory as Slurm holds it, for an OOM kill.
    """

    hang: dict[str, Any] | None = None
    grace: bool = False
    cancelled: bool = False
    crash: Crash | None = None
    first_task: TaskFailure | None = None
    failed_nodes: tuple[str, ...] = ()
    now: float | None = None
    node_of_rank: Callable[[int], str] | None = None
    memory: str = ""


def attempt_end(exit_code: int | None, seen: Evidence | None = None) -> tuple[str, dict[str, Any] | None]:
    """(ended, culprit or None) of an attempt whose launch exited with `exit_code`.

    A task srun says the OOM killer ended is a program error, whatever the ranks that
    lost it wrote; an exit no rank and no node explained is the program's too.
    """
    seen = seen or Evidence()
    if seen.cancelled:
        return "cancelled", None
    if seen.hang is not None:
        return "hang", dict(seen.hang, kind=seen.hang.get("kind", NODE_FAULT))
    if seen.grace:
        return "time_limit", None
    if exit_code == 0:
        return "completed", None
    if seen.failed_nodes:
        nodes = sorted(set(seen.failed_nodes))
        return "node_failure", culprit_of([], nodes, "Slurm reports node {} failed".format(", ".join(nodes)))
    task, crash = seen.first_task, seen.crash
    if task is not None and task.what == OUT_OF_MEMORY and (crash is None or crash.kind != PROGRAM_ERROR):
        return "crash", task_culprit(task, seen.memory)  # the others only lost it, or failed waiting for it
    if crash is not None:
        return "crash", crash_culprit(crash, seen)
    if task is not None:
        return "crash", task_culprit(task, seen.memory)
    said = f"the launch exited with {exit_code} and no rank said why"
    # Nothing points at a node: the script's own exit (sys.exit in a rank, a launch it broke).
    return "crash", dict(culprit_of([], [], said, PROGRAM_ERROR, "no rank and no node reported a fault"),
                         signature=said, error=said)


def crash_culprit(crash: Crash, seen: Evidence) -> dict[str, Any]:
    """The culprit dict of a crash: its ranks and their nodes, whose fault it is and,
    for a program error, its signature (JSON-friendly: the record is JSON)."""
    ranks = list(crash.ranks) or [crash.rank]
    hosts = list(crash.hosts) or ([crash.host] if crash.host else [])
    if not hosts and seen.node_of_rank is not None:
        hosts = [seen.node_of_rank(rank) for rank in ranks]
    if not hosts and seen.first_task is not None and crash.rank in seen.first_task.tasks:
        hosts = [seen.first_task.node]  # srun names the node of the task that failed
    culprit = culprit_of(ranks, hosts, crash.evidence, crash.kind, crash.why)
    if crash.signature is not None:
        culprit.update(signature=crash.signature.key, error=crash.signature.error, where=crash.signature.where)
    if seen.now is not None and crash.time is not None:
        culprit["detected_after_s"] = round(max(0.0, seen.now - crash.time), 1)
    return culprit


def task_culprit(task: TaskFailure, memory: str = "") -> dict[str, Any]:
    """srun's word alone (no rank left a traceback): a task the kernel killed for the
    memory it used is the program's (it asks that much on any node), as is one that
    exited with a code of its own; one killed by another signal is the node's fault."""
    code = task.exit_code
    if task.what == OUT_OF_MEMORY:
        limit = f" (the job's memory: {memory})" if memory else ""
        culprit = culprit_of(task.tasks, [task.node], task.describe() + limit, PROGRAM_ERROR,
                             "the kernel's OOM killer ended it for the memory it used: the same on any node")
        return dict(culprit, signature="srun: Out Of Memory", error=f"Out Of Memory{limit}")
    if code is None or code > 128:
        return culprit_of(task.tasks, [task.node], task.describe(), NODE_FAULT, "killed by a signal")
    return culprit_of(task.tasks, [task.node], task.describe(), PROGRAM_ERROR,
                      f"exited with exit code {code} without a Python traceback: the script's own exit")


def recorded_culprit(culprit: Mapping[str, Any]) -> dict[str, Any]:
    """What of a culprit goes into the attempts record's `culprit`."""
    return {k: culprit[k] for k in RECORDED if k in culprit}


def on_slurm_names(culprit: dict[str, Any] | None, names: Mapping[str, str]) -> dict[str, Any] | None:
    """The culprit with its hosts as Slurm names. `names`: host -> Slurm name
    (slurm.node_names.slurm_names over the allocation's nodes); a host that is none
    of them is kept apart as `unmatched_hosts`, to be seen and never excluded."""
    if not culprit:
        return culprit
    hosts = culprit.get("hosts", [])
    named = dict(culprit, hosts=sorted({names[h] for h in hosts if h in names}))
    unmatched = sorted(h for h in hosts if h not in names)
    if unmatched:
        named["unmatched_hosts"] = unmatched
    return named


def excludable(culprit: dict[str, Any] | None, allocated: Iterable[str]) -> dict[str, Any] | None:
    """The culprit with only the hosts Slurm gave the attempt: a host name a rank
    wrote into its files never reaches sbatch's command line by itself."""
    if not culprit:
        return culprit
    nodes = set(allocated)
    return dict(culprit, hosts=[h for h in culprit.get("hosts", []) if h in nodes])


@dataclasses.dataclass(frozen=True)
class Ending:
    """How an attempt ended, as next_step needs it: `requeued` when Slurm requeued the job itself."""

    ended: str
    culprit: dict[str, Any] | None = None
    exit_code: int | None = None
    requeued: bool = True


@dataclasses.dataclass(frozen=True)
class Room:
    """The partition's nodes and the job's node count: enough must stay in."""

    partition: tuple[str, ...] = ()
    needed: int = 0


@dataclasses.dataclass(frozen=True)
class Step:
    """What comes next: `restart` (without `exclude`), `requeued` (Slurm runs the same
    job again: nothing to submit) or `finish` (the chain ends with `exit_code`)."""

    action: str
    exclude: list[str]
    exit_code: int | None
    why: str


def next_step(rec: ChainRecord, end: Ending, resilience: Mapping[str, Any], room: Room | None = None) -> Step:
    """The next step after the attempt that just ended (already the record's last, its
    `ended` set): restart without the blamed nodes (only for node faults, unless
    `exclude_on: any_failure`), requeue after the time limit or a preemption, or end
    the chain, within max_restarts / max_time_requeues; the same program error (or hang)
    in two attempts ends it at once. With a `room`, enough nodes stay in: the nodes
    excluded first come back before the ones just blamed.
    """
    excluded, room = rec.excluded_nodes(), room or Room()
    if end.ended == "completed":
        return _finish(0, "completed")
    if end.ended == "cancelled":
        return _finish(end.exit_code or 1, "cancelled")
    if end.ended in REQUEUES:
        return _requeue(rec, end, resilience)
    repeated = same_program_error(rec, end.culprit)
    if repeated:
        return _finish(1, repeated)
    used, allowed = rec.count(FAILURES), int(resilience["max_restarts"])
    if used > allowed:
        return _finish(1, f"{_words(end.ended)}, and max_restarts ({allowed}) are used up")
    blamed = NodeSet.of((end.culprit or {}).get("hosts", [])) - NodeSet.of(excluded)
    back = []
    if excludes(end.culprit, resilience):
        excluded = excluded + list(blamed)
        pool = NodeSet.of(room.partition)
        while pool and excluded and len(pool - NodeSet.of(excluded)) < room.needed:
            back.append(excluded.pop(0))
    without = " without {}".format(",".join(excluded)) if excluded else ""
    if back:
        without += f" ({','.join(back)} back in: a {room.needed}-node job needs them)"
    if _kind(end.culprit) == PROGRAM_ERROR and resilience.get("exclude", "blamed") == "blamed" and not excludes(
            end.culprit, resilience):
        without += "; a program error excludes no node (exclude_on: node_faults)"
    return Step("restart", excluded, end.exit_code or 1,
                f"{_words(end.ended)}: restart {used} of max_restarts {allowed}{without}")


def _requeue(rec: ChainRecord, end: Ending, resilience: Mapping[str, Any]) -> Step:
    """The time limit or preemption: no failure, within max_time_requeues."""
    used, allowed = rec.count(REQUEUES), int(resilience["max_time_requeues"])
    if used > allowed:
        return _finish(1, f"{_words(end.ended)}, and max_time_requeues ({allowed}) are used up")
    if end.ended == "preempted" and end.requeued:  # Slurm requeued the job itself: it runs again under its own id
        return Step("requeued", rec.excluded_nodes(), end.exit_code,
                    f"{_words(end.ended)}: Slurm requeued the job, which runs again as itself "
                    f"({used} of max_time_requeues {allowed})")
    return Step("restart", rec.excluded_nodes(), end.exit_code,
                f"{_words(end.ended, end.requeued)}: requeued without blame ({used} of max_time_requeues {allowed})")


def excludes(culprit: Mapping[str, Any] | None, resilience: Mapping[str, Any]) -> bool:
    """Whether the culprit's nodes leave the chain: with `exclude: blamed`, a node
    fault's always, a program error's only with `exclude_on: any_failure`."""
    if resilience.get("exclude", "blamed") != "blamed":
        return False
    return _kind(culprit) != PROGRAM_ERROR or resilience.get("exclude_on", EXCLUDE_ON[0]) == "any_failure"


def _kind(culprit: Mapping[str, Any] | None) -> str:
    """A culprit's kind; one without (an older record's) was always a node's."""
    return str((culprit or {}).get("kind", NODE_FAULT))


def same_as_before(rec: ChainRecord, culprit: Mapping[str, Any] | None) -> AttemptRecord | None:
    """The earlier attempt that failed with the culprit's signature (a program error, or
    a hang with the same stack and collective), else None. Call it with the attempt
    that just ended last in the record."""
    signature = (culprit or {}).get("signature")
    if not signature:
        return None
    return next((a for a in rec.attempts[:-1] if (a.culprit or {}).get("signature") == signature), None)


def as_the_scripts(rec: ChainRecord, culprit: dict[str, Any] | None) -> dict[str, Any] | None:
    """The culprit of a hang that an earlier attempt hung the same way (on other nodes):
    the script's (`kind: program`), so that no more nodes are excluded for it."""
    before = same_as_before(rec, culprit)
    if before is None or culprit is None or _kind(culprit) == PROGRAM_ERROR:
        return culprit
    return dict(culprit, kind=PROGRAM_ERROR,
                why=f"attempt {before.attempt} hung the same way: the script's hang, not a node's")


def same_program_error(rec: ChainRecord, culprit: Mapping[str, Any] | None) -> str | None:
    """Why the chain ends when the attempt that just ended (the record's last) failed
    with a program error an earlier attempt had, by signature; else None."""
    if culprit is None or _kind(culprit) != PROGRAM_ERROR:
        return None
    before, latest = same_as_before(rec, culprit), rec.last
    if before is None or latest is None:
        return None
    error = culprit.get("error") or culprit["signature"]
    at = f" at {culprit['where']}" if culprit.get("where") else ""
    then, now = (before.culprit or {}).get("hosts") or [], culprit.get("hosts") or []
    verb = "hangs" if latest.ended == "hang" else "fails"
    if then and now and set(then) != set(now):
        return (f"the script {verb} the same way on different nodes: {error}{at} "
                f"(attempt {before.attempt} on {','.join(then)}, attempt {latest.attempt} on {','.join(now)})")
    where = f" on {','.join(now)}" if then and now else ""
    return f"the script {verb} the same way twice: {error}{at} (attempts {before.attempt} and {latest.attempt}{where})"


def _finish(exit_code: int, why: str) -> Step:
    return Step("finish", [], exit_code, why)


WORDS = {"hang": "a hang", "crash": "a crash", "node_failure": "a node failure",
         "time_limit": "the time limit", "preempted": "preemption (or scontrol requeue)"}


def _words(ended: str, requeued: bool = True) -> str:
    return "preemption" if ended == "preempted" and not requeued else WORDS.get(ended, ended)


def term_cause(job_before: Mapping[str, str], job_now: Mapping[str, str]) -> str:
    """Why the batch script got SIGTERM, from `scontrol show job` before the attempt and
    at the signal (Slurm 22.05 says COMPLETING for all of them; the cause is elsewhere):
    `requeued` (Restarts= went up: preemption with PreemptMode=REQUEUE, scontrol
    requeue; the job runs again as itself), `preempted` (preemption that does not
    requeue), `time_limit` (Reason=TimeLimit), or `cancelled`."""
    before, now = str(job_before.get("Restarts", "0")), str(job_now.get("Restarts", "0"))
    if now.isdigit() and before.isdigit() and int(now) > int(before):
        return "requeued"
    if preempting(job_now):
        return "preempted"
    state, reason = job_now.get("JobState", ""), job_now.get("Reason", "")
    if state == "TIMEOUT" or reason == "TimeLimit":
        return "time_limit"
    return "cancelled"


def preempting(job_now: Mapping[str, str]) -> bool:
    """Whether Slurm is preempting the job (`scontrol show job`): its state or reason
    says so, or it set PreemptTime (with a partition's GraceTime the job still RUNs
    while its steps were sent SIGTERM)."""
    state, reason = job_now.get("JobState", ""), job_now.get("Reason", "")
    return (state == "PREEMPTED" or reason.startswith("Preempt")
            or slurm_time(job_now.get("PreemptTime", "None")) is not None)


def slurm_time(text: str) -> float | None:
    """A Slurm time stamp (`2026-12-05T16:30:00`, local time) as unix time; None if it is not one."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def chain_history(attempts: Sequence[AttemptRecord]) -> tuple[float, int, float | None]:
    """(seconds run, failures, mean restart seconds or None) of the attempts that ended:
    what `checkpoint_every: auto` needs from this chain. A restart is from the fault
    (its end, less the time it took to be found) to the next attempt's start."""
    ended = [a for a in attempts if a.ended != "running" and a.started_at]
    run_s = sum(max(0.0, float(a.ended_at or a.started_at or 0) - float(a.started_at or 0)) for a in ended)
    failures = sum(1 for a in ended if a.ended in FAILURES)
    gaps = []
    for index in range(1, len(attempts)):  # Python 3.8: no itertools.pairwise
        before, after = attempts[index - 1], attempts[index]
        if before.ended in FAILURES and before.ended_at and after.started_at:
            gaps.append(float(after.started_at) - float(before.ended_at) + float(before.detected_after_s or 0))
    return run_s, failures, (sum(gaps) / len(gaps) if gaps else None)


def earlier_history(records: Iterable[ChainRecord], nodes: int) -> tuple[float, int]:
    """(seconds run, failures) of the user's earlier chains, as if they ran at `nodes`
    nodes: N nodes fail N times as often as one, so an attempt's seconds count in node
    seconds (its nodes over `nodes`)."""
    run_s, failures = 0.0, 0
    for rec in records:
        for attempt in rec.attempts:
            try:
                width = len(NodeSet(attempt.nodes))
            except ValueError:
                continue
            seconds, failed, _ = chain_history([attempt])
            run_s += seconds * width / max(1, nodes)
            failures += failed
    return run_s, failures
