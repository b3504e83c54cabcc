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
        self.paused = {}  # rank -> (unix time its pause began, its max_s or None, its reason)
        self.resumed = started  # the end of the last pause of any rank

    def observe(self, rank, steps, when, paused_since=None, resumed_at=None, pause_max_s=None, pause_reason=""):
        """A heartbeat: `steps` finished, the last at `when`; the rank inside
        ddp.paused(pause_reason, max_s=pause_max_s) since `paused_since`, or its last
        pause ended at `resumed_at`."""
        if self.first_beat is None and steps > 0:
            self.first_beat = when
        seen = self.progress.get(rank)
        if (seen is None or steps != seen[0]) and steps > 0:
            self.progress[rank] = (steps, max(when, self.started))
        if paused_since is not None:
            self.paused[rank] = (paused_since, pause_max_s, pause_reason)
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

    def overdue(self, now):
        """{rank: (reason, seconds paused, max_s)} of the pauses past their max_s at `now`."""
        return {r: (reason, now - since, limit) for r, (since, limit, reason) in self.paused.items()
                if limit is not None and now - since > limit}

    def stalled(self, now):
        """The ranks that finished no step for longer than allowed, at `now` (none while
        any rank is paused within its max_s: the others wait for it in a collective)."""
        if len(self.overdue(now)) < len(self.paused):
            return []
        limit = self.hang_timeout if self.first_beat is not None else self.startup_timeout
        return [r for r in range(self.world_size) if now - self.since(r) > limit]

    def stalled_since(self, ranks):
        return min(self.since(r) for r in ranks) if ranks else self.started


NODE_FAULT = "node"
PROGRAM_ERROR = "program"
OUT_OF_MEMORY = "Out Of Memory"  # srun's word for a task the step's memory cgroup OOM-killed
EXCLUDE_ON = ("node_faults", "any_failure")
# The culprit's keys kept in the attempts record (stacks and timing go beside it).
RECORDED = ("ranks", "hosts", "evidence", "kind", "why", "signature", "error", "where", "unmatched_hosts")


def culprit_of(ranks, hosts, evidence, kind=NODE_FAULT, why=""):
    culprit = {"ranks": sorted(ranks), "hosts": sorted({h for h in hosts if h}), "evidence": evidence, "kind": kind}
    if why:
        culprit["why"] = why
    return culprit


def attempt_end(exit_code, hang=None, grace=False, cancelled=False, crash=None, first_task=None,
                failed_nodes=(), now=None, node_of_rank=None, memory=""):
    """(ended, culprit or None) for an attempt whose launch exited with `exit_code`.

    `grace`: the ranks were told to stop for the time limit (and did not report that
    training finished). `memory`: the job's memory per node or CPU as Slurm says it,
    for a task srun says the OOM killer ended (a program error, whatever the ranks
    that lost it wrote).

    `hang`: the culprit dict of a diagnosed hang; `crash`: analysis.culprit.Crash from
    the ranks' exception and fault files (culprit.first_failure); `first_task`:
    slurm.outcome.TaskFailure, srun's first own failure; `failed_nodes`: nodes srun or
    Slurm said failed; `now`: the time the attempt's end was seen, for a crash's
    `detected_after_s`; `node_of_rank`: rank -> its Slurm node, for blamed ranks that
    named none (a rank that hung and wrote nothing).
    """
    if cancelled:
        return "cancelled", None
    if hang is not None:
        return "hang", dict(hang, kind=hang.get("kind", NODE_FAULT))
    if grace:
        return "time_limit", None
    if exit_code == 0:
        return "completed", None
    if failed_nodes:
        nodes = sorted(set(failed_nodes))
        return "node_failure", culprit_of([], nodes, "Slurm reports node {} failed".format(", ".join(nodes)))
    if first_task is not None and first_task.what == OUT_OF_MEMORY and (crash is None or crash.kind != PROGRAM_ERROR):
        return "crash", task_culprit(first_task, memory)  # the others only lost it, or failed waiting for it
    if crash is not None:
        return "crash", crash_culprit(crash, first_task, now, node_of_rank)
    if first_task is not None:
        return "crash", task_culprit(first_task, memory)
    said = f"the launch exited with {exit_code} and no rank said why"
    # Nothing points at a node: the script's own exit (sys.exit in a rank, a launch it broke).
    return "crash", dict(culprit_of([], [], said, PROGRAM_ERROR, "no rank and no node reported a fault"),
                         signature=said, error=said)


def crash_culprit(crash, first_task=None, now=None, node_of_rank=None):
    """The culprit dict of a crash: its ranks and their nodes, whose fault it is and,
    for a program error, its signature (JSON-friendly: the record is JSON)."""
    ranks = list(crash.ranks) or [crash.rank]
    hosts = list(crash.hosts) or ([crash.host] if crash.host else [])
    if not hosts and node_of_rank is not None:
        hosts = [node_of_rank(rank) for rank in ranks]
    if not hosts and first_task is not None and crash.rank in first_task.tasks:
        hosts = [first_task.node]  # srun names the node of the task that failed
    culprit = culprit_of(ranks, hosts, crash.evidence, crash.kind, crash.why)
    if crash.signature is not None:
        culprit.update(signature=crash.signature.key, error=crash.signature.error, where=crash.signature.where)
    if now is not None and crash.time is not None:
        culprit["detected_after_s"] = round(max(0.0, now - crash.time), 1)
    return culprit


def task_culprit(task, memory=""):
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


def recorded_culprit(culprit):
    """What of a culprit goes into the attempts record's `culprit`."""
    return {k: culprit[k] for k in RECORDED if k in culprit}


def on_slurm_names(culprit, names):
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


def excludable(culprit, allocated):
    """The culprit with only the hosts Slurm gave the attempt: a host name a rank
    wrote into its files never reaches sbatch's command line by itself."""
    if not culprit:
        return culprit
    return dict(culprit, hosts=[h for h in culprit.get("hosts", []) if h in allocated])


def next_step(record, ended, culprit, resilience, exit_code, partition=(), needed=0, requeued=True):
    """{"action": "restart"|"requeued"|"finish", "exclude": [...], "exit_code": N, "why": "..."}.

    `requeued`: Slurm requeued the job itself (preemption, `scontrol requeue`), so it
    runs again as the same job and nothing is submitted. A preemption Slurm did not
    requeue (`requeued` False: with a partition's GraceTime the ranks stopped first) is
    restarted as a new job, as the time limit is.

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
        if ended == "preempted" and requeued:  # Slurm requeued the job itself: it runs again under its own id
            return {"action": "requeued", "exclude": excluded, "exit_code": exit_code,
                    "why": f"{_words(ended)}: Slurm requeued the job, which runs again as itself "
                           f"({used} of max_time_requeues {allowed})"}
        return {"action": "restart", "exclude": excluded, "exit_code": exit_code,
                "why": f"{_words(ended, requeued)}: requeued without blame ({used} of max_time_requeues {allowed})"}
    repeated = same_program_error(record, culprit)
    if repeated:
        return _finish(1, repeated)
    used, allowed = count(record, FAILURES), int(resilience["max_restarts"])
    if used > allowed:
        return _finish(1, f"{_words(ended)}, and max_restarts ({allowed}) are used up")
    blamed = NodeSet.of((culprit or {}).get("hosts", [])) - NodeSet.of(excluded)
    back = []
    if excludes(culprit, resilience):
        excluded = excluded + list(blamed)
        pool = NodeSet.of(partition)
        while pool and excluded and len(pool - NodeSet.of(excluded)) < needed:
            back.append(excluded.pop(0))
    without = " without {}".format(",".join(excluded)) if excluded else ""
    if back:
        without += f" ({','.join(back)} back in: a {needed}-node job needs them)"
    if _kind(culprit) == PROGRAM_ERROR and resilience.get("exclude", "blamed") == "blamed" and not excludes(
            culprit, resilience):
        without += "; a program error excludes no node (exclude_on: node_faults)"
    return {"action": "restart", "exclude": excluded, "exit_code": exit_code or 1,
            "why": f"{_words(ended)}: restart {used} of max_restarts {allowed}{without}"}


def excludes(culprit, resilience):
    """Whether the culprit's nodes leave the chain: with `exclude: blamed`, a node
    fault's always, a program error's only with `exclude_on: any_failure`."""
    if resilience.get("exclude", "blamed") != "blamed":
        return False
    return _kind(culprit) != PROGRAM_ERROR or resilience.get("exclude_on", EXCLUDE_ON[0]) == "any_failure"


def _kind(culprit):
    """A culprit's kind; one without (an older record's) was always a node's."""
    return (culprit or {}).get("kind", NODE_FAULT)


def same_as_before(record, culprit):
    """The earlier attempt that failed with the culprit's signature (a program error, or
    a hang with the same stack and collective), else None. Call it with the attempt
    that just ended last in the record."""
    signature = (culprit or {}).get("signature")
    if not signature or not record["attempts"]:
        return None
    return next((a for a in record["attempts"][:-1] if (a.get("culprit") or {}).get("signature") == signature),
                None)


def as_the_scripts(record, culprit):
    """The culprit of a hang that an earlier attempt hung the same way (on other nodes):
    the script's (`kind: program`), so that no more nodes are excluded for it."""
    before = same_as_before(record, culprit)
    if before is None or _kind(culprit) == PROGRAM_ERROR:
        return culprit
    return dict(culprit, kind=PROGRAM_ERROR,
                why=f"attempt {before.get('attempt')} hung the same way: the script's hang, not a node's")


def same_program_error(record, culprit):
    """Why the chain ends when the attempt that just ended (the record's last) failed
    with a program error an earlier attempt had, by signature; else None."""
    if _kind(culprit) != PROGRAM_ERROR:
        return None
    before = same_as_before(record, culprit)
    if before is None:
        return None
    latest = record["attempts"][-1]
    hang = latest.get("ended") == "hang"
    error = culprit.get("error") or culprit["signature"]
    at = f" at {culprit['where']}" if culprit.get("where") else ""
    then, now = before["culprit"].get("hosts") or [], culprit.get("hosts") or []
    numbers = (before.get("attempt"), latest.get("attempt"))
    verb = "hangs" if hang else "fails"
    if then and now and set(then) != set(now):
        return (f"the script {verb} the same way on different nodes: {error}{at} "
                f"(attempt {numbers[0]} on {','.join(then)}, attempt {numbers[1]} on {','.join(now)})")
    where = f" on {','.join(now)}" if then and now else ""
    return f"the script {verb} the same way twice: {error}{at} (attempts {numbers[0]} and {numbers[1]}{where})"


def _finish(exit_code, why):
    return {"action": "finish", "exclude": [], "exit_code": exit_code, "why": why}


WORDS = {"hang": "a hang", "crash": "a crash", "node_failure": "a node failure",
         "time_limit": "the time limit", "preempted": "preemption (or scontrol requeue)"}


def _words(ended, requeued=True):
    return "preemption" if ended == "preempted" and not requeued else WORDS.get(ended, ended)


def term_cause(job_before, job_now):
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


def preempting(job_now):
    """Whether Slurm is preempting the job (`scontrol show job`): its state or reason
    says so, or it set PreemptTime (with a partition's GraceTime the job still RUNs
    while its steps were sent SIGTERM)."""
    state, reason = job_now.get("JobState", ""), job_now.get("Reason", "")
    return (state == "PREEMPTED" or reason.startswith("Preempt")
            or slurm_time(job_now.get("PreemptTime", "None")) is not None)


def slurm_time(text):
    """A Slurm time stamp (`2026-12-05T16:30:00`, local time) as unix time; None if it is not one."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def chain_history(attempts):
    """(seconds run, failures, mean restart seconds or None) of the attempts that ended:
    what `checkpoint_every: auto` needs from this chain. A restart is from the fault
    (its end, less the time it took to be found) to the next attempt's start."""
    ended = [a for a in attempts if a.get("ended") not in (None, "running") and a.get("started_at")]
    run_s = sum(max(0.0, float(a.get("ended_at") or a["started_at"]) - float(a["started_at"])) for a in ended)
    failures = sum(1 for a in ended if a.get("ended") in FAILURES)
    gaps = []
    for index in range(1, len(attempts)):  # Python 3.8: no itertools.pairwise
        before, after = attempts[index - 1], attempts[index]
        if before.get("ended") in FAILURES and before.get("ended_at") and after.get("started_at"):
            found = float(before.get("detected_after_s") or 0)
            gaps.append(float(after["started_at"]) - float(before["ended_at"]) + found)
    return run_s, failures, (sum(gaps) / len(gaps) if gaps else None)


def earlier_history(records, nodes):
    """(seconds run, failures) of the user's earlier chains, as if they ran at `nodes`
    nodes: N nodes fail N times as often as one, so an attempt's seconds count in node
    seconds (its nodes over `nodes`)."""
    run_s, failures = 0.0, 0
    for rec in records:
        for attempt in rec.get("attempts") or []:
            if not isinstance(attempt, dict):
                continue
            try:
                width = len(NodeSet(str(attempt.get("nodes") or "")))
            except ValueError:
                continue
            seconds, failed, _ = chain_history([attempt])
            run_s += seconds * width / max(1, nodes)
            failures += failed
    return run_s, failures
