"""One job's checkpoints: save and load whole, fenced, verified, and asynchronous when asked.

The ranks' parts join one checkpoint like this: every rank writes its random number
generators (``rng-rank-<R>.pt``, and its DCP shards when the state is sharded) into
the save's ``.partial-`` folder and fsyncs them; a barrier; then rank 0 writes the
rest (model, optimizer, ...), digests every file into ``manifest.json`` and commits
the folder (store.commit). Rank 0 also decides when the next save is due and
broadcasts it, so that every rank's :meth:`Checkpointer.due` answers alike.

Asynchronous saves copy the state to host memory inside :meth:`Checkpointer.save`
(the step stall) and write it on a background thread, one at a time; the thread is
not a daemon, so the interpreter waits for it at exit, and a save made once
``stop_requested()`` is True blocks until it is committed.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from cluster_kit.trainer import supervision

from . import group, sharded, store
from .fence import Fenced, Token, check_fence, raise_fence
from .interval import Interval, parse_every
from .loading import newest_whole, read_into
from .pace import Pace
from .settings import settings_from_env
from .state import (
    finish_copies,
    kind_of,
    rng_state,
    state_of,
    to_host,
)
from .status import StatusFile
from .writer import Background, Job, saver, write_and_commit

LOG = logging.getLogger("cluster_kit.checkpoint")
RESERVED = ("step", "async_", "rng")


@dataclass
class Loaded:
    """The checkpoint :meth:`Checkpointer.load` resumed from; ``loaded["name"]`` is one saved entry."""

    step: int
    name: str
    path: str
    attempt: int
    state: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.state[key]


def _paused(reason: str) -> Any:
    """The supervisor's hang clock stopped while a save blocks the step (where supervision has it)."""
    pause = getattr(supervision, "paused", None)
    return pause(reason) if callable(pause) else contextlib.nullcontext()


class Checkpointer:
    """Save and load a job's checkpoints in one folder.

    Arguments win over the environment a supervised job sets (settings.py):
    ``directory`` (``CLUSTERKIT_CHECKPOINT_DIR``), ``every`` (``auto``, steps or
    ``"30m"``), ``keep`` (how many to keep). ``async_`` makes saves asynchronous by
    default; ``sharded`` sends models and optimizers through DCP (on by itself for
    FSDP / DTensor models).
    """

    def __init__(self, directory: str | None = None, *, every: str | int | None = None,
                 keep: int | None = None, async_: bool = False, sharded: bool = False,
                 environ: dict[str, str] | None = None) -> None:
        self.settings = settings_from_env(environ)
        chosen = directory or self.settings.directory
        self.directory = os.path.abspath(chosen) if chosen else None
        self.keep = keep if keep is not None else self.settings.keep
        if self.keep < 1:
            raise ValueError(f"keep={keep}: keep at least one checkpoint")
        self.async_ = async_
        self.sharded = sharded
        self.token = Token(self.settings.chain, self.settings.attempt)
        # When to save, and what that is computed from (rank 0's measurements; others' come from it).
        self.pace = Pace(parse_every(every) if every is not None else self.settings.every, self.settings)
        self._status: StatusFile | None = None
        self._prepared = False
        self._pinned: dict[tuple[Any, ...], torch.Tensor] = {}
        self._background = Background(_paused)

    # --- the interval -------------------------------------------------------------------
    every = property(lambda self: self.pace.every)
    step_s = property(lambda self: self.pace.step_s)
    save_s = property(lambda self: self.pace.save_s)
    write_s = property(lambda self: self.pace.write_s)
    last_step = property(lambda self: self.pace.last_step)

    @property
    def interval(self) -> Interval:
        """The interval this process would choose now, with its why."""
        return self.pace.interval

    def due(self, step: int) -> bool:
        """Whether to save after ``step`` finished steps; the same answer on every rank
        (:meth:`Pace.due`: call it once a step, it also measures the step time)."""
        return self.pace.due(step)

    # --- loading ------------------------------------------------------------------------
    def load(self, **targets: Any) -> Loaded | None:
        """Resume from the newest checkpoint that verifies; None when there is none.

        Each target (``model=``, ``optimizer=``, ``scheduler=``, ``scaler=``,
        ``data=``, anything with ``load_state_dict``) is restored in place from the
        entry of its name, and this rank's random number generators are put back.
        A checkpoint that fails verification is set aside (``step-N.corrupt``) with
        a warning, and the one before it is tried. Every rank calls it.
        """
        with _paused("checkpoint load"):
            self._prepare()
            rank, _ = group.rank_and_size()
            name = self._agree_on_newest(rank)
            if name is None:
                self.pace.start_step = 0
                self._tell(interval=self.pace.doc())
                return None
            return self._read(name, targets, rank)

    def _agree_on_newest(self, rank: int) -> str | None:
        """Rank 0 picks (and sets bad ones aside); every rank gets its answer, or its error."""
        choice: tuple[str | None, str] = (None, "")
        if rank == 0:
            try:
                choice = (newest_whole(self._root(), self._tell_add), "")
            except (OSError, store.CheckpointError) as exc:
                choice = (None, f"rank 0 could not read {self._root()}: {exc}")
        name, error = group.broadcast_object(choice)
        if error:
            raise store.CheckpointError(error)
        return name

    def _read(self, name: str, targets: dict[str, Any], rank: int) -> Loaded:
        folder = os.path.join(self._root(), name)
        manifest, state = read_into(folder, targets, rank)
        step = manifest["step"]
        self.pace.resumed(step, manifest)
        self._tell(loaded={"step": step, "name": name}, interval=self.pace.doc())
        LOG.info("resumed from %s (step %d, written by attempt %s)", folder, step, manifest.get("attempt"))
        return Loaded(step, name, folder, int(manifest.get("attempt", 0)), state, manifest)

    # --- saving -------------------------------------------------------------------------
    def save(self, step: int, *, async_: bool | None = None, **state: Any) -> None:
        """Save ``state`` (``model=``, ``optimizer=``, ...) as the checkpoint of ``step``. Every rank calls it.

        Blocking by default; ``async_=True`` (or ``Checkpointer(async_=True)``) returns
        once the state is copied to host memory and writes it in the background. A
        save once ``stop_requested()`` is True always blocks. Raises Fenced when a
        newer attempt has started, and the error of an earlier background write.
        """
        bad = sorted(set(state) & set(RESERVED))
        if bad:
            raise ValueError(f"{', '.join(bad)}: reserved names; save the object under another name")
        began = time.monotonic()
        blocking = not (self.async_ if async_ is None else async_) or supervision.stop_requested()
        self._prepare()
        self._check_fence(step)
        if step == self.last_step:
            return
        rank, world = group.rank_and_size()
        with _paused("checkpoint save") if blocking else contextlib.nullcontext():
            partial = store.make_partial(self._root(), store.partial_name(step, self.token.chain, self.token.attempt))
            on_dcp = {n: o for n, o in state.items() if self._is_sharded(o)}
            if on_dcp:
                sharded.save(on_dcp, os.path.join(partial, sharded.SUBFOLDER))
            store.write_file(partial, f"rng-rank-{rank}.pt", saver(rng_state()))
            group.barrier()
            failure: BaseException | None = None
            next_due = 0
            if rank == 0:
                try:
                    next_due = self._save_on_rank0(step, state, on_dcp, partial, world, began, blocking)
                except BaseException as exc:  # noqa: BLE001 - every rank must hear of it first
                    failure, next_due = exc, -1
            agreed = group.broadcast_int(next_due)  # also: no rank returns before rank 0's part is done
        if failure is not None:
            raise failure
        if agreed < 0:
            raise store.CheckpointError(f"rank 0 could not save step {step}; its output says why")
        self.pace.saved(step, agreed)

    def _save_on_rank0(self, step: int, state: dict[str, Any], on_dcp: dict[str, Any], partial: str,
                       world: int, began: float, blocking: bool) -> int:
        """Write (or copy and hand to the writer) rank 0's part; the step the next save is due."""
        self._background.join()
        self._background.raise_failure()  # the last background write's error, on every rank through save()
        self.pace.measure_step(step, began)
        contents = {n: "sharded" if n in on_dcp else kind_of(o) for n, o in state.items()}
        parts = {n: state_of(o) for n, o in state.items() if n not in on_dcp}
        job = Job(step, partial, parts, contents, world, began, blocking, step_s=self.pace.step_s)
        if blocking:
            self._write(job)
            self._background.raise_failure()
        else:
            job.parts = {n: to_host(v, self._pinned, (n,)) for n, v in parts.items()}
            finish_copies()
            self.pace.save_s = job.stall_s = time.monotonic() - began
            self._background.start(lambda: self._write(job))
        return step + self.interval.steps

    def _write(self, job: Job) -> None:
        """Write rank 0's files, digest every file, commit, prune (on the writer thread when async)."""
        try:
            self._commit(job)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            failure = self._background.failure = self._overtaken(exc)
            if isinstance(failure, Fenced):
                LOG.warning("%s", failure)
                self._tell_add("refused", {"step": job.step, "why": str(failure)})
            else:
                LOG.error("the checkpoint of step %d was not saved: %r", job.step, exc)
                self._tell_add("errors", {"step": job.step, "why": repr(exc)})

    def _overtaken(self, exc: BaseException) -> BaseException:
        """Fenced when a newer attempt started meanwhile (it also removes this one's partial folder)."""
        if isinstance(exc, Fenced):
            return exc
        try:
            check_fence(self._root(), self.token)
        except Fenced as fenced:
            return fenced
        except OSError:
            pass
        return exc

    def _commit(self, job: Job) -> None:
        written = write_and_commit(self._root(), self.token, self.keep, job)
        self.pace.save_s, self.pace.write_s = written.save_s, written.write_s  # as the manifest has them
        self._tell(last={"step": job.step, "name": written.name, "time": written.time}, save_s=self.save_s,
                   write_s=self.write_s, step_s=self.step_s, interval=self.pace.doc())
        LOG.info("checkpoint %s: step stall %.3f s%s", os.path.join(self._root(), written.name), written.save_s,
                 "" if written.write_s is None else f", background write {written.write_s:.3f} s")

    def drain(self) -> None:
        """Block until the background write (if any) is committed; raise its error."""
        self._background.join()
        self._background.raise_failure()

    def wait(self) -> None:
        """:meth:`drain`, after the training loop: with no stop asked, it also tells a
        supervised job's supervisor that training is done (:func:`cluster_kit.ddp.finished`)."""
        self.drain()
        if not supervision.stop_requested():
            supervision.finished()

    @property
    def in_flight(self) -> bool:
        """Whether a background write is still running."""
        return self._background.in_flight

    # --- the folder, the fence and the status -------------------------------------------
    def _root(self) -> str:
        if not self.directory:
            raise store.CheckpointError("no checkpoint folder: pass one (Checkpointer(directory) or "
                                        "checkpoint.configure(directory)) or run under resilience:, "
                                        "which sets CLUSTERKIT_CHECKPOINT_DIR")
        return self.directory

    def _prepare(self) -> None:
        """Once: the folder checked (made when missing), this attempt in the fence, old debris gone."""
        if self._prepared:
            return
        root = self._root()
        store.make_folder(root)
        raise_fence(root, self.token)
        rank, _ = group.rank_and_size()
        if rank == 0:
            store.remove_partials(root, keep_suffix=store.partial_suffix(self.token.chain, self.token.attempt))
            self._status = StatusFile(self.settings.control_dir, attempt=self.token.attempt,
                                      chain=self.token.chain, directory=root, every=str(self.pace.every),
                                      mode="async" if self.async_ else "sync")
        self._prepared = True

    def _check_fence(self, step: int) -> None:
        try:
            check_fence(self._root(), self.token)
        except Fenced as exc:
            LOG.warning("%s", exc)
            self._tell_add("refused", {"step": step, "why": str(exc)})
            raise

    def _is_sharded(self, obj: Any) -> bool:
        kind = kind_of(obj)
        if kind == "module":
            return self.sharded or sharded.is_sharded(obj)
        return kind == "optimizer" and (self.sharded or _has_dtensor(obj))

    def _tell(self, **fields: Any) -> None:
        if self._status is not None:
            self._status.update(**fields)

    def _tell_add(self, key: str, entry: dict[str, Any]) -> None:
        if self._status is not None:
            self._status.add(key, entry)


def _has_dtensor(optimizer: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for g in optimizer.param_groups for p in g["params"])
