"""Effective settings -> the data templates consume (#SBATCH options, NCCL env, tasks)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cluster_kit.config.launch import launch_shape
from cluster_kit.config.vocab import SBATCH_VALUE_KEYS
from cluster_kit.errors import InputError
from cluster_kit.render.quoting import setting_text, shname
from cluster_kit.slurm.builders import SBATCH_OPTION_NAME

# Linux hands out ephemeral ports from 32768 up; a derived port stays below.
LAUNCHERS = ("srun", "torchrun")


MASTER_PORT_BASE = 20000


MASTER_PORT_SPAN = 10000


# ----------------------------------------------------------------------------
# Settings -> data the templates consume


def nccl_environment(network: Mapping[str, Any]) -> dict[str, str]:
    """Map a profile's (job-overridden) network settings to NCCL/GLOO variables.

    Order is fixed: the mapped keys as listed below, then `nccl_env` extras in
    the order given. An extra that names a mapped variable replaces its value.
    """
    env: dict[str, str] = {}
    if network.get("fabric") == "ethernet":
        env["NCCL_IB_DISABLE"] = "1"
    hcas = _hca_text(network.get("ib_hca"))
    if hcas:
        env["NCCL_IB_HCA"] = hcas
    for key, name in (
        ("gid_index", "NCCL_IB_GID_INDEX"),
        ("ib_timeout", "NCCL_IB_TIMEOUT"),
    ):
        if network.get(key) is not None:
            env[name] = setting_text(network[key])
    ifname = network.get("socket_ifname")
    if ifname:
        env["NCCL_SOCKET_IFNAME"] = str(ifname)
        env["GLOO_SOCKET_IFNAME"] = str(ifname)
    if network.get("debug"):
        env["NCCL_DEBUG"] = str(network["debug"])
    for name, value in (network.get("nccl_env") or {}).items():
        env[shname(name)] = _nccl_value(value)
    return env


def _hca_text(hcas: None | str | Sequence[str]) -> str:
    """`[mlx5_0:1, mlx5_3:1]` -> `=mlx5_0:1,mlx5_3:1` (`=` makes NCCL match exactly)."""
    if not hcas:
        return ""
    if isinstance(hcas, str):
        return hcas  # already in NCCL's own syntax (`^mlx5_1`, `=mlx5_0`, ...)
    return "=" + ",".join(str(hca) for hca in hcas)


def _nccl_value(value: Any) -> str:
    """NCCL reads booleans as 1/0."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def sbatch_directives(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The `#SBATCH` options of a job as (long option, value) pairs, in a fixed order.

    A flag option (`--exclusive`) has the value "". Values are raw text; the
    template passes each through `sbatch_value`.
    """
    slurm = settings.get("slurm") or {}
    shape = launch_shape(settings)
    pairs: list[tuple[str, Any]] = [
        ("job-name", settings.get("name")),
        ("nodes", allocated_nodes(settings)),
        ("ntasks-per-node", shape.tasks_per_node),
        ("gpus-per-node", settings.get("gpus_per_node") or None),  # 0: no GPU request at all
    ]
    # cpus-per-task is the shape's: a torchrun task holds the CPUs of all its workers
    pairs += [(key.replace("_", "-"), shape.cpus_per_task if key == "cpus_per_task" else slurm.get(key))
              for key in SBATCH_VALUE_KEYS]
    pairs.append(("exclusive", _flag(slurm.get("exclusive"))))
    pairs += [("output", settings.get("output")), ("chdir", settings.get("workdir"))]
    for option, value in (slurm.get("extra") or {}).items():
        pairs.append((_checked_option(option), _flag(value)))
    return [(option, setting_text(value)) for option, value in pairs if value is not None]


def allocated_nodes(settings: Mapping[str, Any]) -> Any:
    """The nodes the job asks Slurm for: its `nodes`, and its hot spares (`resilience.spare_nodes`)."""
    spares = (settings.get("resilience") or {}).get("spare_nodes") or 0
    nodes = settings.get("nodes")
    return nodes + spares if isinstance(nodes, int) and spares else nodes


def _flag(value: Any) -> Any:
    """true -> "" (a bare flag), false/None -> None (left out), text as is."""
    if value is True:
        return ""
    if value is False:
        return None
    return value


def _checked_option(option: Any) -> str:
    text = str(option)
    if not SBATCH_OPTION_NAME.match(text):
        raise InputError(
            f"slurm.sbatch: {text!r} is not an sbatch long option name",
            fix="write the option without the leading -- in lower case, e.g. mail-type",
        )
    return text
