"""This job's nodes as Slurm gave them (stdlib only, Python 3.8+): those an attempt may use,
those handed back to Slurm, and the node of the batch script."""
from __future__ import annotations

from collections.abc import Iterable

from cluster_kit.hostlist import NodeSet
from cluster_kit.supervisor import slurmctl
from cluster_kit.supervisor.attempt import say


class Allocation:
    """The allocation of job `job_id` (`nodelist`: SLURM_JOB_NODELIST); `folder` is where
    scontrol's resize files go, not the job's own folder."""

    def __init__(self, job_id: str, nodelist: str, batch_host: str, folder: str) -> None:
        self.job_id = job_id
        self.nodes = NodeSet.of(slurmctl.hostnames(nodelist))
        self.batch_host = batch_host or next(iter(self.nodes), "")
        self.usable = self.nodes
        self.released = NodeSet()
        self.folder = folder

    def drop(self, nodes: Iterable[str]) -> NodeSet:
        """Train without `nodes` from now on, and hand those Slurm can take back (all but
        the batch script's own) to it; the nodes released."""
        leaving = NodeSet.of(nodes)
        self.usable = self.usable - leaving
        freed = [n for n in leaving if n != self.batch_host and n not in self.released]
        if not freed:
            return NodeSet()
        try:
            released = NodeSet.of(slurmctl.release_nodes(self.job_id, freed, self.folder))
        except RuntimeError as exc:
            say(f"cannot hand {NodeSet.of(freed)} back to Slurm: {exc}")
            return NodeSet()
        self.released = self.released | released
        return released
