"""What every check returns, and the small helpers all check families share.

Checks are pure: probe facts and profile data in, findings out. They also run
inside a job (cluster_kit.checks.injob bundles this package with `packaging`), so
only the standard library and `packaging` may be imported here.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Node and finding statuses, best to worst ("unreachable": SSH never got an answer).
STATUS_ORDER = ("pass", "warn", "fail", "unreachable")
STATUS_RANK = {status: rank for rank, status in enumerate(STATUS_ORDER)}
# Sort position of a status in reports: the worst first.
SEVERITY = {status: position for position, status in enumerate(reversed(STATUS_ORDER))}

Facts = Mapping[str, Any]
Profile = Mapping[str, Any]


@dataclass
class Finding:
    """One check's verdict on one node: SPEC id, status, what was seen, what to do."""

    id: str
    status: str          # "pass" | "warn" | "fail"
    message: str
    fix: str = ""


def passed(check_id: str, message: str) -> Finding:
    """A passing finding (no fix)."""
    return Finding(check_id, "pass", message)


def failed(check_id: str, message: str, fix: str) -> Finding:
    """A failing finding with the fix to apply."""
    return Finding(check_id, "fail", message, fix)


def warned(check_id: str, message: str, fix: str) -> Finding:
    """A warning: the job may run, but not as expected."""
    return Finding(check_id, "warn", message, fix)


def with_fix(message: str, fix: str) -> str:
    """A finding as one line for people: "message (fix: fix)", or the message alone."""
    return f"{message} (fix: {fix})" if fix else message


def worst(statuses: Iterable[str]) -> str:
    """The worst of several statuses: pass < warn < fail < unreachable (pass when there are none)."""
    return max(statuses, key=lambda s: STATUS_RANK.get(s, len(STATUS_RANK)), default="pass")


def section(facts: Facts, name: str) -> Mapping[str, Any]:
    """One probe section ({} when the probe did not send it)."""
    value = facts.get(name)
    return value if isinstance(value, Mapping) else {}


def section_problem(facts: Facts, name: str) -> str | None:
    """Why a section has no usable facts ("absent"/"error" text), or None when it is ok."""
    data = section(facts, name)
    if not data:
        return f"the probe sent no {name!r} facts (an older or broken probe)"
    if data.get("status") == "ok":
        return None
    return str(data.get("error") or f"{name} facts are {data.get('status')}")


def settings(profile: Profile, key: str) -> Mapping[str, Any]:
    """profile[key] as a mapping ({} when unset): "network", "expect", "environment"."""
    value = profile.get(key)
    return value if isinstance(value, Mapping) else {}


def dotted(version: Any) -> tuple[int, ...]:
    """ "535.104.05" -> (535, 104, 5): driver versions compare numerically, part by part."""
    parts = str(version).strip().split(".")
    if not parts or not all(part.isdigit() for part in parts):
        raise ValueError(f"{version!r} is not a dotted version")
    return tuple(int(part) for part in parts)


def plural(count: int, word: str) -> str:
    """ "1 GPU", "8 GPUs"."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def thresholds(defaults: Mapping[str, int], overrides: Mapping[str, Any] | None) -> dict[str, int]:
    """`defaults` with the profile's overrides of them (`expect.*_error_thresholds`);
    names it does not know and nulls are left out."""
    merged = dict(defaults)
    for name, limit in (overrides or {}).items():
        if name in merged and limit is not None:
            merged[name] = int(limit)
    return merged
