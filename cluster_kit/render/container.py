"""A job's `container:` -> what its srun steps need to run inside the image.

Pure, like the rest of render/. Two runtimes:

- pyxis (srun's `--container-*` flags, enroot underneath): the batch script stays
  on the host and every srun step carries the flags. pyxis hands the job's
  environment to the container but lets the image's own values win (NGC images
  set NCCL_* and MASTER_* defaults); the names in `--container-env` keep the
  host's value, so every variable the script exports goes there.
- Apptainer: `apptainer exec --nv --bind ... IMAGE` inside each srun task; the
  `APPTAINERENV_<NAME>` copies of the exported variables win over the image's.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cluster_kit.render.quoting import shq

# Exported by the rendezvous partial for every launcher.
RENDEZVOUS_NAMES = ("MASTER_ADDR", "MASTER_PORT")


def exported_names(settings: Mapping[str, Any], nccl_env: Iterable[str]) -> list[str]:
    """Every variable the rendered script exports for the training processes, in order."""
    names = [*RENDEZVOUS_NAMES, *nccl_env, *((settings.get("environment") or {}).get("env") or {})]
    if settings.get("cuda_graphs"):
        names.append("CLUSTERKIT_CUDA_GRAPHS")
        if settings.get("cuda_graphs_compile"):
            names.append("CLUSTERKIT_CUDA_GRAPHS_COMPILE")
    names += (settings.get("container") or {}).get("env") or []
    return list(dict.fromkeys(str(name) for name in names))


def pyxis_flags(container: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """srun's pyxis options for one step."""
    flags = [f"--container-image={container['image']}"]
    if container.get("mounts"):
        flags.append("--container-mounts=" + ",".join(container["mounts"]))
    if container.get("workdir"):
        flags.append(f"--container-workdir={container['workdir']}")
    flags.append("--container-mount-home" if container.get("mount_home") else "--no-container-mount-home")
    if container.get("writable"):
        flags.append("--container-writable")
    names = list(names)
    if names:
        flags.append("--container-env=" + ",".join(names))
    return flags


def apptainer_argv(container: Mapping[str, Any]) -> list[str]:
    """`apptainer exec ...` up to and including the image, before the task's command."""
    argv = ["apptainer", "exec", "--nv"]
    for mount in container.get("mounts") or []:
        argv += ["--bind", mount]
    if container.get("workdir"):
        argv += ["--pwd", container["workdir"]]
    if not container.get("mount_home"):
        argv.append("--no-home")
    if container.get("writable"):
        argv.append("--writable-tmpfs")
    return [*argv, container["image"]]


# Inside an image the probe needs the image's own python3; without one, say so.
_NEEDS_PYTHON3 = (
    'python3 -c "import json, ctypes, resource" 2>/dev/null || { echo "clusterkit: node $(hostname): '
    'the container image has no python3 with its standard library, which the in-job preflight runs '
    'the probe with; add it to the image (e.g. apt-get install -y python3) or set preflight: false" '
    '>&2; exit 1; }; '
)
NO_CONTAINER: dict[str, Any] = {"runtime": None, "image": None, "srun": "", "exec": "", "probe_guard": "", "env_names": []}


def template_context(settings: Mapping[str, Any], nccl_env: Iterable[str]) -> dict[str, Any]:
    """The template's `container`: shell text to splice into srun lines ("" without one,
    so the templates render as before).

    `srun`: the pyxis flags, with a leading space; `exec`: Apptainer's `apptainer
    exec ... IMAGE ` prefix; `probe_guard`: the python3 test before the probe;
    `env_names`: the exported names the container must take from the host.
    """
    container = settings.get("container")
    if not container:
        return dict(NO_CONTAINER)
    names = exported_names(settings, nccl_env)
    runtime = container.get("runtime") or "pyxis"
    apptainer = runtime == "apptainer"
    flags = [] if apptainer else pyxis_flags(container, names)
    prefix = apptainer_argv(container) if apptainer else []
    return {
        "runtime": runtime,
        "image": container["image"],
        "srun": "".join(" " + shq(flag) for flag in flags),
        "exec": "".join(shq(word) + " " for word in prefix),
        "probe_guard": _NEEDS_PYTHON3,
        "env_names": names,
    }
