"""sys.memlock, whole findings, and the limit's parsing and display."""
from __future__ import annotations

import math
from typing import Any

import pytest

from cluster_kit.checks import Finding, system
from cluster_kit.checks.system import MEMLOCK_FIX, parse_kib, shown


def memlock(soft: Any, expected: Any) -> Finding:
    return system.check_memlock({"memlock": {"status": "ok", "soft_kib": soft}}, expected)


@pytest.mark.parametrize("value, kib", [
    ("unlimited", math.inf), ("Infinity", math.inf), ("INFINITY", math.inf), (" 64 ", 64.0), (64, 64.0),
    ("8M", 8192.0), ("8MiB", 8192.0), ("2g", 2 * 1024 ** 2), ("1T", 1024 ** 3), ("16K", 16.0),
])
def test_parse_kib(value: Any, kib: float) -> None:
    assert parse_kib(value) == kib


def test_parse_kib_refuses_what_is_no_size() -> None:
    with pytest.raises(ValueError, match=r"^'lots' is not a memlock limit$"):
        parse_kib("lots")


@pytest.mark.parametrize("kib, text", [
    (math.inf, "unlimited"), (64.0, "64 KiB"), (1023.0, "1023 KiB"), (1024.0, "1024 KiB (1 MiB)"),
    (1025.0, "1025 KiB (1.00098 MiB)"), (65536.0, "65536 KiB (64 MiB)"),
])
def test_shown(kib: float, text: str) -> None:
    assert shown(kib) == text


def test_low_memlock_fails_with_the_limits_fix() -> None:
    assert memlock(65536, "unlimited") == Finding(
        "sys.memlock", "fail", "RLIMIT_MEMLOCK is 65536 KiB (64 MiB), expected unlimited (expect.memlock)",
        MEMLOCK_FIX)
    assert MEMLOCK_FIX == (
        "raise it: `* soft memlock unlimited` and `* hard memlock unlimited` in /etc/security/limits.d/, "
        "and start slurmd with LimitMEMLOCK=infinity (Slurm copies the submitting shell's limits "
        "unless PropagateResourceLimitsExcept=MEMLOCK)")


def test_a_limit_equal_to_expect_passes() -> None:
    assert memlock("8M", "8192") == Finding("sys.memlock", "pass", "RLIMIT_MEMLOCK is 8192 KiB (8 MiB)")
    assert memlock("unlimited", "unlimited") == Finding("sys.memlock", "pass", "RLIMIT_MEMLOCK is unlimited")


def test_an_unreadable_limit() -> None:
    assert system.check_memlock({"memlock": {"status": "error", "error": "getrlimit failed"}}, "8M") == Finding(
        "sys.memlock", "fail", "cannot read RLIMIT_MEMLOCK: getrlimit failed", MEMLOCK_FIX)


def test_an_expect_memlock_that_is_no_size() -> None:
    assert memlock(64, "lots") == Finding(
        "sys.memlock", "fail", "'lots' is not a memlock limit", "set expect.memlock to unlimited or a size such as 8M, 64G")


def test_check_runs_only_when_expect_memlock_is_set() -> None:
    facts = {"memlock": {"status": "ok", "soft_kib": 64}}
    assert system.check(facts, {"expect": {}}) == []
    assert [f.status for f in system.check(facts, {"expect": {"memlock": 64}})] == ["pass"]
