"""Where an attempt runs inside the job's allocation (pure: stdlib only, Python 3.8+).

The batch script hands the supervisor its launch line (`srun ... bash -c ...`). With
hot spares (`resilience.spare_nodes`) the allocation holds more nodes than the job
trains on, and after a failure the next attempt is a new job step in the same
allocation: `step_nodes` picks its nodes, `step_argv` makes srun run on exactly them,
and `step_port` gives each attempt its own MASTER_PORT (the last one's store may
still hold its port).
"""
from __future__ import annotations

from collections.abc import Sequence

from cluster_kit.hostlist import NodeSet

# srun options the supervisor sets for a step; the script's own are dropped
STEP_OPTIONS = ("--nodes=", "--ntasks=", "--nodelist=", "--exclude=")


def step_nodes(usable: Sequence[str], nodes: int, min_nodes: int) -> list[str] | None:
    """The nodes of the next attempt: the first `nodes` of `usable` (the allocation's
    nodes that are neither blamed nor failed, in Slurm's order), or all of them when
    fewer are left but at least `min_nodes`; None when the allocation cannot hold it."""
    if len(usable) >= nodes:
        return list(usable[:nodes])
    if len(usable) >= max(1, min_nodes):
        return list(usable)
    return None


def step_argv(launch: Sequence[str], nodes: Sequence[str]) -> list[str]:
    """The launch line run as a step on exactly `nodes`: srun's --nodes, --ntasks (from
    its --ntasks-per-node) and --nodelist replace those the script gave. A launch that
    is not srun is left as it is."""
    if not launch or launch[0].rsplit("/", 1)[-1] != "srun":
        return list(launch)
    first = next((i for i, word in enumerate(launch[1:], 1) if not word.startswith("-")), len(launch))
    options, command = launch[1:first], launch[first:]
    per_node = 1
    for option in options:
        if option.startswith("--ntasks-per-node="):
            per_node = int(option.split("=", 1)[1])
    kept = [o for o in options if not o.startswith(STEP_OPTIONS)]
    return [launch[0], f"--nodes={len(nodes)}", f"--ntasks={len(nodes) * per_node}",
            f"--nodelist={NodeSet.of(nodes)}", *kept, *command]


def step_port(base: str | int, number: int) -> int:
    """MASTER_PORT of the `number`th attempt in this allocation (0: the script's own)."""
    port = int(base) + number
    return port if port <= 65535 else int(base) - number
