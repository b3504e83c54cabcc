"""Sets of time as sorted, disjoint (start, end) pairs: union, overlap, difference."""
from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

Span = tuple[float, float]


def union(spans: Iterable[Span]) -> list[Span]:
    """The spans merged into sorted, disjoint ones (empty spans dropped)."""
    merged: list[Span] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total(spans: Iterable[Span]) -> float:
    """Length of disjoint spans."""
    return sum(end - start for start, end in spans)


def intersect(a: list[Span], b: list[Span]) -> list[Span]:
    """The time in both of two disjoint sorted span lists."""
    out: list[Span] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(spans: list[Span], start: float, end: float) -> list[Span]:
    """The part of disjoint sorted spans inside [start, end); O(log n) to find them."""
    if end <= start:
        return []
    first = bisect.bisect_left(spans, (start, -math.inf))
    if first > 0 and spans[first - 1][1] > start:
        first -= 1
    last = bisect.bisect_left(spans, (end, -math.inf))
    out = [(max(s, start), min(e, end)) for s, e in spans[first:last]]
    return [(s, e) for s, e in out if e > s]


def subtract(a: list[Span], b: list[Span]) -> list[Span]:
    """The time in `a` and not in `b` (both disjoint and sorted)."""
    out: list[Span] = []
    j = 0
    for start, end in a:
        cursor = start
        while j < len(b) and b[j][1] <= cursor:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out
