"""YAML loading that remembers where every key and value came from.

`load(path)` returns a `YamlDoc`: the plain data (dicts, lists, scalars) plus a
side table from key paths to line numbers, so every later message can say
`FILE:LINE`. Two YAML 1.1 traps are closed on the way in:

- `time: 04:00:00` would be read as the base-60 integer 14400; here any scalar
  with a colon stays a string, so Slurm times and `mlx5_0:1` survive as written.
- a duplicate key silently overwrites the first one; here it is an error.
"""
from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Union

import yaml

from cluster_kit.errors import InputError
from cluster_kit.yamlhints import hint

KeyPath = tuple[Union[str, int], ...]  # noqa: UP007 - evaluated at runtime on 3.9
_T = TypeVar("_T")

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# Decimal and hex integers only: no base-60 (`1:30`) and no YAML 1.1 octal (`010`).
_INT_RE = re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)$")
_FLOAT_RE = re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*)?\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


class _Loader(yaml.SafeLoader):
    """SafeLoader without base-60 numbers and with duplicate-key detection."""

    yaml_implicit_resolvers = {  # noqa: RUF012 - PyYAML's own class-level table
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base class reports unhashable keys
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key '{key}' (first defined on line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(_INT_TAG, _INT_RE, list("-+0123456789"))
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


class YamlError(InputError):
    """A file that cannot be read or is not a YAML mapping; knows its file and line."""

    def __init__(self, path: Path, line: int, problem: str, fix: str) -> None:
        super().__init__(f"{path}:{line}: {problem}", fix=fix)
        self.path = path
        self.line = line
        self.problem = problem


@dataclass
class YamlDoc:
    """One loaded YAML file: its top-level mapping and the line of every key."""

    path: Path
    data: dict[str, Any]
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line(self, path: KeyPath) -> int:
        """Line of `path`, or of its nearest ancestor that has one (1 for the root)."""
        line = nearest(self.lines, path)
        return 1 if line is None else line

    def where(self, path: KeyPath = ()) -> str:
        """`FILE:LINE` for a key path."""
        return f"{self.path}:{self.line(path)}"


def nearest(table: Mapping[KeyPath, _T], path: KeyPath) -> _T | None:
    """The entry of `path`, or of its nearest ancestor that has one; None if none has."""
    while path:
        if path in table:
            return table[path]
        path = path[:-1]
    return None


def load(path: str | Path) -> YamlDoc:
    """Read and parse one YAML file whose top level must be a mapping."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise YamlError(path, 1, "no such file", fix="check the path") from None
    except UnicodeDecodeError as exc:
        raise YamlError(path, 1, f"not UTF-8 text ({exc.reason})",
                        fix="save the file as UTF-8") from None
    except OSError as exc:
        raise YamlError(path, 1, f"cannot read: {exc.strerror}",
                        fix="check the path and its permissions") from None
    return loads(text, path)


def loads(text: str, path: str | Path = "<string>") -> YamlDoc:
    """Parse YAML text; `path` is only used in messages."""
    path = Path(path)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(path, exc, text) from None
    except yaml.YAMLError as exc:
        raise YamlError(path, 1, str(exc), fix="fix the YAML syntax") from None
    finally:
        loader.dispose()
    if node is None or data is None:
        raise YamlError(path, 1, "the file is empty",
                        fix="write a mapping of keys, e.g. `name: mycluster`")
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a {type(data).__name__}"
        raise YamlError(path, node.start_mark.line + 1, f"the top level is {kind}, not a mapping",
                        fix="write `key: value` lines at the top level")
    lines: dict[KeyPath, int] = {}
    _collect_lines(loader, node, (), lines)
    return YamlDoc(path=path, data=data, lines=lines)


def _yaml_error(path: Path, exc: yaml.MarkedYAMLError, text: str) -> YamlError:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else 1
    problem = exc.problem or "invalid YAML"
    if exc.context and "duplicate key" not in problem:
        started = exc.context_mark.line + 1 if exc.context_mark is not None else line
        where = f" started on line {started}" if started != line else ""
        problem = f"{problem} ({exc.context}{where})"
    if "duplicate key" in problem:
        fix = "remove or rename one of the two keys"
    else:
        fix = hint(text, line, problem) or "fix the YAML syntax (indentation, quotes, `key: value`)"
    return YamlError(path, line, problem, fix=fix)


def _collect_lines(loader: _Loader, node: yaml.Node, path: KeyPath,
                   lines: dict[KeyPath, int]) -> None:
    """Record the line of each mapping key and list item below `node`."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            lines[path + (key,)] = key_node.start_mark.line + 1
            _collect_lines(loader, value_node, path + (key,), lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[path + (index,)] = item.start_mark.line + 1
            _collect_lines(loader, item, path + (index,), lines)
