"""Which rank(s) hold a job up, or failed first, from what the ranks wrote (pure).

A hang: each rank's Flight Recorder says which collective it waits in. The group
where most ranks wait is the one that hangs; the collective most of them wait in
(the later one on a tie) is the one "the others wait in", and a member of that
group not in it is behind: in no collective of the group, or in a different one
(a mismatch), or in another group's. A rank that answered no dump request is behind
too (when any other rank answered). Without that evidence, the ranks with fewer
steps than the others are. Each
blamed rank comes with the innermost frame of its stack in the user's code:

    rank 3 is not in all_reduce #12 that ranks 0-2 wait in; its stack: train.py:88 in load_batch

A crash: the first rank to fail by itself, from the exception and fault files, with
whose fault it is (faults.py: the node's, or the program's with the error's
signature). A rank whose error only says that a peer did not come or went away (a
collective timeout, a closed connection, an aborted communicator, or an abort by
NCCL's watchdog while its Flight Recorder shows it waiting) failed because of another
one. When every rank that failed is such a victim, the Flight Recorder dumps taken
as they failed tell whom they waited for, as in a hang: the rank not in the
collective the others failed in, or one that wrote nothing at all while the others
waited (a hang the collective timeout ended):

    rank 3 (n2) is not in all_reduce #11 that ranks 0-2 waited in: it wrote no
    exception and no Flight Recorder dump; ranks 0-2 failed waiting, rank 0 first: ...

Without such evidence, the victim that failed first is named, as before.

Stdlib only, Python 3.8+: the job's supervisor runs this from a zip app.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .faults import (
    NODE,
    PEER,
    PROGRAM,
    Signature,
    Verdict,
    classify,
    error_signature,
    headline,
    mask,
)
from .flight_recorder import DEFAULT_GROUP, Collective, RankDump, group_order
from .rank_files import ExceptionReport, RankFiles, user_frame

WAITED_FOR = "the others timed out waiting for it in a collective (a hang, which the node is blamed for)"


@dataclass(frozen=True)
class Blame:
    """One rank held responsible, and why."""

    rank: int
    host: str
    reason: str  # "is not in all_reduce #12 that ranks 0-2 wait in"
    where: str  # "train.py:88 in load_batch", or "" without a stack

    def sentence(self) -> str:
        stack = f"; its stack: {self.where}" if self.where else ""
        return f"rank {self.rank} {self.reason}{stack}"


@dataclass(frozen=True)
class Culprit:
    """The verdict on a hang: blamed ranks, their hosts, and the evidence in one line."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    evidence: str
    blames: tuple[Blame, ...] = ()
    waiting_in: Collective | None = None  # the collective the other ranks wait in

    def signature(self) -> Signature | None:
        """What stays the same when the script hangs the same way on other nodes: each
        blamed rank's reason with its numbers masked (the collective's op, not its
        sequence number) and the place its stack stands in the user's code, line
        included. None when a blamed rank left no stack: nothing then says it is the
        script's (a rank stuck outside Python may be a node's driver)."""
        if not self.blames or not all(b.where for b in self.blames):
            return None
        first = self.blames[0]
        key = "; ".join(f"hang: {mask(b.reason)} at {b.where}" for b in self.blames)
        return Signature(f"rank {first.rank} {first.reason}", first.where, key)


@dataclass(frozen=True)
class Stuck:
    """Where the ranks of the hanging group are: the collective most wait in, and the rest."""

    group: str
    target: Collective
    waiting: tuple[int, ...]
    behind: dict[int, str]  # rank -> reason


@dataclass(frozen=True)
class Crash:
    """The rank to blame for a crash, its last lines, and whose fault it is.

    `kind` is ``node`` or ``program`` (faults.py); `why` the rule that said so;
    `signature` a program error's (None for a node fault). `ranks` and `hosts` name
    every blamed rank and its known host, `rank` and `host` the first of them.
    `time` is when the failure showed: the first failing rank's exception or fault.
    """

    rank: int
    host: str
    time: float | None
    last_lines: tuple[str, ...]
    evidence: str
    kind: str = NODE
    why: str = ""
    signature: Signature | None = None
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()


def format_ranks(ranks: Sequence[int]) -> str:
    """``0-4,6-31``: sorted ranks with runs folded."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def find_stuck(dumps: Mapping[int, RankDump]) -> Stuck | None:
    """The hanging group and who is behind in it; None when no rank waits in a collective."""
    best = None
    for group in sorted({g for d in dumps.values() for g in d.group_names()}, key=group_order):
        members = [r for r in sorted(dumps) if group == DEFAULT_GROUP or group in dumps[r].group_names()]
        waiting = {r: c for r, c in ((r, dumps[r].waiting_in(group)) for r in members) if c is not None}
        if waiting and (best is None or (len(waiting), len(members)) > (len(best[2]), len(best[1]))):
            best = (group, members, waiting)
    if best is None:
        return None
    group, members, waiting = best
    counts = Counter((c.seq, c.op) for c in waiting.values())
    key = max(counts, key=lambda k: (counts[k], k[0]))
    target = next(c for c in waiting.values() if (c.seq, c.op) == key)
    at_target = tuple(r for r in members if r in waiting and (waiting[r].seq, waiting[r].op) == key)
    behind = {}
    for rank in members:
        reason = None if rank in at_target else _reason(dumps[rank], target, at_target)
        if reason:
            behind[rank] = reason
    return Stuck(group, target, at_target, behind)


def _reason(dump: RankDump, target: Collective, waiting: Sequence[int]) -> str | None:
    """Why a rank is not in `target` (None when it is past it: then it holds nobody up)."""
    others = f"{target.describe()} that {_ranks_wait(waiting)} in"
    elsewhere = dump.waiting_in(target.group)
    if elsewhere is not None:
        return f"is in {elsewhere.describe()}, not in {others}"
    if dump.last_enqueued(target.group) >= target.seq:
        return None
    other_group = next((c for c in dump.entries if c.group != target.group and not c.finished), None)
    if other_group is not None:
        return f"is not in {others}; it waits in {other_group.describe()}"
    return f"is not in {others}"


def _ranks_word(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _ranks_wait(ranks: Sequence[int]) -> str:
    """``rank 0 waits`` / ``ranks 0-2 wait``."""
    return f"{_ranks_word(ranks)} {'waits' if len(ranks) == 1 else 'wait'}"


def find_culprit(ranks: Mapping[int, RankFiles], world_size: int | None = None) -> Culprit:
    """The rank(s) behind the others in a hang, from their dumps, stacks and heartbeats.

    `world_size` (when known) makes a rank that wrote nothing at all count as silent.
    """
    expected = list(range(world_size)) if world_size else sorted(ranks)
    files = {r: ranks.get(r) or RankFiles(r) for r in expected}
    silent = [r for r in expected if files[r].stack is None and files[r].dump is None]
    if len(silent) == len(expected):
        silent = []  # no rank answered: no dump request was made, or it reached nobody
    stuck = find_stuck({r: f.dump for r, f in files.items() if f.dump is not None})
    reasons: dict[int, str] = dict(stuck.behind) if stuck else {}
    for rank in silent:
        reasons.setdefault(rank, "wrote no stack and no Flight Recorder dump (stuck outside Python, or gone)")
    if not reasons:
        reasons = _fewer_steps(files)
    blames = tuple(_blame(files[r], reasons[r]) for r in sorted(reasons))
    evidence = "; ".join(b.sentence() for b in blames) or _nobody(files, stuck)
    return Culprit(tuple(b.rank for b in blames), tuple(sorted({b.host for b in blames if b.host})),
                   evidence, blames, stuck.target if stuck else None)


def _fewer_steps(files: Mapping[int, RankFiles]) -> dict[int, str]:
    steps = {r: f.steps for r, f in files.items() if f.steps is not None}
    if not steps or min(steps.values()) == max(steps.values()):
        return {}
    most = max(steps.values())
    ahead = [r for r, n in steps.items() if n == most]
    return {r: f"finished {n} steps, {_ranks_word(ahead)} {most}"
            for r, n in steps.items() if n < most}


def _blame(files: RankFiles, reason: str) -> Blame:
    frame = files.stack.where() if files.stack else None
    return Blame(files.rank, files.host, reason, frame.short() if frame else "")


def _nobody(files: Mapping[int, RankFiles], stuck: Stuck | None) -> str:
    if stuck is not None:
        return f"no rank is behind: {_ranks_wait(stuck.waiting)} in {stuck.target.describe()}"
    steps = sorted({f.steps for f in files.values() if f.steps is not None})
    told = f"every rank finished {steps[0]} steps" if len(steps) == 1 else "no step counts"
    return f"no rank is behind: {told} and no rank waits in a collective"


def first_failure(reports: Sequence[ExceptionReport], failed: Mapping[int, RankFiles] | None = None,
                  world_size: int | None = None) -> Crash | None:
    """The rank to blame for a crash, from the ranks' exception and fault files.

    `failed`: each rank's heartbeat and the Flight Recorder dump taken as it failed
    (rank_files.read_failure_files); `world_size` makes a rank that wrote nothing
    count as silent. The first rank that failed by itself is blamed; when every
    rank only failed waiting for others, the one(s) they waited for.
    """
    if not reports:
        return None
    files = dict(failed or {})
    firsts = _first_per_rank(reports)
    verdicts = {r.rank: _verdict(r, files.get(r.rank)) for r in firsts}
    own = [r for r in firsts if verdicts[r.rank].kind != PEER]
    if own:
        first = min(own, key=_when)
        return _crash(first, verdicts[first.rank])
    victims = sorted(firsts, key=_when)
    waited = _waited_for(victims, files, world_size)
    if waited is not None:
        return waited
    first = victims[0]
    return _crash(first, Verdict(NODE, f"{verdicts[first.rank].why}; whom it waited for is not known"))


def _when(report: ExceptionReport) -> tuple[float, int]:
    return (report.time if report.time is not None else float("inf"), report.rank)


def _first_per_rank(reports: Sequence[ExceptionReport]) -> list[ExceptionReport]:
    """Each rank's first failure: a fault after its own exception (a process that
    aborts on its way out, as after a CUDA error) is that exception's aftermath."""
    first: dict[int, ExceptionReport] = {}
    for report in sorted(reports, key=lambda r: (_when(r), r.fault)):
        first.setdefault(report.rank, report)
    return list(first.values())


def _verdict(report: ExceptionReport, files: RankFiles | None) -> Verdict:
    """classify, and a watchdog's abort: a rank aborted (SIGABRT) while its
    Flight Recorder shows it waiting in a collective was taken down by the watchdog
    of its process group, for a peer that did not come."""
    verdict = classify(report)
    dump = files.dump if files is not None else None
    if report.fault and "Aborted" in headline(report) and dump is not None:
        waiting = next((c for c in (dump.waiting_in(g) for g in dump.group_names()) if c is not None), None)
        if waiting is not None:
            return Verdict(PEER, f"aborted while waiting in {waiting.describe()} (its watchdog)")
    return verdict


def _crash(report: ExceptionReport, verdict: Verdict) -> Crash:
    """The crash of the rank that failed by itself (or, without better evidence, first)."""
    frames = report.frames()
    where = f" at {user_frame(frames).short()}" if frames else ""
    what = "died of a fatal signal" if report.fault else "failed"
    host = f" ({report.host})" if report.host else ""
    evidence = f"rank {report.rank}{host} {what} first: {headline(report)}{where}"
    signature = error_signature(report) if verdict.kind == PROGRAM else None
    return Crash(report.rank, report.host, report.time, report.last_lines(), evidence, verdict.kind,
                 verdict.why, signature, (report.rank,), (report.host,) if report.host else ())


def _waited_for(victims: Sequence[ExceptionReport], files: Mapping[int, RankFiles],
                world_size: int | None) -> Crash | None:
    """The rank(s) the failed ones waited for, from the dumps taken as they failed."""
    dumps = {r: f.dump for r, f in files.items() if f.dump is not None}
    stuck = find_stuck_at_failure(dumps)
    if stuck is None:
        return None
    failed = {v.rank for v in victims}
    expected = range(world_size) if world_size else sorted(set(files) | failed)
    reasons = dict(stuck.behind)
    others = f"{stuck.target.describe()} that {_ranks_word(stuck.waiting)} waited in"
    for rank in expected:
        if rank not in dumps and rank not in failed:
            reasons[rank] = f"is not in {others}: it wrote no exception and no Flight Recorder dump"
    reasons.update(_late(dumps, stuck, victims[0]))
    if not reasons:
        return None
    blamed = sorted(reasons)
    hosts = {r: (files[r].host if r in files else "") for r in blamed}
    said = "; ".join(f"rank {r}{f' ({hosts[r]})' if hosts[r] else ''} {reasons[r]}" for r in blamed)
    first = victims[0]
    evidence = (f"{said}; {_ranks_word(sorted(failed))} failed waiting, rank {first.rank} first: "
                f"{headline(first)}")
    return Crash(blamed[0], hosts[blamed[0]], first.time, first.last_lines(), evidence, NODE, WAITED_FOR,
                 None, tuple(blamed), tuple(sorted({h for h in hosts.values() if h})))


def _late(dumps: Mapping[int, RankDump], stuck: Stuck, first: ExceptionReport) -> dict[int, str]:
    """Ranks that entered the collective only after the first victim had failed in
    it: the others waited for them (their clocks are the nodes', synchronised)."""
    if first.time is None:
        return {}
    late = {}
    for rank in stuck.waiting:
        entered = next((c for c in dumps[rank].entries if (c.group, c.seq, c.op) ==
                        (stuck.target.group, stuck.target.seq, stuck.target.op)), None)
        if entered is not None and entered.created_ns / 1e9 > first.time:
            after = entered.created_ns / 1e9 - first.time
            late[rank] = (f"entered {stuck.target.describe()} {after:.1f} s after rank {first.rank} "
                          "failed waiting in it")
    return late


def find_stuck_at_failure(dumps: Mapping[int, RankDump]) -> Stuck | None:
    """Where the ranks were when they failed, from dumps taken at that moment.

    NCCL's dump at its timeout still shows the collective waited in (find_stuck).
    Gloo retires a collective that failed as one that finished, so there the last
    collective each rank entered counts: the one most entered (the later on a tie)
    is the one they waited in; a rank whose last one is older, or another
    collective of the same number, is behind.
    """
    stuck = find_stuck(dumps)
    if stuck is not None:
        return stuck
    best = None
    for group in sorted({g for d in dumps.values() for g in d.group_names()}, key=group_order):
        last = {r: c for r, c in ((r, d.last_entered(group)) for r, d in sorted(dumps.items())) if c is not None}
        if last and (best is None or len(last) > len(best[1])):
            best = (group, last)
    if best is None:
        return None
    group, last = best
    counts = Counter((c.seq, c.op) for c in last.values())
    key = max(counts, key=lambda k: (counts[k], k[0]))
    target = next(c for c in last.values() if (c.seq, c.op) == key)
    waiting = tuple(r for r, c in last.items() if (c.seq, c.op) == key)
    others = f"{target.describe()} that {_ranks_word(waiting)} waited in"
    behind = {}
    for rank, entered in last.items():
        if entered.seq == target.seq and entered.op != target.op:
            behind[rank] = f"is in {entered.describe()}, not in {others}"
        elif entered.seq < target.seq:
            behind[rank] = f"is not in {others}; its last collective was {entered.describe()}"
    return Stuck(group, target, waiting, behind)
