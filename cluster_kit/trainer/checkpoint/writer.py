"""Rank 0's part of a save: its files, every file's digest, the manifest, the commit.

It runs on the training thread for a blocking save and on the writer thread for an
asynchronous one (then ``parts`` holds copies in host memory, never the live tensors).
"""
from __future__ import annotations

import atexit
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, cast

import torch

from . import sharded, store
from .fence import Token, check_fence


@dataclass
class Job:
    """One save's work for rank 0."""

    step: int
    partial: str  # the save's .partial- folder, where the ranks' own files already are
    parts: dict[str, Any]  # name -> what torch.save writes into <name>.pt
    contents: dict[str, str]  # name -> kind, for the manifest
    world: int
    began: float  # time.monotonic() when save() was called
    blocking: bool
    step_s: float | None = None  # the measured step time, recorded for the next attempt
    stall_s: float | None = None  # an asynchronous save's time in the step (set before it is handed over)


@dataclass(frozen=True)
class Written:
    """A committed checkpoint and what it cost."""

    name: str
    time: float
    save_s: float  # the time the step stalled for it
    write_s: float | None  # an asynchronous save's background write


def write_and_commit(root: str, token: Token, keep: int, job: Job) -> Written:
    """Write rank 0's files, digest the ranks' ones, commit if ``token`` still holds the fence, prune."""
    began_writing = time.monotonic()
    files = {f"{name}.pt": store.write_file(job.partial, f"{name}.pt", saver(value))
             for name, value in job.parts.items()}
    files.update(files_of_ranks(job.partial, job.world))
    write_s = None if job.blocking else time.monotonic() - began_writing
    stall = job.stall_s if job.stall_s is not None else time.monotonic() - job.began
    manifest = store.build_manifest(
        job.step, attempt=token.attempt, chain=token.chain, world_size=job.world, host=socket.gethostname(),
        files=files, contents=job.contents, measured={"step_s": job.step_s, "save_s": stall, "write_s": write_s})
    name = store.commit(root, job.partial, manifest, lambda: check_fence(root, token))
    store.prune(root, keep)
    return Written(name, manifest["time"], stall, write_s)


def files_of_ranks(partial: str, world: int) -> dict[str, dict[str, Any]]:
    """The manifest entries of what the ranks wrote themselves: RNG files and DCP shards."""
    files = {}
    for rank in range(world):
        name = f"rng-rank-{rank}.pt"
        if not os.path.lexists(os.path.join(partial, name)):
            raise store.CheckpointError(f"rank {rank} wrote no random number generators into {partial}")
        files[name] = store.file_entry(os.path.join(partial, name))
    shards = os.path.join(partial, sharded.SUBFOLDER)
    if os.path.isdir(shards):
        for entry in sorted(os.scandir(shards), key=lambda e: e.name):
            files[f"{sharded.SUBFOLDER}/{entry.name}"] = store.file_entry(entry.path)
    return files


def saver(value: Any) -> Callable[[store.DigestWriter], None]:
    """What writes ``value`` with torch.save into a checkpoint file."""
    def fill(writer: store.DigestWriter) -> None:
        torch.save(value, cast(IO[bytes], writer))
    return fill


class Background:
    """Rank 0's writes one at a time on a thread that is no daemon (the interpreter waits
    for it at exit), and the failure it leaves for the training thread to raise."""

    def __init__(self, paused: Callable[[str], Any]) -> None:
        self._paused = paused
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        self._exit_hook = False

    def start(self, work: Callable[[], None]) -> None:
        if not self._exit_hook:
            atexit.register(self._finish_at_exit)
            self._exit_hook = True
        self._thread = threading.Thread(target=work, name="clusterkit-checkpoint")
        self._thread.start()

    def join(self) -> None:
        """Wait for the write in flight, with the hang clock stopped: no step runs meanwhile."""
        if self._thread is not None:
            with self._paused("waiting for the last checkpoint write"):
                self._thread.join()
            self._thread = None

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def raise_failure(self) -> None:
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def _finish_at_exit(self) -> None:
        if self._thread is not None:
            self._thread.join()
