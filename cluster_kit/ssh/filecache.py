"""Parsed files kept while unchanged: many threads, one parse per file version."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class FileCache(Generic[T]):
    """`get(path)` parses a file once per (mtime, size); a missing file gives `missing(path)`.

    The parse runs under the lock, so concurrent first readers parse once.
    """

    def __init__(self, parse: Callable[[str], T], missing: Callable[[str], T]) -> None:
        self._parse = parse
        self._missing = missing
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int], T]] = {}

    def get(self, path: str) -> T:
        try:
            stat = os.stat(path)
        except OSError:
            return self._missing(path)
        signature = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            cached = self._cache.get(path)
            if cached and cached[0] == signature:
                return cached[1]
            value = self._parse(path)
            self._cache[path] = (signature, value)
            return value
