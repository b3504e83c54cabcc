"""YAML loading that remembers where every key and value came from.

`load(path)` returns a `YamlDoc`: the plain data (dicts, lists, scalars) plus a
side table from key paths to line numbers, so every later message can say
`FILE:LINE`. Two YAML 1.1 traps are closed on the way in:

- `time: 04:00:00` would be read as the base-60 integer 14400; here any scalar
  with a colon stays a string, so Slurm times and `mlx5_0:1` survive as written.
- a duplicate key silently overwrites the first one; here it is an error
  naming both lines.

Hostile input is bad input, never a hang, a traceback or a swamped machine: the
file is read by `textfile.read_text_file` (regular files only, 1 MiB, UTF-8, no
control characters, lines up to 10,000 characters), and while composing, before
anything is constructed, a document nested deeper than `MAX_DEPTH` levels, one
that expands to more than `MAX_NODES` keys and values (an alias counts everything
it repeats, so an alias bomb stops early) and an alias used inside the value it
names are refused with their line. A value its tag cannot read (`!!int abc`,
`2020-13-45`) is an error at its line too.
"""
from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Union

import yaml

from cluster_kit.config.textfile import TextFileError, read_text_file
from cluster_kit.config.yamlhints import hint

KeyPath = tuple[Union[str, int], ...]  # noqa: UP007 - evaluated at runtime on 3.9
_T = TypeVar("_T")

MAX_DEPTH = 64
MAX_NODES = 20_000
# What PyYAML's constructors raise on a value their tag cannot read (`!!int x`, `!!float ""`).
_CONSTRUCT_ERRORS = (ValueError, TypeError, LookupError, AttributeError, ArithmeticError)

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# Decimal and hex integers only: no base-60 (`1:30`) and no YAML 1.1 octal (`010`).
_INT_RE = re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)$")
_FLOAT_RE = re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*)?\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


class _Loader(yaml.SafeLoader):
    """SafeLoader without base-60 numbers, with duplicate-key detection and size limits."""

    yaml_implicit_resolvers = {  # noqa: RUF012 - PyYAML's own class-level table
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._expanded = 0  # keys and values so far, each alias counted as what it repeats
        self._open_anchors: dict[str, int] = {}  # anchors being composed -> their line
        self._anchor_sizes: dict[str, int] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        """Compose one node, refusing recursion, nesting and expansion over the limits."""
        event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
        if isinstance(event, yaml.AliasEvent):
            self._check_alias(event)
            self._count(self._anchor_sizes.get(event.anchor or "", 1), event)
            return super().compose_node(parent, index)
        anchor = getattr(event, "anchor", None)
        if self._depth >= MAX_DEPTH:
            raise _composer_error(f"nested more than {MAX_DEPTH} levels deep", event)
        self._count(1, event)
        before = self._expanded
        self._depth += 1
        if anchor is not None:
            self._open_anchors[anchor] = event.start_mark.line + 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open_anchors.pop(anchor or "", None)
        if anchor is not None:
            self._anchor_sizes[anchor] = 1 + self._expanded - before
        return node

    def _check_alias(self, event: yaml.AliasEvent) -> None:
        anchor = event.anchor or ""
        if anchor in self._open_anchors:
            raise _composer_error(f"alias *{anchor} is used inside the value it names "
                                  f"(&{anchor} on line {self._open_anchors[anchor]}), "
                                  "which makes it endless", event)

    def _count(self, nodes: int, event: yaml.Event) -> None:
        self._expanded += nodes
        if self._expanded > MAX_NODES:
            raise _composer_error(f"the file expands to more than {MAX_NODES:,} keys and values "
                                  "(an alias counts every value it repeats)", event)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """Construct a node; a value its tag cannot read is an error at the node's line."""
        try:
            return super().construct_object(node, deep=deep)
        except yaml.YAMLError:
            raise
        except _CONSTRUCT_ERRORS as exc:
            tag = str(node.tag).rsplit(":", 1)[-1]
            shown = repr(node.value) if isinstance(node, yaml.ScalarNode) else "the value"
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {shown} as {tag}: {exc}", node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        if not isinstance(node, yaml.MappingNode):  # `!!set 1`: the base class says so
            return super().construct_mapping(node, deep=deep)
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


def _composer_error(problem: str, event: Any) -> yaml.composer.ComposerError:
    """A composer error at the line where `event` starts."""
    return yaml.composer.ComposerError(None, None, problem, event.start_mark)


_Loader.add_implicit_resolver(_INT_TAG, _INT_RE, list("-+0123456789"))
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


class YamlError(TextFileError):
    """A file that cannot be read or is not a YAML mapping; knows its file and line."""


@dataclass
class YamlDoc:
    """One loaded YAML file: its top-level mapping and the line of every key."""

    path: Path
    data: dict[str, Any]
    lines: dict[KeyPath, int] = field(default_factory=dict)
    # key paths set by overrides (`--set KEY=VALUE`) -> where they came from (`--set KEY`)
    overrides: dict[KeyPath, str] = field(default_factory=dict)

    def override_source(self, path: KeyPath) -> str | None:
        """`--set KEY` when `path` (or the nearest ancestor that has a place) came from an
        override, None when it came from the file."""
        while path:
            if path in self.overrides:
                return self.overrides[path]
            if path in self.lines:
                return None
            path = path[:-1]
        return None

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


def load_value(text: str) -> Any:
    """One value written on a command line (`--set KEY=VALUE`), read as YAML by the
    same rules as the files (`01:00:00` stays text); YamlError at line 1 when it cannot be."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        return loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        raise YamlError(Path("<value>"), 1, exc.problem or "invalid YAML",
                        fix="quote the value to keep it as text") from None
    except (yaml.YAMLError, RecursionError, *_CONSTRUCT_ERRORS) as exc:
        raise YamlError(Path("<value>"), 1, str(exc) or "invalid YAML",
                        fix="quote the value to keep it as text") from None
    finally:
        loader.dispose()


def load(path: str | Path) -> YamlDoc:
    """Read and parse one YAML file whose top level must be a mapping."""
    path = Path(path)
    try:
        text = read_text_file(path)
    except TextFileError as exc:
        raise YamlError(exc.path, exc.line, exc.problem, fix=exc.fix or "check the file") from None
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
    except RecursionError:  # the limits above keep this from happening; a message if it does
        raise YamlError(path, 1, "nested too deeply to read",
                        fix=f"keep the nesting under {MAX_DEPTH} levels") from None
    except _CONSTRUCT_ERRORS as exc:  # a value construct_object did not see (inside a generator)
        raise YamlError(path, 1, f"cannot read a value: {exc}",
                        fix="quote values to keep them as text, and remove tags (!!name)") from None
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


_SYNTAX_FIX = "fix the YAML syntax (indentation, quotes, `key: value`)"
_FIXES = {"ComposerError": "check the anchors (&name) and aliases (*name)",
          "ConstructorError": "quote the value to keep it as text, or write it as its tag expects"}
_PROBLEM_FIXES = (
    ("duplicate key", "remove or rename one of the two keys"),
    ("levels deep", "flatten it: profiles and job files need only a few levels"),
    ("keys and values", "write the values out, with fewer aliases: profiles and jobs need far fewer"),
    ("which makes it endless", "alias a value defined before, outside the one being written"),
    ("duplicate anchor", "give the second anchor another name"),
    ("unhashable key", "use a plain text key"),
    ("could not determine a constructor", "remove the tag (!name): profiles and jobs are plain YAML"),
    ("undefined alias", "define the anchor (&name) before the alias (*name) that uses it"),
)


def _yaml_error(path: Path, exc: yaml.MarkedYAMLError, text: str) -> YamlError:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else 1
    problem = exc.problem or "invalid YAML"
    if exc.context and "duplicate key" not in problem:
        started = exc.context_mark.line + 1 if exc.context_mark is not None else line
        where = f" started on line {started}" if started != line else ""
        problem = f"{problem} ({exc.context}{where})"
    fix = _FIXES.get(type(exc).__name__)
    for phrase, phrase_fix in _PROBLEM_FIXES:
        if phrase in problem:
            fix = phrase_fix
    if fix is None:
        fix = hint(text, line, problem) or _SYNTAX_FIX
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
