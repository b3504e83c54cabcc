"""The trainer's side of a supervised job: heartbeats, the stop signal, dumps on request.

A job with ``resilience:`` runs a supervisor in its batch script that talks to the
ranks only through files in one folder every node sees, ``$CLUSTERKIT_CONTROL_DIR``
(:mod:`cluster_kit.trainer.contract` names them all). Per rank:

* :mod:`.heartbeat`: ``heartbeat/rank-<R>`` at the first :func:`heartbeat` and then at
  most once per ``CLUSTERKIT_HEARTBEAT_INTERVAL`` seconds; a call is a clock read and a
  compare almost always; :func:`paused` writes it at once when a pause begins and ends,
  which stops the supervisor's hang clock for a save or an evaluation (for at most
  ``max_s``);
* :mod:`.stop`: the ``stop`` file (and SIGUSR1, or SIGTERM: the time limit, preemption)
  turn :func:`stop_requested` True, noted once in ``stopped/rank-<R>``; ``finished/rank-<R>``
  once the script reports that training is done (:func:`finished`,
  :func:`cluster_kit.checkpoint.wait` with no stop asked, or the normal exit of a
  process that ran ``build_step`` and was never told to stop): an attempt that stopped
  without finishing is requeued, never counted as completed;
* :mod:`.dumps`: a new id in ``dump-request`` makes the rank write its Python stacks,
  its Flight Recorder history as JSON and then a ``.done`` marker; an uncaught exception
  writes ``exceptions/rank-<R>.txt`` and its Flight Recorder beside it, and
  faulthandler writes fatal signals to ``faults/rank-<R>.txt``;
* :mod:`.link`: :class:`Supervision` ties them to one rank and polls the folder from a
  daemon thread.

Every file names the rank's node as Slurm does (``SLURMD_NODENAME``, set in every
task), else its host name: the supervisor excludes nodes by their Slurm names.

Without ``CLUSTERKIT_CONTROL_DIR`` every call is a cheap no-op. Stdlib only: torch's
Flight Recorder is read through ``sys.modules``. The module state (the rank's one
:class:`Supervision`) lives here, once, however the trainer is imported;
``cluster_kit.ddp`` re-exports the public calls.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from cluster_kit.trainer import contract
from cluster_kit.trainer.supervision.environment import (
    interval_from_env,
    node_from_env,
    rank_from_env,
)
from cluster_kit.trainer.supervision.files import log_once
from cluster_kit.trainer.supervision.heartbeat import DEFAULT_PAUSE_MAX_S
from cluster_kit.trainer.supervision.link import Supervision

__all__ = ["DEFAULT_PAUSE_MAX_S", "Supervision", "enable_supervision", "finish_at_exit", "finished", "heartbeat",
           "interval_from_env", "node_from_env", "paused", "rank_from_env", "stop_requested"]


class _Off:
    """What the calls talk to without ``CLUSTERKIT_CONTROL_DIR``: nothing."""

    stop = False

    def beat(self) -> None:
        pass

    def pause(self, reason: str, max_s: float = DEFAULT_PAUSE_MAX_S) -> None:
        pass

    def resume(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def finish_at_exit(self) -> None:
        pass


_OFF = _Off()
_ACTIVE: Any = None  # Supervision, _OFF, or None before the first call
_ENABLE_LOCK = threading.Lock()


def enable_supervision(environ: Mapping[str, str] | None = None) -> Supervision | None:
    """Start this rank's supervision when ``CLUSTERKIT_CONTROL_DIR`` is set (once).

    The first :func:`heartbeat` and ``build_step`` call it; a script may call it
    earlier so that a hang before the first step can be diagnosed too. Returns
    the rank's :class:`Supervision`, or None when the job is not supervised.
    """
    global _ACTIVE
    with _ENABLE_LOCK:
        if _ACTIVE is None:
            env = os.environ if environ is None else environ
            folder = env.get(contract.CONTROL_DIR_ENV, "").strip()
            _ACTIVE = _start(folder, env) if folder else _OFF
    return _ACTIVE if isinstance(_ACTIVE, Supervision) else None


def _start(folder: str, env: Mapping[str, str]) -> Any:
    link = Supervision(folder, rank_from_env(env), interval_from_env(env), node_from_env(env))
    try:
        link.start()
    except OSError as exc:
        log_once(f"supervision is off: cannot use {contract.CONTROL_DIR_ENV}={folder}: {exc}")
        return _OFF
    return link


def _link() -> Any:
    if _ACTIVE is None:
        enable_supervision()
    return _ACTIVE


def heartbeat() -> None:
    """Report one finished training step to the job's supervisor (no-op when unsupervised).

    ``build_step``'s steps call it by themselves; any other loop calls it once a step.
    """
    (_ACTIVE or _link()).beat()


def stop_requested() -> bool:
    """True once the job was asked to stop (time limit or preemption ahead).

    The script then saves a checkpoint and returns normally; the job is requeued.
    """
    return bool((_ACTIVE or _link()).stop)


def finished() -> None:
    """Report that training is done (no-op when unsupervised).

    An attempt whose ranks were told to stop (the time limit, preemption) and exited
    without this report is requeued to go on from its checkpoint; with it, the chain
    is completed. :func:`cluster_kit.checkpoint.wait` reports it when no stop was asked.
    """
    _link().finish()


def finish_at_exit() -> None:
    """At the process's normal exit, report :func:`finished` unless a stop was asked
    (``build_step`` calls it: a loop that ran out of steps is done)."""
    _link().finish_at_exit()


@contextlib.contextmanager
def paused(reason: str = "paused", max_s: float = DEFAULT_PAUSE_MAX_S) -> Iterator[None]:
    """Stop the job's hang clock while the block runs (a checkpoint save, an evaluation).

    While any rank is inside, no rank counts as hung; when the last one leaves, every
    rank's clock starts again from then. A pause longer than ``max_s`` seconds (default
    30 minutes: a save stuck on a hung file system) is a hang after all, and the
    diagnosis names ``reason``. A no-op when the job is not supervised.
    """
    link = _link()
    link.pause(reason, max_s)
    try:
        yield
    finally:
        link.resume()
