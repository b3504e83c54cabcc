"""Text for people: tables, control characters shown as escapes, grouping nodes by outcome."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from cluster_kit.errors import CONTROL_CHARS, escaped

Key = TypeVar("Key")


def printable(value: Any) -> str:
    """The value on one line, every character of the sanitizer (`errors.CONTROL_CHARS`,
    newlines and tabs too) shown as `\\xNN` or `\\uNNNN`: no terminal escape gets through."""
    return CONTROL_CHARS.sub(lambda m: escaped(m.group()), str(value))


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
