"""What a rank learns from its environment about checkpoints (stdlib only, Python 3.8+).

The supervisor of a job with ``resilience:`` exports these to every rank
(docs/architecture.md, "Checkpoints"); a plain script without it gets the defaults:
attempt 0, no chain, no control folder, and the folder it names itself.

| variable | meaning | without it |
| --- | --- | --- |
| ``CLUSTERKIT_CHECKPOINT_DIR`` | the folder every node sees | the script's ``directory`` |
| ``CLUSTERKIT_ATTEMPT`` | 0, 1, ...: the attempt of the chain | 0 |
| ``CLUSTERKIT_CHAIN_ID`` | the chain's first job id | the control folder's parent's name, else ``""`` |
| ``CLUSTERKIT_CONTROL_DIR`` | where ``checkpoint.json`` goes | no status file |
| ``CLUSTERKIT_CHECKPOINT_EVERY`` | ``auto``, steps, or ``30m`` | ``auto`` |
| ``CLUSTERKIT_KEEP_CHECKPOINTS`` | how many to keep | 3 |
| ``CLUSTERKIT_MTBF_S`` | the job's MTBF estimate, seconds | 5000 h per node / nodes |
| ``CLUSTERKIT_RESTART_S`` | the restart time estimate, seconds | 300 |
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster_kit.trainer import contract

from .interval import DEFAULT_RESTART_S, Every, job_mtbf_s, parse_every

DIR_ENV = contract.CHECKPOINT_DIR_ENV
ATTEMPT_ENV = contract.ATTEMPT_ENV
CHAIN_ENV = contract.CHAIN_ENV
CONTROL_DIR_ENV = contract.CONTROL_DIR_ENV
EVERY_ENV = contract.CHECKPOINT_EVERY_ENV
KEEP_ENV = contract.KEEP_CHECKPOINTS_ENV
MTBF_ENV = contract.MTBF_ENV
RESTART_ENV = contract.RESTART_ENV
DEFAULT_KEEP = 3


@dataclass(frozen=True)
class Settings:
    """One rank's checkpoint settings, read once from the environment."""

    directory: str | None
    attempt: int
    chain: str
    control_dir: str | None
    every: Every
    keep: int
    mtbf_s: float
    restart_s: float
    nodes: int
    rank: int
    world_size: int


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings in ``environ`` (default ``os.environ``); absent ones take their defaults.

    A value that is there but malformed raises ValueError naming the variable.
    """
    env = os.environ if environ is None else environ
    nodes = nodes_from_env(env)
    control_dir = env.get(CONTROL_DIR_ENV, "").strip() or None
    every_text = env.get(EVERY_ENV, "").strip()
    try:
        every = parse_every(every_text) if every_text else Every("auto")
    except ValueError as exc:
        raise ValueError(f"{EVERY_ENV}: {exc}") from None
    return Settings(
        directory=env.get(DIR_ENV, "").strip() or None,
        attempt=_number(env, ATTEMPT_ENV, 0, int),
        chain=env.get(CHAIN_ENV, "").strip() or chain_of(control_dir),
        control_dir=control_dir,
        every=every,
        keep=_number(env, KEEP_ENV, DEFAULT_KEEP, int, low=1),
        mtbf_s=_number(env, MTBF_ENV, job_mtbf_s(nodes), float, low=1),
        restart_s=_number(env, RESTART_ENV, DEFAULT_RESTART_S, float),
        nodes=nodes,
        rank=_first_int(env, ("RANK", "SLURM_PROCID"), 0),
        world_size=_first_int(env, ("WORLD_SIZE", "SLURM_NTASKS"), 1),
    )


def chain_of(control_dir: str | None) -> str:
    """The chain a control folder belongs to: its record folder's name (``clusterkit-<job id>``).

    Every attempt's control folder is ``<record folder>/attempt-<N>``, one record folder
    per chain, so attempts of two chains that share a checkpoint folder are told apart
    even where the chain id itself is not exported.
    """
    if not control_dir:
        return ""
    return os.path.basename(os.path.dirname(os.path.normpath(control_dir)))


def nodes_from_env(env: Mapping[str, str]) -> int:
    """The job's nodes: Slurm's count, else WORLD_SIZE / LOCAL_WORLD_SIZE (torchrun), else 1."""
    slurm = _first_int(env, ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"), 0)
    if slurm > 0:
        return slurm
    world, local = _first_int(env, ("WORLD_SIZE",), 1), _first_int(env, ("LOCAL_WORLD_SIZE",), 0)
    return max(1, world // local) if local > 0 else 1


def _first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        text = env.get(name, "").strip()
        if text.isdigit():
            return int(text)
    return default


def _number(env: Mapping[str, str], name: str, default: float, kind: type, low: float = 0) -> Any:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise ValueError(f"{name}={text!r} is not a {'whole ' if kind is int else ''}number >= {low:g}")
    return value
