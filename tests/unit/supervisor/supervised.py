"""Short ways to state the supervisor's inputs in tests: heartbeats, what was seen of an
attempt's end, the record so far, and the next step as the plain mapping it reads as."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from cluster_kit.supervisor import decide, record
from cluster_kit.supervisor.record import AttemptRecord, ChainRecord
from cluster_kit.trainer.contract import Heartbeat


def observe(clock: decide.HangClock, rank: int, steps: int, when: float, **pause: Any) -> None:
    """A heartbeat of `rank`: `steps` finished, the last at `when`; `pause`: paused_since,
    resumed_at, pause_max_s, pause_reason."""
    clock.observe(rank, Heartbeat(steps, when, f"n{rank}", 1000 + rank, **pause))


def end_of(exit_code: int | None, **seen: Any) -> tuple[str, dict[str, Any] | None]:
    """decide.attempt_end with what was seen given as keywords (decide.Evidence's fields)."""
    if "failed_nodes" in seen:
        seen["failed_nodes"] = tuple(seen["failed_nodes"])
    return decide.attempt_end(exit_code, decide.Evidence(**seen))


def step(rec: ChainRecord, ending: str, culprit: dict[str, Any] | None, resilience: dict[str, Any],
         exit_code: int | None, **room: Any) -> dict[str, Any]:
    """decide.next_step as a plain mapping; `room`: partition, needed, requeued."""
    requeued = room.pop("requeued", True)
    if "partition" in room:
        room["partition"] = tuple(room["partition"])
    made = decide.next_step(rec, decide.Ending(ending, culprit, exit_code, requeued), resilience,
                            decide.Room(**room) if room else None)
    return dataclasses.asdict(made)


def chain(resilience: dict[str, Any], *endings: tuple[str, Iterable[str]]) -> ChainRecord:
    """Job 7's record with an attempt per (ended, nodes it excluded)."""
    rec = record.new_record("7", resilience)
    for number, (how, excluded) in enumerate(endings):
        rec.attempts.append(AttemptRecord(number, "7", ended=how, excluded=list(excluded)))
        rec.exclude = rec.exclude + list(excluded)
    return rec


def attempt(number: int, how: str, culprit: dict[str, Any] | None = None) -> AttemptRecord:
    return AttemptRecord(number, "7", ended=how, culprit=culprit)
