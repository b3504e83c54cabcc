"""The fence: a checkpoint written by an attempt older than the newest one is refused.

A rank left running on a lost node (or a background write that outlived its attempt)
must not overwrite the state the next attempt resumed from. Every attempt, when it
loads or first saves, writes itself into the checkpoint folder's ``fence`` file
(``{"chain", "attempt", "time", "host", "pid"}``, replaced whole); a save checks
that the fence still names its own attempt when it starts and again right before
its commit rename. Within one chain the higher attempt wins; an attempt of another
chain (the same folder used by a new submission) takes the fence over, so the
newest starter wins. Stdlib only.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

from .store import CheckpointError, read_small, replace_file

FENCE = "fence"


class Fenced(CheckpointError):
    """This attempt is no longer the newest: its saves are refused."""


@dataclass(frozen=True)
class Token:
    """Who may write: one attempt of one chain (``chain`` is ``""`` without a supervisor)."""

    chain: str
    attempt: int

    def __str__(self) -> str:
        return f"attempt {self.attempt}" + (f" of job {self.chain}" if self.chain else "")


def read_fence(root: str) -> Token | None:
    """The attempt the fence names, or None when there is no (readable) fence yet."""
    try:
        data = json.loads(read_small(os.path.join(root, FENCE)))
        return Token(str(data["chain"]), int(data["attempt"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def raise_fence(root: str, token: Token) -> None:
    """Write ``token`` into the fence unless a newer attempt of its chain holds it (Fenced)."""
    current = read_fence(root)
    if current is not None and current.chain == token.chain and current.attempt > token.attempt:
        raise Fenced(refusal(token, current, root))
    if current != token:
        doc = {"chain": token.chain, "attempt": token.attempt, "time": round(time.time(), 3),
               "host": socket.gethostname(), "pid": os.getpid()}
        replace_file(root, FENCE, json.dumps(doc).encode())


def check_fence(root: str, token: Token) -> None:
    """Fenced unless the fence names ``token`` (or none was raised yet)."""
    current = read_fence(root)
    if current is not None and current != token:
        raise Fenced(refusal(token, current, root))


def refusal(token: Token, current: Token, root: str) -> str:
    """The one line a refused save logs and raises."""
    return (f"checkpoint refused: this rank belongs to {token}, but {current} has started since "
            f"(fence in {root}); a rank left from an earlier attempt must not write over the "
            "state the newer attempt resumes from")
