"""What a job with `resilience:` adds to its script: the supervisor and its settings.

The settings are derived, never listed: the effective `resilience:` (every key of the
job file's spec, defaults filled by config/effective.py) goes to the supervisor as one
JSON document (cluster_kit.supervisor.settings), with the job's shape.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster_kit.config.launch import launch_shape


def supervisor_context(settings: Mapping[str, Any]) -> dict[str, Any] | None:
    """`settings` (the supervisor's JSON document) and the zip app's base64 `source`, or
    None without `resilience:`."""
    resilience = settings.get("resilience")
    if resilience is None:
        return None
    from cluster_kit.supervisor.bundle import supervisor_source
    from cluster_kit.supervisor.settings import settings_document

    shape = launch_shape(settings)
    ranks = shape.workers_per_node if settings.get("launcher") == "torchrun" else shape.tasks_per_node
    return {"settings": settings_document(int(settings["nodes"]), int(ranks), dict(resilience)),
            "source": supervisor_source()}
