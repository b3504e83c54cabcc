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

A crash: the first rank to fail, from the exception and fault files. A rank whose
error only says that a peer went away (a closed connection, an aborted
communicator) failed because of another one, so it comes after every rank that
failed by itself.

Stdlib only, Python 3.8+: the job's supervisor runs this from a zip app.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .flight_recorder import DEFAULT_GROUP, Collective, RankDump, group_order
from .rank_files import ExceptionReport, RankFiles, user_frame

# Errors a rank gets when a peer died: the peer is the one to blame.
PEER_ERROR = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|communicator was aborted"
    r"|NCCL communicator|DistNetworkError|remote worker crash|failed to recv|ECONNRESET",
    re.IGNORECASE)


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


@dataclass(frozen=True)
class Stuck:
    """Where the ranks of the hanging group are: the collective most wait in, and the rest."""

    group: str
    target: Collective
    waiting: tuple[int, ...]
    behind: dict[int, str]  # rank -> reason


@dataclass(frozen=True)
class Crash:
    """The first rank to fail and its last lines."""

    rank: int
    host: str
    time: float | None
    last_lines: tuple[str, ...]
    evidence: str


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


def first_failure(reports: Sequence[ExceptionReport]) -> Crash | None:
    """The rank that failed first (one failing by itself before one that lost a peer)."""
    if not reports:
        return None
    first = min(reports, key=lambda r: (bool(PEER_ERROR.search(r.text)),
                                        r.time if r.time is not None else float("inf"), r.rank))
    frames = first.frames()
    where = f" at {user_frame(frames).short()}" if frames else ""
    what = "died of a fatal signal" if first.fault else "failed"
    host = f" ({first.host})" if first.host else ""
    evidence = f"rank {first.rank}{host} {what} first: {_headline(first)}{where}"
    return Crash(first.rank, first.host, first.time, first.last_lines(), evidence)


def _headline(report: ExceptionReport) -> str:
    """The exception line of a traceback (its last unindented line), or a fault's first line."""
    lines = [line for line in report.text.splitlines() if line.strip()]
    if report.fault:
        return lines[0] if lines else "no output"
    unindented = [line for line in lines if not line[0].isspace() and not line.startswith("Traceback")]
    return (unindented[-1] if unindented else lines[-1] if lines else "no traceback")[:300]
