"""Text for people: tables, the one control-character sanitizer, grouping nodes by outcome."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

Key = TypeVar("Key")


# C0 controls, DEL and C1 controls: what could end a line or start a terminal escape.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(value: Any) -> str:
    """The value with control characters shown as `\\xNN` (no terminal escapes get through)."""
    return CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = []
    for cells in [list(headers)] + rows:
        padded = [c.ljust(w) for c, w in zip(cells[:-1], widths)] + [cells[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def nodes_by(pairs: Iterable[tuple[Key, str]]) -> dict[Key, list[str]]:
    """{key: nodes} from (key, node) pairs: the nodes that share a value, outcome or reason."""
    groups: dict[Key, list[str]] = {}
    for key, node in pairs:
        groups.setdefault(key, []).append(node)
    return groups
