"""The spec engine: Field/ListOf/MapOf/Section nodes, the walker that checks a
document against them, and defaults.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:  # only a type: render/ imports this module and must not load yaml
    from cluster_kit.config.yamlfile import KeyPath


Check = Callable[[Any], Optional[str]]  # noqa: UP045 - evaluated at runtime on 3.9


Problem = tuple["KeyPath", str]


# Strings hold no newline or NUL anywhere (the walker refuses them for every scalar).
ONE_LINE = r"^[^\n\u0000]*$"


@dataclass(frozen=True)
class Rule:
    """A check together with the JSON Schema that says the same, for editors.

    `json_schema.py` builds `clusterkit schema` from these fragments, so the
    schema an editor sees and the validator are one definition.
    """

    check: Check
    json: dict[str, Any]

    def __call__(self, value: Any) -> str | None:
        return self.check(value)


def anycase(word: str) -> str:
    """A regex matching `word` in any case ("unlimited" -> "[Uu][Nn]...")."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in word)


# ----------------------------------------------------------------------------
# spec nodes


@dataclass(frozen=True)
class Field:
    """A scalar key: `check(value)` returns a problem (text after `key: `) or None."""

    check: Check
    default: Any = None


@dataclass(frozen=True)
class ListOf:
    """A list whose items all follow `item`."""

    item: Field
    default: tuple[Any, ...] = ()


@dataclass(frozen=True)
class MapOf:
    """An open mapping: each key passes `key_check`, each value `value`."""

    key_check: Check
    value: Field


@dataclass(frozen=True)
class Section:
    """A mapping with named keys; other keys go to `extra` or are errors.

    `present=False` keeps an absent section absent (`login`: absent = run locally).
    `nullable=True` also accepts `key: null`, which then means the same as absent.
    `fill=False` leaves absent keys absent (the job's `nccl` overrides only what it names).
    `extra_hint` is how the valid-keys list describes what `extra` accepts.
    `extra_accepts(key)` says whether a key that is not a field belongs to `extra`.
    `shorthand` is a scalar written in place of the mapping (`cuda_graphs: true` for
    `cuda_graphs: {...}`), checked by that field; an absent key takes its default.
    """

    fields: dict[str, Spec]
    extra: MapOf | None = None
    extra_hint: str = ""
    present: bool = True
    nullable: bool = False
    fill: bool = True
    suggest_from: tuple[str, ...] = ()
    extra_accepts: Callable[[Any], bool] = lambda key: True
    shorthand: Field | None = None


Spec = Union[Field, ListOf, MapOf, Section]  # noqa: UP007 - evaluated at runtime on 3.9


# ----------------------------------------------------------------------------
# scalar checks


def _type_name(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a mapping", type(None): "empty"}
    return names.get(type(value), type(value).__name__)


def type_and_value(value: Any) -> str:
    """What a message says a wrong value was: its type, and for a scalar the value too."""
    if isinstance(value, (dict, list)) or value is None:
        return _type_name(value)
    return f"{_type_name(value)} ({quoted_value(value)})"


def quoted_value(value: Any) -> str:
    """`repr(value)`, cut after 60 characters: a value of a megabyte stays a one-line message."""
    text = repr(value)
    if len(text) <= 80:
        return text
    return f"{text[:60]}... ({len(str(value)):,} characters)"


# ----------------------------------------------------------------------------
# the walker


def dotted(path: KeyPath) -> str:
    """`network.ib_hca[1]` for ("network", "ib_hca", 1)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def check(data: dict[str, Any], spec: Section) -> list[Problem]:
    """Every problem in `data` against `spec`, in document order of the keys."""
    problems: list[Problem] = []
    _check_section(data, spec, (), problems)
    return problems


def _report(problems: list[Problem], path: KeyPath, message: str) -> None:
    problems.append((path, f"{dotted(path)}: {message}" if path else message))


def _check_node(value: Any, spec: Spec, path: KeyPath, problems: list[Problem]) -> None:
    if isinstance(spec, Section):
        if isinstance(value, dict):
            _check_section(value, spec, path, problems)
        elif spec.shorthand is not None:
            _check_scalar(value, spec.shorthand, path, problems)
        elif not (value is None and spec.nullable):
            _report(problems, path, f"expected a mapping of keys, got {type_and_value(value)}")
    elif isinstance(spec, MapOf):
        _check_map(value, spec, path, problems)
    elif isinstance(spec, ListOf):
        _check_list(value, spec, path, problems)
    else:
        _check_scalar(value, spec, path, problems)


def _check_scalar(value: Any, spec: Field, path: KeyPath, problems: list[Problem]) -> None:
    if isinstance(value, str) and ("\n" in value or "\0" in value):
        kind = "a newline" if "\n" in value else "a NUL character"
        _report(problems, path, f"contains {kind}; values must be a single line")
        return
    problem = spec.check(value)
    if problem:
        _report(problems, path, problem)


def _check_list(value: Any, spec: ListOf, path: KeyPath, problems: list[Problem]) -> None:
    if not isinstance(value, list):
        _report(problems, path, f"expected a list, got {type_and_value(value)}")
        return
    for index, item in enumerate(value):
        _check_scalar(item, spec.item, path + (index,), problems)


def _check_map(value: Any, spec: MapOf, path: KeyPath, problems: list[Problem]) -> None:
    if not isinstance(value, dict):
        _report(problems, path, f"expected a mapping, got {type_and_value(value)}")
        return
    for key, item in value.items():
        problem = spec.key_check(key)
        if problem:
            _report(problems, path + (key,), problem)
        else:
            _check_scalar(item, spec.value, path + (key,), problems)


def _check_section(data: dict[str, Any], spec: Section, path: KeyPath,
                   problems: list[Problem]) -> None:
    for key, value in data.items():
        if key in spec.fields:
            _check_node(value, spec.fields[key], path + (key,), problems)
        elif spec.extra is not None and spec.extra_accepts(key):
            _check_map({key: value}, spec.extra, path, problems)
        else:
            problems.append((path + (key,), unknown_key(key, spec, path)))


def unknown_key(key: Any, spec: Section, path: KeyPath) -> str:
    """`unknown key 'x' in s; did you mean 'y'? valid keys: ...` for a section."""
    valid = list(spec.fields)
    candidates = list(dict.fromkeys(valid + list(spec.suggest_from)))
    close = difflib.get_close_matches(str(key), candidates, n=1, cutoff=0.6)
    where = f" in {dotted(path)}" if path else ""
    hint = f"; did you mean '{close[0]}'? " if close else "; "
    listed = ", ".join(valid) + (f", {spec.extra_hint}" if spec.extra_hint else "")
    return f"unknown key '{key}'{where}{hint}valid keys: {listed}"


# ----------------------------------------------------------------------------
# defaults


def with_defaults(data: dict[str, Any], spec: Section) -> dict[str, Any]:
    """A copy of `data` with every absent key of `spec` filled with its default."""
    if not spec.fill:
        return dict(data)
    out: dict[str, Any] = {}
    for key, sub in spec.fields.items():
        if key in data:
            out[key] = _default_inside(data[key], sub)
        elif isinstance(sub, Section) and sub.shorthand is not None:
            out[key] = sub.shorthand.default
        elif isinstance(sub, Section):
            out[key] = with_defaults({}, sub) if sub.present else None
        elif isinstance(sub, ListOf):
            out[key] = list(sub.default)
        elif isinstance(sub, MapOf):
            out[key] = {}
        else:
            out[key] = sub.default
    for key, value in data.items():
        out.setdefault(key, value)
    return out


def _default_inside(value: Any, spec: Spec) -> Any:
    if isinstance(spec, Section) and isinstance(value, dict):
        return with_defaults(value, spec)
    return value
