"""What the supervisor decides, from what it saw (pure: stdlib only, Python 3.8+).

- HangClock: when each rank last finished a step, and which ranks stalled past
  `hang_timeout`. The clock of a rank starts at its first heartbeat, or at the
  first heartbeat of any rank for one that has none yet; before any rank finished
  a step (imports, rendezvous, loading a checkpoint) the attempt has
  `startup_timeout` (default `max(hang_timeout, STARTUP_S)`). While any rank is
  inside `ddp.paused()` nobody stalls, and every clock starts again when the
  pause ends.
- attempt_end: how an attempt ended (SPEC's words) and who is blamed.
- next_step: restart without the blamed nodes, requeue after the time limit, or
  end the chain, within `max_restarts` / `max_time_requeues`.
"""
import time

from cluster_kit.hostlist import NodeSet

from .record import FAILURES, REQUEUES, count, excluded_nodes

STARTUP_S = 600.0


class HangClock:
    def __init__(self, world_size, hang_timeout, started, startup_timeout=None):
        self.world_size = world_size
        self.hang_timeout = float(hang_timeout)
        self.startup_timeout = float(startup_timeout) if startup_timeout else max(self.hang_timeout, STARTUP_S)
        self.started = started
        self.first_beat = None
        self.progress = {}  # rank -> (steps, unix time of its last finished step)
        self.paused = {}  # rank -> unix time its pause began
        self.resumed = started  # the end of the last pause of any rank

    def observe(self, rank, steps, when, paused_since=None, resumed_at=None):
        """A heartbeat: `steps` finished, the last at `when`; the rank inside
        ddp.paused() since `paused_since`, or its last pause ended at `resumed_at`."""
        if self.first_beat is None and steps > 0:
            self.first_beat = when
        seen = self.progress.get(rank)
        if (seen is None or steps != seen[0]) and steps > 0:
            self.progress[rank] = (steps, max(when, self.started))
        if paused_since is not None:
            self.paused[rank] = paused_since
        else:
            self.paused.pop(rank, None)
        if resumed_at is not None:
            self.resumed = max(self.resumed, resumed_at)

    def since(self, rank):
        """When the rank's clock started: its last finished step, else the first beat,
        and never before the last pause of any rank ended."""
        seen = self.progress.get(rank)
        start = seen[1] if seen else (self.first_beat if self.first_beat is not None else self.started)
        return max(start, self.resumed)

    def stalled(self, now):
        """The ranks that finished no step for longer than allowed, at `now` (none while
        any rank is paused: the others wait for it in a collective)."""
        if self.paused:
            return []
        limit = self.hang_timeout if self.first_beat is not None else self.startup_timeout
        return [r for r in range(self.world_size) if now - self.since(r) > limit]

    def stalled_since(self, ranks):
        return min(self.since(r) for r in ranks) if ranks else self.started


def culprit_of(ranks, hosts, evidence):
    return {"ranks": sorted(ranks), "hosts": sorted({h for h in hosts if h}), "evidence": evidence}


def attempt_end(exit_code, hang=None, grace=False, cancelled=False, crash=None, first_task=None,
                failed_nodes=()):
    """(ended, culprit or None) for an attempt whose launch exited with `exit_code`.

    `hang`: the culprit dict of a diagnosed hang; `crash`: analysis.culprit.Crash from
    the ranks' exception files; `first_task`: slurm.outcome.TaskFailure, srun's first
    own failure; `failed_nodes`: nodes srun or Slurm said failed.
    """
    if cancelled:
        return "cancelled", None
    if hang is not None:
        return "hang", hang
    if grace:
        return "time_limit", None
    if exit_code == 0:
        return "completed", None
    if failed_nodes:
        nodes = sorted(set(failed_nodes))
        return "node_failure", culprit_of([], nodes, "Slurm reports node {} failed".format(", ".join(nodes)))
    if crash is not None:
        return "crash", culprit_of([crash.rank], [crash.host] if crash.host else _task_nodes(first_task),
                                   crash.evidence)
    if first_task is not None:
        return "crash", culprit_of(first_task.tasks, [first_task.node], first_task.describe())
    return "crash", culprit_of([], [], f"the launch exited with {exit_code} and no rank said why")


def _task_nodes(first_task):
    return [first_task.node] if first_task is not None else []


def excludable(culprit, allocated):
    """The culprit with only the hosts Slurm gave the attempt: a host name a rank
    wrote into its files never reaches sbatch's command line by itself."""
    if not culprit:
        return culprit
    return dict(culprit, hosts=[h for h in culprit.get("hosts", []) if h in allocated])


def next_step(record, ended, culprit, resilience, exit_code, partition=(), needed=0):
    """{"action": "restart"|"requeued"|"finish", "exclude": [...], "exit_code": N, "why": "..."}.

    `requeued`: Slurm requeued the job itself (preemption, `scontrol requeue`), so it
    runs again as the same job and nothing is submitted.

    Call it with the attempt that just ended already in `record` (its `ended` set).
    `partition` (the partition's nodes) and `needed` (the job's node count), when
    given, keep enough nodes in: the nodes excluded first come back before the
    ones just blamed.
    """
    excluded = excluded_nodes(record)
    if ended == "completed":
        return _finish(0, "completed")
    if ended == "cancelled":
        return _finish(exit_code or 1, "cancelled")
    if ended in REQUEUES:
        used, allowed = count(record, REQUEUES), int(resilience["max_time_requeues"])
        if used > allowed:
            return _finish(1, f"{_words(ended)}, and max_time_requeues ({allowed}) are used up")
        if ended == "preempted":  # Slurm requeued the job itself: it runs again under its own id
            return {"action": "requeued", "exclude": excluded, "exit_code": exit_code,
                    "why": f"{_words(ended)}: Slurm requeued the job, which runs again as itself "
                           f"({used} of max_time_requeues {allowed})"}
        return {"action": "restart", "exclude": excluded, "exit_code": exit_code,
                "why": f"{_words(ended)}: requeued without blame ({used} of max_time_requeues {allowed})"}
    used, allowed = count(record, FAILURES), int(resilience["max_restarts"])
    if used > allowed:
        return _finish(1, f"{_words(ended)}, and max_restarts ({allowed}) are used up")
    blamed = NodeSet.of((culprit or {}).get("hosts", [])) - NodeSet.of(excluded)
    back = []
    if resilience.get("exclude", "blamed") == "blamed":
        excluded = excluded + list(blamed)
        pool = NodeSet.of(partition)
        while pool and excluded and len(pool - NodeSet.of(excluded)) < needed:
            back.append(excluded.pop(0))
    without = " without {}".format(",".join(excluded)) if excluded else ""
    if back:
        without += f" ({','.join(back)} back in: a {needed}-node job needs them)"
    return {"action": "restart", "exclude": excluded, "exit_code": exit_code or 1,
            "why": f"{_words(ended)}: restart {used} of max_restarts {allowed}{without}"}


def _finish(exit_code, why):
    return {"action": "finish", "exclude": [], "exit_code": exit_code, "why": why}


WORDS = {"hang": "a hang", "crash": "a crash", "node_failure": "a node failure",
         "time_limit": "the time limit", "preempted": "preemption (or scontrol requeue)"}


def _words(ended):
    return WORDS.get(ended, ended)


TIME_SLACK_S = 5.0  # a SIGTERM this close to the job's end time is its time limit


def term_cause(state, restarts_before, restarts_now, seconds_left):
    """Why the batch script got SIGTERM: `requeued` (Slurm requeued the job itself:
    preemption with PreemptMode=REQUEUE, scontrol requeue), `preempted` (preemption
    that does not requeue), `time_limit`, or `cancelled`.

    `state`: scontrol's JobState now; `restarts_*`: its Restarts= before the attempt
    and now; `seconds_left`: to its EndTime (None when unknown).
    """
    if str(restarts_now).isdigit() and str(restarts_before).isdigit() and int(restarts_now) > int(restarts_before):
        return "requeued"
    if state == "PREEMPTED":
        return "preempted"
    if state == "TIMEOUT" or (seconds_left is not None and seconds_left <= TIME_SLACK_S):
        return "time_limit"
    return "cancelled"


def slurm_time(text):
    """A Slurm time stamp (`2026-12-05T16:30:00`, local time) as unix time; None if it is not one."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
