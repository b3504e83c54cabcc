"""The all-reduce sweep as a Slurm job: the job's resources, the sweep embedded.

The sweep script (`allreduce_sweep.py`, torch + stdlib) travels inside the sbatch
script, so nothing but torch has to be installed on the nodes.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster_kit.errors import InputError

if TYPE_CHECKING:
    from cluster_kit.config.effective import Effective

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MIN_BYTES = 8  # the sweep's --min-bytes default: two float32 elements


def parse_size(text: str) -> int:
    """`64M` -> 67108864; plain numbers are bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise InputError(f"--max-bytes {text!r} is not a size", fix="write a size such as 8, 64M or 4G")
    size = int(match.group(1)) * SIZE_UNITS[match.group(2).upper()]
    if size < MIN_BYTES:
        raise InputError(f"--max-bytes {text!r} is below the smallest message of the sweep ({MIN_BYTES} bytes)",
                         fix="write a size such as 8, 64M or 4G")
    return size


def sweep_settings(settings: Effective) -> Effective:
    """The job's settings, launched with srun (one task per GPU) and no in-job preflight."""
    out = settings.copy()
    out["launcher"], out["preflight"], out["name"] = "srun", False, f"{settings['name']}-allreduce"
    if settings["launcher"] == "torchrun":
        out["ntasks_per_node"] = None
    return out


def build_sweep_context(max_bytes: str | None) -> dict[str, Any]:
    """Template variables of `allreduce.j2`: the sweep source and its arguments."""
    from cluster_kit.render.environment import build_heredoc

    source = (Path(__file__).parent.parent / "node" / "allreduce_sweep.py").read_text()
    args = ["--max-bytes", str(parse_size(max_bytes))] if max_bytes else []
    return {"sweep": build_heredoc(source, "CLUSTERKIT_SWEEP"), "sweep_args": args}


def on_nodes(settings: Effective, nodes: list[str]) -> Effective:
    """The sweep's settings on exactly these nodes (one narrowing run of --find-slow)."""
    from cluster_kit.hostlist import fold

    out = settings.copy()
    out["nodes"], out["slurm"] = len(nodes), dict(settings["slurm"], nodelist=fold(nodes), exclude=None)
    return out


def render_allreduce(app: Any, job: Any, max_bytes: str | None, nodes: list[str] | None = None) -> str:
    """The sbatch script of the sweep with the resources of `job` (on `nodes` when given)."""
    from cluster_kit.config.effective import effective
    from cluster_kit.render.environment import render_job

    settings = sweep_settings(effective(job, supervised=False))
    if nodes:
        settings = on_nodes(settings, nodes)
    return render_job(settings, app.search.template_dirs(), template="allreduce",
                      extra=build_sweep_context(max_bytes))
