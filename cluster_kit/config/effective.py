"""Effective job settings: what templates and slurm/ consume (docs/architecture.md)."""
from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from cluster_kit.config import jobscript, spec, specs, vocab
from cluster_kit.config.launch import default_tasks_per_node
from cluster_kit.config.search import looks_like_path
from cluster_kit.config.validators import asks_no_gpus
from cluster_kit.trainer import compile_options

if TYPE_CHECKING:
    from cluster_kit.config.documents import Job


_SLURM_KEYS = (*vocab.SBATCH_VALUE_KEYS, "exclusive")


class Effective(TypedDict):
    """The effective settings of a job: the shape every template and submit step reads
    (docs/architecture.md, "Effective job settings"). The nested sections stay dicts:
    their keys are the validated profile's and job file's (config/specs.py)."""

    name: str
    profile_name: str
    nodes: int
    gpus_per_node: int | None
    ntasks_per_node: int | None
    launcher: str
    script: str
    args: list[str]
    workdir: str | None
    output: str | None
    preflight: bool
    cuda_graphs: bool
    cuda_graphs_compile: str | None
    template: str
    master_port: int | None
    slurm: dict[str, Any]
    network: dict[str, Any]
    environment: dict[str, Any]
    expect: dict[str, Any]
    container: dict[str, Any] | None
    resilience: dict[str, Any] | None


def effective(job: Job, supervised: bool = True) -> Effective:
    """The job's settings as templates and slurm/ consume them (docs/architecture.md).

    Job values win over the profile's: `gpus_per_node`, `time`, `slurm`, `nccl`
    (any network key, plus `debug`), `env` (merged over the profile's env).
    `gpus_per_node: 0` asks for no GPUs: the profile's other GPU requests are
    dropped and `expect` no longer demands GPUs (`cpu_job_expect`). A job with
    `resilience:` gets the sbatch options its supervisor needs (`supervised_sbatch`);
    with `supervised` False (the benchmarks, which measure and never restart) it
    runs as if it had none.
    """
    j, p = job.data, job.profile.data
    resilience = effective_resilience(j.get("resilience"), j["workdir"]) if supervised else None
    gpus = _first(j.get("gpus_per_node"), j["slurm"].get("gpus_per_node"),
                  p["slurm"].get("gpus_per_node"))
    return {
        "name": j["name"],
        "profile_name": job.profile.name,
        "nodes": j["nodes"],
        "gpus_per_node": gpus,
        "ntasks_per_node": _tasks_per_node(j, p, gpus),
        "launcher": j["launcher"],
        "script": jobscript.runtime_script(j["script"], j["workdir"], job.path),
        "args": [str(a) for a in j["args"]],
        "workdir": j["workdir"],
        "output": j["output"],
        "preflight": j["preflight"],
        "cuda_graphs": j["cuda_graphs"] is True or isinstance(j["cuda_graphs"], Mapping),
        "cuda_graphs_compile": graphs_compile_env(j["cuda_graphs"]),
        "template": job_template(j["template"], job.path),
        "master_port": j["master_port"],
        "slurm": _effective_slurm(p["slurm"], j["slurm"], j.get("time"), asks_no_gpus(gpus), resilience),
        "network": _effective_network(p["network"], j["nccl"]),
        "environment": _effective_environment(p["environment"], job_environment(job)),
        "expect": cpu_job_expect(p["expect"]) if asks_no_gpus(gpus) else dict(p["expect"]),
        "container": j.get("container"),
        "resilience": resilience,
    }


def job_template(ref: str, job_file: Path) -> str:
    """A template name as is; a template path resolved against the job file's folder."""
    if not looks_like_path(ref, (".j2",)):
        return ref
    path = Path(ref).expanduser()
    return str(path if path.is_absolute() else Path(os.path.abspath(job_file)).parent / path)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _tasks_per_node(job: Mapping[str, Any], profile: Mapping[str, Any], gpus: Any) -> int:
    """Explicit job value; else 1 for torchrun; else the profile's value (unless the job
    changed the GPU count); else one task per GPU."""
    explicit = job["slurm"].get("ntasks_per_node")
    if explicit is not None:
        return int(explicit)
    if job["launcher"] == "torchrun":
        return 1
    job_gpus = _first(job.get("gpus_per_node"), job["slurm"].get("gpus_per_node"))
    if job_gpus is None and profile["slurm"].get("ntasks_per_node") is not None:
        return int(profile["slurm"]["ntasks_per_node"])
    return default_tasks_per_node(job["launcher"], gpus)


def _effective_slurm(profile: Mapping[str, Any], job: Mapping[str, Any], job_time: Any,
                     no_gpus: bool, resilience: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {key: _first(job.get(key), profile.get(key)) for key in _SLURM_KEYS}
    out["time"] = _first(job_time, job.get("time"), profile.get("time"))
    for key in ("mem", "time"):
        out[key] = None if out[key] is None else str(out[key])
    extra = {**_sbatch_extra(profile), **supervised_sbatch(resilience), **_sbatch_extra(job)}
    if no_gpus:
        extra = _without_gpu_requests(extra)
    out["extra"] = {option: value for option, value in extra.items() if value is not None}
    return out


def graphs_compile_env(cuda_graphs: Any) -> str | None:
    """What the job exports as CLUSTERKIT_CUDA_GRAPHS_COMPILE for `cuda_graphs: {compile: ...}`
    (None: nothing, the model is not compiled); build_step reads it back."""
    chosen = cuda_graphs.get("compile") if isinstance(cuda_graphs, Mapping) else None
    if chosen is None or chosen is False:
        return None
    if isinstance(chosen, Mapping):
        chosen = {key: value for key, value in chosen.items() if value is not None}
    return compile_options.env_value(compile_options.compile_options(chosen))


def effective_resilience(resilience: Mapping[str, Any] | None, workdir: str | None) -> dict[str, Any] | None:
    """The job's `resilience:` with every key (None: off). A relative `checkpoint_dir`
    starts at the workdir when the job sets one, else stays as written: where sbatch
    ran, as `output` does."""
    if resilience is None:
        return None
    filled = spec.with_defaults(dict(resilience), specs.RESILIENCE)
    out = {key: filled[key] for key in specs.RESILIENCE.fields}
    folder = out["checkpoint_dir"]
    if folder is not None and workdir and not posixpath.isabs(folder):
        out["checkpoint_dir"] = posixpath.join(workdir, folder)
    return out


def supervised_sbatch(resilience: Mapping[str, Any] | None) -> dict[str, str]:
    """The sbatch options of a job with `resilience:` (dashed, as `slurm.extra`).

    `signal`: USR1 to the batch shell, where the supervisor runs, `grace` seconds
    before the time limit (none with grace 0). `no-kill`: the allocation outlives a
    failed node, so the supervisor can blame it and restart without it, in the same
    allocation. `requeue`: Slurm may requeue the job (a preemption, an admin's `scontrol
    requeue`), and its supervisor goes on with the chain as the same job (the batch
    script's own node failing is the guard's and the standby job's: supervisor/chain.py).
    `open-mode=append`: a requeued job (the same id, the same output file) adds to what
    its earlier attempts wrote, where sbatch would truncate it. The job's own slurm
    options are merged over these; the profile's are not.
    """
    if resilience is None:
        return {}
    out = {"signal": f"B:USR1@{resilience['grace']}"} if resilience["grace"] > 0 else {}
    return {**out, "no-kill": "", "requeue": "", "open-mode": "append"}


def _without_gpu_requests(extra: Mapping[str, str | None]) -> dict[str, str | None]:
    """Extra sbatch options without those that ask for GPUs (a job with gpus_per_node: 0)."""
    out = {option: value for option, value in extra.items() if option not in vocab.GPU_SBATCH_OPTIONS}
    if out.get("gres"):
        out["gres"] = vocab.without_gpu_gres(str(out["gres"])) or None
    return out


# What a job without GPUs no longer expects of its nodes: the GPUs themselves, and
# what only GPU traffic needs (GPUDirect RDMA, libnccl: a CPU job talks over Gloo).
CPU_JOB_DROPPED_EXPECT = ("gpus_per_node", "gpu_model", "min_driver", "xid_window", "peermem", "nccl")


def cpu_job_expect(expect: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's `expect` for a job with `gpus_per_node: 0`: nothing about GPUs, and
    a torch without CUDA will do."""
    out = {key: None if key in CPU_JOB_DROPPED_EXPECT else value for key, value in expect.items()}
    out["torch_cuda"] = False
    return out


def _sbatch_extra(slurm: Mapping[str, Any]) -> dict[str, str | None]:
    """Extra sbatch options of one slurm section, dashed; true -> "" (a bare flag),
    false -> None (switched off, so a job can drop a profile's flag)."""
    named = set(specs.SLURM_NAMED) | {"sbatch"}
    pairs = [(k, v) for k, v in slurm.items() if k not in named]
    pairs += list((slurm.get("sbatch") or {}).items())
    out: dict[str, str | None] = {}
    for key, value in pairs:
        option = vocab.sbatch_option(str(key).lstrip("-"))
        out.pop(option, None)  # a later spelling moves the option to its new place
        out[option] = "" if value is True else None if value is False else str(value)
    return out


def _effective_network(profile: Mapping[str, Any], nccl: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {key: nccl[key] if nccl.get(key) is not None else profile.get(key)
                           for key in specs.NETWORK_FIELDS if key != "nccl_env"}
    out["ib_hca"] = [str(hca) for hca in out.get("ib_hca") or []]
    env = {**(profile.get("nccl_env") or {}), **(nccl.get("nccl_env") or {})}
    out["nccl_env"] = {name: str(value) for name, value in env.items()}
    debug = nccl.get("debug")
    out["debug"] = debug.upper() if isinstance(debug, str) else None
    return out


def job_environment(job: Job) -> dict[str, Any]:
    """The job file's `environment:` with its python resolved (as `script` is: relative
    to the workdir when the job sets one, else to the job file's folder), and its
    top-level `env:` merged over its `environment.env`."""
    own = {key: value for key, value in (job.data.get("environment") or {}).items() if value is not None}
    if own.get("python"):
        start = None if job.data.get("workdir") else os.path.dirname(os.path.abspath(job.path))
        own["python"] = jobscript.interpreter_path(str(own["python"]), start)
    own["env"] = {**(own.get("env") or {}), **(job.data.get("env") or {})}
    return own


def _effective_environment(profile: Mapping[str, Any], job: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's environment with the job's over it: lists and python replaced, env merged."""
    merged = {**profile, **{key: value for key, value in job.items() if key != "env"}}
    env = {**(profile.get("env") or {}), **job["env"]}
    return {
        "modules": [str(m) for m in merged.get("modules") or []],
        "setup": [str(s) for s in merged.get("setup") or []],
        "python": merged.get("python") or "python3",
        "env": {name: str(value) for name, value in env.items()},
    }
