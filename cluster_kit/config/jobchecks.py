"""Problems of a job file that need more than its own keys' rules: the job and its
profile together (how many nodes the profile lists), or two keys of the job that
contradict each other (no GPUs, yet a GPU request; a grace not below the time limit).

Each check takes the job file's data as loaded (values may still have the wrong
type: the schema reports those) and returns (key path, message) pairs, reported
at the key's line.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cluster_kit.config import spec, specs, vocab
from cluster_kit.config.validators import asks_no_gpus, time_limit_seconds

if TYPE_CHECKING:
    from cluster_kit.config.documents import Profile


def check_node_count(job: Mapping[str, Any], profile: Profile | None) -> list[spec.Problem]:
    """`nodes:` beyond the profile's explicit `nodes` hostlist can never be allocated.

    Without a hostlist in the profile, its nodes come from `sinfo` at submit time,
    and `validate` stays offline: nothing to compare with here.
    """
    from cluster_kit import hostlist

    wanted, listed = job.get("nodes"), profile.data.get("nodes") if profile else None
    if not isinstance(wanted, int) or isinstance(wanted, bool) or not isinstance(listed, str):
        return []
    resilience = job.get("resilience")
    spares = resilience.get("spare_nodes") if isinstance(resilience, Mapping) else None
    if isinstance(spares, int) and not isinstance(spares, bool) and spares > 0:
        return _spares_fit(wanted, spares, listed, profile)
    try:
        count = len(hostlist.expand(listed))
    except ValueError:
        return []  # the profile's own problem, reported at its line
    if wanted <= count:
        return []
    assert profile is not None
    return [(("nodes",), (f"nodes: {wanted} but profile {profile.name} lists {_nodes(count)} ({listed}); "
                         f"fix: ask for at most {count} (nodes: {count}), or add nodes to the profile's "
                         f"`nodes:` ({profile.where('nodes')})"))]


def _spares_fit(nodes: int, spares: int, listed: str, profile: Profile | None) -> list[spec.Problem]:
    from cluster_kit import hostlist

    try:
        count = len(hostlist.expand(listed))
    except ValueError:
        return []
    if nodes + spares <= count:
        return []
    assert profile is not None
    return [(("resilience", "spare_nodes"), (
        f"nodes: {nodes} and resilience.spare_nodes: {spares} ask for {nodes + spares} nodes but profile "
        f"{profile.name} lists {_nodes(count)} ({listed}); fix: ask for at most {count} in all, or add nodes to "
        f"the profile's `nodes:` ({profile.where('nodes')})"))]


def check_min_nodes(job: Mapping[str, Any]) -> list[spec.Problem]:
    """`resilience.min_nodes` above `nodes`: the job could never go on with fewer."""
    resilience, nodes = job.get("resilience"), job.get("nodes", 1)
    if not isinstance(resilience, Mapping) or not isinstance(nodes, int) or isinstance(nodes, bool):
        return []
    least = resilience.get("min_nodes")
    if not isinstance(least, int) or isinstance(least, bool) or least <= nodes:
        return []
    return [(("resilience", "min_nodes"), (f"resilience.min_nodes: {least} is more than nodes: {nodes}; fix: "
                                           f"give at most {nodes} (the job trains on `nodes`, with fewer only "
                                           "when no spare is left)"))]


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def check_gpu_requests(job: Mapping[str, Any]) -> list[spec.Problem]:
    """A job with `gpus_per_node: 0` that also asks for GPUs (gres gpu, gpus, ...)."""
    slurm: Mapping[str, Any] = job["slurm"] if isinstance(job.get("slurm"), Mapping) else {}
    where = "gpus_per_node" if "gpus_per_node" in job else "slurm.gpus_per_node"
    if not asks_no_gpus(job.get("gpus_per_node", slurm.get("gpus_per_node"))):
        return []
    problems: list[spec.Problem] = []
    for key_path, value in _slurm_options(slurm):
        option = vocab.sbatch_option(str(key_path[-1]).lstrip("-"))
        if option in vocab.GPU_SBATCH_OPTIONS or (
                option == "gres" and vocab.without_gpu_gres(str(value)) != str(value)):
            shown = ".".join(str(part) for part in key_path)
            problems.append((key_path, (f"{shown}: {value!r} asks for GPUs, but {where}: 0 asks for "
                                       "none; remove one of the two")))
    return problems


def _slurm_options(slurm: Mapping[str, Any]) -> list[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every extra sbatch option of a job's `slurm:` section."""
    pairs: list[tuple[tuple[str, ...], Any]] = [
        (("slurm", str(key)), value) for key, value in slurm.items()
        if key != "sbatch" and key not in specs.SLURM_NAMED]
    extra = slurm.get("sbatch")
    if isinstance(extra, Mapping):
        pairs += [(("slurm", "sbatch", str(key)), value) for key, value in extra.items()]
    return [(path, value) for path, value in pairs if value is not None and value is not False]


# sbatch(1), --signal: "the signal may be sent up to 60 seconds earlier than specified".
SIGNAL_EARLY_S = 60


def check_grace(job: Mapping[str, Any], profile: Profile | None) -> list[spec.Problem]:
    """`resilience.grace` at or above the job's time limit: the ranks would be told to
    checkpoint as soon as they start, attempt after attempt; within SIGNAL_EARLY_S of
    it: Slurm may signal the job as it starts, before its batch script can catch it."""
    resilience = job.get("resilience")
    if not isinstance(resilience, Mapping):
        return []
    grace_spec = specs.RESILIENCE.fields["grace"]
    assert isinstance(grace_spec, spec.Field)
    grace = resilience.get("grace", grace_spec.default)
    limit = _time_limit(job, profile)
    if grace_spec.check(grace) is not None or limit is None or grace == 0 or grace + SIGNAL_EARLY_S < limit[0]:
        return []  # a bad grace is the schema's problem, reported at its line
    seconds, source = limit
    given = "grace" in resilience
    where = ("resilience", "grace") if given else ("resilience",)
    said = f"resilience.grace: {grace}{'' if given else ' (the default)'}"
    if grace >= seconds:
        return [(where, (f"{said} is not below the job's time limit of {seconds} seconds ({source}); the ranks "
                        f"would be told to checkpoint as soon as they start; fix: a grace below {seconds} seconds "
                        f"(e.g. grace: {seconds // 2}), or a longer time limit"))]
    smaller = f", or a grace below {seconds - SIGNAL_EARLY_S} seconds" if seconds > SIGNAL_EARLY_S + 1 else ""
    return [(where, (f"{said} is within {SIGNAL_EARLY_S} seconds of the job's time limit of {seconds} seconds "
                    f"({source}); Slurm may send the grace signal up to {SIGNAL_EARLY_S} seconds early, as the "
                    f"job starts, before it can checkpoint; fix: a time limit above {grace + SIGNAL_EARLY_S} "
                    f"seconds{smaller}"))]


def _time_limit(job: Mapping[str, Any], profile: Profile | None) -> tuple[int, str] | None:
    """The job's time limit in seconds and where it is set (the job's `time`, its
    `slurm.time`, else the profile's), or None without a limit."""
    slurm: Mapping[str, Any] = job["slurm"] if isinstance(job.get("slurm"), Mapping) else {}
    if job.get("time") is not None:
        value, source = job["time"], f"time: {job['time']!r}"
    elif slurm.get("time") is not None:
        value, source = slurm["time"], f"slurm.time: {slurm['time']!r}"
    elif profile is not None:
        value = profile.data["slurm"].get("time")
        source = f"the profile's slurm.time: {value!r}, {profile.where('slurm', 'time')}"
    else:
        return None
    seconds = time_limit_seconds(value)
    return None if seconds is None else (seconds, source)


def check_compile(job: Mapping[str, Any]) -> list[spec.Problem]:
    """`cuda_graphs.compile` with both `mode` and `options`: torch.compile takes one of them."""
    graphs = job.get("cuda_graphs")
    chosen = graphs.get("compile") if isinstance(graphs, Mapping) else None
    if not isinstance(chosen, Mapping) or chosen.get("mode") is None or not chosen.get("options"):
        return []
    return [(("cuda_graphs", "compile", "options"),
             ("cuda_graphs.compile.options: torch.compile takes mode or options, not both; move the mode's "
             "settings into options (e.g. max_autotune: true) or drop options"))]
