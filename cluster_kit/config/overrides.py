"""Overrides of a job file's keys: `--set KEY=VALUE` and the Python API's `overrides`.

An override sets one dotted key path of the job file (`slurm.time`, `env.LR`,
`args.1` for an item of a list) before the file is validated, so a typo or a bad
value is reported like one in the file, at `--set KEY` instead of `FILE:LINE`.
Pure: text and data in, data out.
"""
from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cluster_kit.config.yamlfile import KeyPath, YamlDoc, YamlError, load_value
from cluster_kit.errors import InputError

# Keys a job file can spell two ways, where one wins (config/effective.py): an override
# of either drops the other spelling the file has, so that the override is what runs.
SPELLINGS: dict[KeyPath, KeyPath] = {
    ("time",): ("slurm", "time"), ("slurm", "time"): ("time",),
    ("gpus_per_node",): ("slurm", "gpus_per_node"), ("slurm", "gpus_per_node"): ("gpus_per_node",),
}

SET_FIX = "write --set KEY=VALUE with a dotted key of the job file, e.g. --set slurm.time=01:00:00"
SWEEP_FIX = ("write --sweep KEY=V1,V2,... with a dotted key of the job file, e.g. --sweep env.LR=1e-3,3e-4 "
             "(values holding commas as one list: --sweep 'args=[[--lr, 1e-3], [--lr, 3e-4]]')")


@dataclass(frozen=True)
class Override:
    """One key of the job file set from elsewhere: the dotted key, its value, and
    where it came from for messages (`--set slurm.time`)."""

    key: str
    value: Any
    source: str

    @property
    def path(self) -> KeyPath:
        return key_path(self.key, self.source)


def key_path(key: str, source: str = "--set") -> KeyPath:
    """`slurm.time` -> ("slurm", "time"); `args.1` -> ("args", 1). InputError (exit 2) for
    an empty key or an empty part (`slurm..time`)."""
    parts = str(key).split(".")
    if not key or any(not part.strip() for part in parts):
        raise InputError(f"{source}: {key!r} is not a dotted key of the job file", fix=SET_FIX)
    return tuple(int(part) if part.isdigit() else part for part in parts)


def parse_set(text: str, option: str = "--set") -> Override:
    """`KEY=VALUE` from the command line, the value read as YAML (`[a, b]` is a list,
    `01:00:00` text, an empty value null). InputError (exit 2) when it is not one."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    source = f"{option} {key}" if key else option
    if not sep or not key:
        raise InputError(f"{option} {text!r}: expected KEY=VALUE", fix=SET_FIX)
    key_path(key, source)
    try:
        value = load_value(raw)
    except YamlError as exc:
        raise InputError(f"{source}: cannot read {raw!r} as a YAML value: {exc.problem}", fix=exc.fix) from None
    return Override(key, value, source)


def from_mapping(overrides: Mapping[str, Any] | None, what: str = "overrides") -> list[Override]:
    """The Python API's `{"slurm.time": "01:00:00"}`: values taken as given."""
    out = [Override(str(key), value, f"{what}[{str(key)!r}]") for key, value in (overrides or {}).items()]
    for item in out:
        key_path(item.key, item.source)
    return out


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """`KEY=V1,V2,...` of `--sweep`: the key and its values, each read as YAML. Values
    that hold commas are given as one YAML list, `KEY=[V1, V2, ...]`
    (`--sweep 'env.NCCL_ALGO=["Ring,Tree", Ring]'`, `--sweep 'args=[[--lr, 1e-3], [--lr, 3e-4]]'`)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not raw.strip():
        raise InputError(f"--sweep {text!r}: expected KEY=V1,V2,...", fix=SWEEP_FIX)
    key_path(key, f"--sweep {key}")
    listed, problem = _yaml_list(raw)
    if listed is not None:
        if not listed:
            raise InputError(f"--sweep {key}: {raw.strip()!r} lists no values", fix=SWEEP_FIX)
        return key, listed
    try:
        return key, [parse_set(f"{key}={part}", "--sweep").value for part in raw.split(",")]
    except InputError:
        if problem is None:
            raise
        raise InputError(f"--sweep {key}: cannot read {raw.strip()!r} as a YAML list of values: {problem}",
                         fix="write the values as one YAML list, e.g. --sweep 'args=[[--lr, 1e-3], [--lr, 3e-4]]'",
                         ) from None


def _yaml_list(raw: str) -> tuple[list[Any] | None, str | None]:
    """The values of `[V1, V2, ...]` written as one YAML list, else None and why it is not
    one when it starts as one (`[a],[b]` is two values, each a list)."""
    if not raw.strip().startswith("["):
        return None, None
    try:
        value = load_value(raw)
    except YamlError as exc:
        return None, exc.problem
    return (list(value), None) if isinstance(value, list) else (None, None)


def sweep_points(axes: Mapping[str, Sequence[Any]], what: str = "--sweep") -> list[dict[str, Any]]:
    """The product of the swept values, in order (the last key varies fastest): one
    {key: value} per array task. InputError for a key with no values."""
    for key, values in axes.items():
        key_path(key, f"{what} {key}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise InputError(f"{what} {key}: give a non-empty list of values", fix=SWEEP_FIX)
    keys = list(axes)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]


def apply(doc: YamlDoc, overrides: Iterable[Override]) -> YamlDoc:
    """A copy of the job file's document with the overrides set, in order; the lines
    of what they replaced forgotten and their sources kept (`YamlDoc.override_source`).
    InputError (exit 2) when a key goes through a value that is neither a mapping nor
    a list (`--set script.x=1`)."""
    overrides = list(overrides)
    if not overrides:
        return doc
    data = copy.deepcopy(doc.data)
    lines = dict(doc.lines)
    sources = dict(doc.overrides)
    for item in overrides:
        path = item.path
        _set(data, path, copy.deepcopy(item.value), item, doc)
        _drop(data, SPELLINGS.get(path, ()))
        for known in [k for k in lines if k[:len(path)] == path]:
            del lines[known]
        for known in [k for k in sources if k[:len(path)] == path]:
            del sources[known]
        sources[path] = item.source
    return YamlDoc(path=doc.path, data=data, lines=lines, overrides=sources)


def _drop(data: dict[str, Any], path: KeyPath) -> None:
    """Remove the key at `path` when it is there (the other spelling of an overridden key)."""
    node: Any = data
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if path and isinstance(node, dict):
        node.pop(path[-1], None)


def _set(data: dict[str, Any], path: KeyPath, value: Any, item: Override, doc: YamlDoc) -> None:
    node: Any = data
    for depth, part in enumerate(path[:-1]):
        node = _child(node, part, path[:depth + 1], item, doc)
    last = path[-1]
    if isinstance(node, list):
        _check_index(node, last, path, item, doc)
        node[int(last)] = value
    else:
        node[str(last) if isinstance(last, int) else last] = value


def _child(node: Any, part: str | int, upto: KeyPath, item: Override, doc: YamlDoc) -> Any:
    """The mapping or list at `part` of `node`, a new mapping when the key is absent or null."""
    if isinstance(node, list):
        _check_index(node, part, upto, item, doc)
        child = node[int(part)]
    else:
        key = str(part) if isinstance(part, int) else part
        child = node.get(key)
        if child is None:
            child = node[key] = {}
    if not isinstance(child, (dict, list)):
        where = doc.override_source(upto) or doc.where(upto)
        raise InputError(f"{item.source}: {'.'.join(map(str, upto))} is {child!r} ({where}), "
                         "not a mapping or list to set a key in",
                         fix="set the key itself, or one that exists below a mapping") from None
    return child


def _check_index(node: list[Any], part: str | int, upto: KeyPath, item: Override, doc: YamlDoc) -> None:
    if not isinstance(part, int) or part >= len(node):
        where = doc.override_source(upto[:-1]) or doc.where(upto[:-1])
        raise InputError(f"{item.source}: {'.'.join(map(str, upto[:-1]))} is a list of {len(node)} "
                         f"item(s) ({where}); {part!r} is not one of its indexes",
                         fix="set an existing item (0, 1, ...) or the whole list, e.g. --set args=[a,b]")
