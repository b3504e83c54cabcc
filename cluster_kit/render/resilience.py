"""What a job with `resilience:` adds to its script: the supervisor and its options."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OPTIONS = (("max_restarts", "--max-restarts"), ("hang_timeout", "--hang-timeout"),
           ("startup_timeout", "--startup-timeout"), ("exclude", "--exclude"), ("exclude_on", "--exclude-on"),
           ("grace", "--grace"), ("max_time_requeues", "--max-time-requeues"),
           ("checkpoint_dir", "--checkpoint-dir"), ("spare_nodes", "--spare-nodes"), ("min_nodes", "--min-nodes"),
           ("checkpoint_every", "--checkpoint-every"), ("keep_checkpoints", "--keep-checkpoints"),
           ("mtbf_hours", "--mtbf-hours"))


def supervisor_args(resilience: Mapping[str, Any]) -> list[str]:
    """The supervisor's options for the job's `resilience:` settings (unset ones left out)."""
    args: list[str] = []
    for key, option in OPTIONS:
        if resilience.get(key) is not None:
            args += [option, str(resilience[key])]
    return args


def supervisor_context(settings: Mapping[str, Any]) -> dict[str, Any] | None:
    """`args` and the zip app's base64 `source`, or None without `resilience:`."""
    resilience = settings.get("resilience")
    if resilience is None:
        return None
    from cluster_kit.supervisor.bundle import supervisor_source

    return {"args": supervisor_args(resilience), "source": supervisor_source()}
