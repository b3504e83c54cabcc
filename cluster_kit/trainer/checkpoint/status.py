"""``checkpoint.json`` in the control folder: what the supervisor reads about checkpoints.

Rank 0 replaces the file whole (0600) after its load, after every commit and when a
save is refused or fails. ``status`` and ``diagnose`` print :func:`describe`'s lines.
The format is in docs/architecture.md ("Checkpoints"). Stdlib only, Python 3.8+.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from cluster_kit.trainer import contract

from .store import read_small, replace_file

STATUS_FILE = contract.CHECKPOINT_STATUS
STATUS_FORMAT = "clusterkit.checkpoint-status/1"
MAX_ENTRIES = 20  # set_aside, refused and errors keep their newest entries only
LOG = logging.getLogger("cluster_kit.checkpoint")


class StatusFile:
    """Rank 0's status document, rewritten on every change (from either thread)."""

    def __init__(self, control_dir: str | None, *, attempt: int, chain: str, directory: str,
                 every: str, mode: str) -> None:
        self.control_dir = control_dir
        self.doc: dict[str, Any] = {
            "format": STATUS_FORMAT, "attempt": attempt, "chain": chain, "directory": directory,
            "every": every, "mode": mode, "interval": None, "step_s": None, "save_s": None,
            "write_s": None, "last": None, "loaded": None, "set_aside": [], "refused": [],
            "errors": [],
        }
        self._lock = threading.Lock()
        self._warned = False

    def update(self, **fields: Any) -> None:
        """Set top-level fields and write the file."""
        with self._lock:
            self.doc.update(fields)
            self._write()

    def add(self, key: str, entry: dict[str, Any]) -> None:
        """Append to one of the lists (``set_aside``, ``refused``, ``errors``) and write."""
        with self._lock:
            entries = self.doc[key] + [dict(entry, time=round(time.time(), 3))]
            self.doc[key] = entries[-MAX_ENTRIES:]
            self._write()

    def _write(self) -> None:
        if not self.control_dir:
            return
        self.doc["updated"] = round(time.time(), 3)
        try:
            replace_file(self.control_dir, STATUS_FILE, json.dumps(self.doc, indent=1).encode())
        except OSError as exc:  # the status is for people; training goes on without it
            if not self._warned:
                self._warned = True
                LOG.warning("cannot write %s in %s: %s", STATUS_FILE, self.control_dir, exc)


def read_status(control_dir: str) -> dict[str, Any] | None:
    """The status document of one attempt's control folder, or None."""
    try:
        doc = json.loads(read_small(os.path.join(control_dir, STATUS_FILE)))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == STATUS_FORMAT else None


def describe(doc: dict[str, Any]) -> list[str]:
    """The lines ``status`` and ``diagnose`` print: the interval and why, the last save, trouble."""
    lines = []
    interval = doc.get("interval") or {}
    if interval.get("why"):
        lines.append(f"checkpoints {interval['why']}")
    last = doc.get("last")
    if last:
        cost = f"stall {doc['save_s']:.2f} s" if doc.get("save_s") is not None else ""
        if doc.get("write_s") is not None:
            cost += f", background write {doc['write_s']:.2f} s"
        lines.append(f"last checkpoint: step {last['step']} ({last['name']}{', ' + cost if cost else ''})")
    loaded = doc.get("loaded")
    if loaded:
        lines.append(f"resumed from step {loaded['step']} ({loaded['name']})")
    for entry in doc.get("set_aside") or []:
        lines.append(f"set aside {entry['name']} as {entry['as']}: {entry['why']}")
    for entry in doc.get("refused") or []:
        lines.append(f"refused the save of step {entry['step']}: {entry['why']}")
    for entry in doc.get("errors") or []:
        lines.append(f"the save of step {entry['step']} failed: {entry['why']}")
    return lines
