"""JSON Schema (draft 2020-12) of profiles and job files, built from schema.py's specs.

Nothing here restates a rule: each check of schema.py carries its own JSON
fragment (`schema.Rule`), and this module only walks the spec tree, so what an
editor flags and what `clusterkit validate` reports come from one definition.
The validator can say more than a schema (hostlist ranges, PEP 440 in full,
torchrun with several tasks per node); the schema never accepts less.
"""
from __future__ import annotations

from typing import Any

from cluster_kit.config import spec as config_spec
from cluster_kit.config import specs

DRAFT = "https://json-schema.org/draft/2020-12/schema"
KINDS = ("profile", "job")


def build(kind: str) -> dict[str, Any]:
    """The JSON Schema of a `profile` or `job` file."""
    spec = specs.PROFILE if kind == "profile" else specs.JOB
    out: dict[str, Any] = {"$schema": DRAFT,
                           "title": f"clusterkit {kind}"}
    out.update(node_schema(spec, kind, ()))
    if kind == "job":
        out["required"] = list(specs.JOB_REQUIRED)
    return out


def node_schema(spec: config_spec.Spec, kind: str, path: tuple[str, ...]) -> dict[str, Any]:
    """The schema of one spec node at a key path, with its description."""
    if isinstance(spec, config_spec.Section):
        out = section_schema(spec, kind, path)
    elif isinstance(spec, config_spec.MapOf):
        out = map_schema(spec, kind, path)
    elif isinstance(spec, config_spec.ListOf):
        out = {"type": "array", "items": field_schema(spec.item)}
    else:
        out = field_schema(spec)
    description = specs.describe(kind, ".".join(path))
    if description:
        out = {"description": description, **out}
    return out


def field_schema(spec: config_spec.Field) -> dict[str, Any]:
    """A scalar's fragment from its Rule, plus its default."""
    out = dict(rule_json(spec.check))
    if spec.default is not None:
        out["default"] = spec.default
    return out


def rule_json(check: Any) -> dict[str, Any]:
    """The JSON fragment a check carries.

    A check without one (not wrapped in schema.Rule) accepts anything here rather
    than break `clusterkit schema`; the tests insist that every check has one.
    """
    return check.json if isinstance(check, config_spec.Rule) else {}


def section_schema(spec: config_spec.Section, kind: str, path: tuple[str, ...]) -> dict[str, Any]:
    """An object with named properties; other keys only as the section's `extra` allows
    (and null, for a section that may be written `key: null`; its shorthand scalar, for
    one that has one)."""
    out: dict[str, Any] = {"type": ["object", "null"] if spec.nullable else "object",
                           "properties": {key: node_schema(sub, kind, path + (key,))
                                          for key, sub in spec.fields.items()}}
    if spec.extra is None:
        out["additionalProperties"] = False
    else:
        out["propertyNames"] = {"anyOf": [{"enum": list(spec.fields)}, rule_json(spec.extra.key_check)]}
        out["additionalProperties"] = field_schema(spec.extra.value)
    if spec.shorthand is not None:  # `key: true` in place of the mapping
        return {"anyOf": [field_schema(spec.shorthand), out]}
    return out


def map_schema(spec: config_spec.MapOf, kind: str, path: tuple[str, ...]) -> dict[str, Any]:
    """An open mapping; a fixed set of key names becomes properties (editors complete them)."""
    keys = rule_json(spec.key_check)
    value = field_schema(spec.value)
    if "enum" in keys:
        return {"type": "object", "properties": {name: value for name in keys["enum"]},
                "additionalProperties": False}
    return {"type": "object", "propertyNames": keys, "additionalProperties": value}


def spec_paths(spec: config_spec.Spec, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every named key path of a spec (Section fields, recursively)."""
    if not isinstance(spec, config_spec.Section):
        return []
    out = []
    for key, sub in spec.fields.items():
        out.append(path + (key,))
        out += spec_paths(sub, path + (key,))
    return out
