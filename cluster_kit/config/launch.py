"""How a job's processes sit on a node: the one owner of tasks, workers and CPUs.

Pure and tiny (it imports only config/validators.py), so both config/ and render/ use
it and `clusterkit render` stays fast.

- srun starts one Slurm task per training process (one per GPU by default);
  each task gets `slurm.cpus_per_task` CPUs.
- torchrun starts one Slurm task per node, whose agent runs `nproc_per_node`
  workers; that one task gets `cpus_per_task x nproc_per_node` CPUs, so each
  worker has as many as it would under srun.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster_kit.config.validators import gpu_count


@dataclass(frozen=True)
class LaunchShape:
    """Per node: Slurm tasks, training processes, and CPUs of each Slurm task."""

    tasks_per_node: int
    workers_per_node: int
    cpus_per_task: int | None


def default_tasks_per_node(launcher: str | None, gpus_per_node: Any) -> int:
    """One task per GPU with srun (one without GPUs), one per node with torchrun."""
    if launcher == "srun" and gpus_per_node:
        return gpu_count(gpus_per_node)
    return 1


def launch_shape(settings: Mapping[str, Any]) -> LaunchShape:
    """The shape of effective job settings (`launcher`, `gpus_per_node`,
    `ntasks_per_node`, `slurm.cpus_per_task`)."""
    launcher = settings.get("launcher")
    gpus = settings.get("gpus_per_node")
    tasks = int(settings.get("ntasks_per_node") or default_tasks_per_node(launcher, gpus))
    workers = gpu_count(gpus) if gpus else tasks
    cpus = (settings.get("slurm") or {}).get("cpus_per_task")
    if launcher == "torchrun":  # one agent per node; ntasks_per_node there counts workers
        return LaunchShape(1, workers, int(cpus) * workers if cpus else None)
    return LaunchShape(tasks, workers, int(cpus) if cpus else None)
