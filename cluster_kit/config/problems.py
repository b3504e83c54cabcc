"""Problems found while loading, each with its FILE:LINE."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cluster_kit.config import spec
from cluster_kit.config.yamlfile import KeyPath, YamlDoc, YamlError
from cluster_kit.errors import ValidationError, printable


class Problems:
    """`FILE:LINE: message` lines from several files, reported in file order."""

    def __init__(self) -> None:
        self._items: list[tuple[str, int, str]] = []

    def add(self, path: Path, line: int, message: str) -> None:
        """One problem at a file and line."""
        self._items.append((str(path), line, printable(message, keep_newlines=False)))

    def add_doc(self, doc: YamlDoc, problems: Iterable[spec.Problem]) -> None:
        """Schema problems of one loaded file."""
        for key_path, message in problems:
            self.add_key(doc, key_path, message)

    def add_key(self, doc: YamlDoc, key_path: KeyPath, message: str) -> None:
        """A problem at a key: its FILE:LINE, or `--set KEY` when an override set it."""
        source = doc.override_source(key_path)
        if source is not None:
            self._items.append((source, 0, printable(message, keep_newlines=False)))
        else:
            self.add(doc.path, doc.line(key_path), message)

    def add_yaml_error(self, exc: YamlError) -> None:
        """A file that could not be loaded at all, with the fix (validate prints lines only)."""
        self.add(exc.path, exc.line, f"{exc.problem}; {exc.fix}" if exc.fix else exc.problem)

    def count(self) -> int:
        """How many problems so far."""
        return len(self._items)

    def lines(self) -> list[str]:
        """Each problem once, files in the order first met, lines ascending within a file."""
        order: dict[str, int] = {}
        for path, _, _ in self._items:
            order.setdefault(path, len(order))
        ranked = sorted(enumerate(self._items), key=lambda it: (order[it[1][0]], it[1][1], it[0]))
        out = [f"{path}:{line}: {message}" if line else f"{path}: {message}"
               for _, (path, line, message) in ranked]
        return list(dict.fromkeys(out))

    def raise_if_any(self) -> None:
        """ValidationError (exit 2) with every problem, if there are any."""
        if self._items:
            raise ValidationError(self.lines())
