"""The loaded documents: a resolved profile and a validated job file, each with
where its keys came from (FILE:LINE). config.load builds them; everything after it
reads them."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_kit.config.yamlfile import KeyPath, nearest


@dataclass
class Profile:
    """A fully resolved profile: extends merged, defaults filled, `extends` removed.

    `chain` is the files merged, this one first. `origins` maps each key path of
    `data` that came from a file to `FILE:LINE` (defaults have none).
    """

    name: str
    path: Path
    data: dict[str, Any]
    chain: list[Path] = field(default_factory=list)
    origins: dict[KeyPath, str] = field(default_factory=dict)

    def where(self, *path: Any) -> str:
        """`FILE:LINE` of a key path, or of its nearest ancestor that has one."""
        return _where(self.origins, tuple(path), self.path)


@dataclass
class Job:
    """A validated job file with its resolved profile.

    `data` holds every key of the job spec (defaults filled; `name` defaults to
    the file stem). `origins` maps key paths of the job file to `FILE:LINE`.
    """

    name: str
    path: Path
    data: dict[str, Any]
    profile: Profile
    origins: dict[KeyPath, str] = field(default_factory=dict)

    def where(self, *path: Any) -> str:
        """`FILE:LINE` of a key path of the job file."""
        return _where(self.origins, tuple(path), self.path)


def _where(origins: Mapping[KeyPath, str], path: KeyPath, default: Path) -> str:
    where = nearest(origins, path)
    return f"{default}:1" if where is None else where
