"""What the supervisor of a job is told, read once: one JSON document the batch script hands it.

The job file's spec (``cluster_kit.config.specs.RESILIENCE``) declares the
``resilience:`` keys and their defaults; the renderer writes the effective settings
(every key, defaults filled) into the script as one JSON document; here it becomes a
frozen :class:`Settings`. A key the document holds that :class:`Resilience` does not
know, or one it lacks, stops the supervisor before anything runs: the two sides then
come from different versions of clusterkit.

Stdlib only, Python 3.8+.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

FORMAT = "clusterkit.supervisor-settings/1"


class BadSettings(RuntimeError):
    """The settings document is not one this supervisor reads; nothing was run."""


@dataclasses.dataclass(frozen=True)
class Resilience:
    """A job's ``resilience:``, as the effective settings hold it (docs/reference.md has each key)."""

    max_restarts: int
    hang_timeout: float
    startup_timeout: float | None
    exclude: str
    exclude_on: str
    grace: int
    max_time_requeues: int
    checkpoint_dir: str | None
    spare_nodes: int
    min_nodes: int | None
    checkpoint_every: str | None
    keep_checkpoints: int | None
    mtbf_hours: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The job's shape (nodes without spares, ranks per node) and its ``resilience:``."""

    nodes: int
    tasks_per_node: int
    resilience: Resilience

    @property
    def min_nodes(self) -> int:
        """The fewest nodes an attempt may train on."""
        return self.resilience.min_nodes or self.nodes

    def to_json(self) -> str:
        return settings_document(self.nodes, self.tasks_per_node, self.resilience.to_dict())


def settings_document(nodes: int, tasks_per_node: int, resilience: dict[str, Any]) -> str:
    """The JSON document of a job's supervisor settings (what the renderer writes)."""
    return json.dumps({"format": FORMAT, "nodes": nodes, "tasks_per_node": tasks_per_node,
                       "resilience": dict(resilience)}, sort_keys=True)


def parse_settings(text: str) -> Settings:
    """The settings in a document of :func:`settings_document`; BadSettings naming what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise BadSettings(f"the supervisor's settings are not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BadSettings(f"the supervisor's settings are not a {FORMAT} document: render the job script "
                          "again with this clusterkit")
    given = doc.get("resilience")
    if not isinstance(given, dict):
        raise BadSettings("the supervisor's settings hold no resilience mapping")
    known = [f.name for f in dataclasses.fields(Resilience)]
    unknown, missing = sorted(set(given) - set(known)), sorted(set(known) - set(given))
    if unknown or missing:
        raise BadSettings("the job script's resilience keys ({}) are not this supervisor's ({}): render the "
                          "job script again with this clusterkit".format(
                              ", ".join(unknown) or "none unknown", ", ".join(missing) or "none missing"))
    try:
        return Settings(int(doc["nodes"]), int(doc["tasks_per_node"]), Resilience(**given))
    except (KeyError, TypeError, ValueError) as exc:
        raise BadSettings(f"the supervisor's settings are incomplete: {exc}") from None
