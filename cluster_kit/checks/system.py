"""sys.memlock: RLIMIT_MEMLOCK (what RDMA may pin) against expect.memlock."""
from __future__ import annotations

import math
import re
from typing import Any

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    failed,
    passed,
    section,
    section_problem,
    settings,
)

UNIT_KIB = {"": 1, "K": 1, "M": 1024, "G": 1024 ** 2, "T": 1024 ** 3}
SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
MEMLOCK_FIX = ("raise it: `* soft memlock unlimited` and `* hard memlock unlimited` in /etc/security/limits.d/, "
               "and start slurmd with LimitMEMLOCK=infinity (Slurm copies the submitting shell's limits "
               "unless PropagateResourceLimitsExcept=MEMLOCK)")


def parse_kib(value: Any) -> float:
    """A limit in KiB as `ulimit -l` counts: "unlimited" -> inf, "8M" -> 8192, 64 -> 64 (bare = KiB)."""
    text = str(value).strip()
    if text.lower() in ("unlimited", "infinity"):
        return math.inf
    match = SIZE_RE.match(text)
    if not match:
        raise ValueError(f"{value!r} is not a memlock limit")
    return float(int(match.group(1)) * UNIT_KIB[match.group(2).upper()])


def shown(kib: float) -> str:
    """ "unlimited" or "65536 KiB (64 MiB)"."""
    if math.isinf(kib):
        return "unlimited"
    return f"{kib:.0f} KiB ({kib / 1024:g} MiB)" if kib >= 1024 else f"{kib:.0f} KiB"


def check_memlock(facts: Facts, expected: Any) -> Finding:
    """sys.memlock: the soft RLIMIT_MEMLOCK is at least expect.memlock."""
    problem = section_problem(facts, "memlock")
    if problem is not None:
        return failed("sys.memlock", f"cannot read RLIMIT_MEMLOCK: {problem}", MEMLOCK_FIX)
    try:
        want = parse_kib(expected)
    except ValueError as exc:
        return failed("sys.memlock", str(exc), "set expect.memlock to unlimited or a size such as 8M, 64G")
    have = parse_kib(section(facts, "memlock").get("soft_kib"))
    if have >= want:
        return passed("sys.memlock", f"RLIMIT_MEMLOCK is {shown(have)}")
    return failed("sys.memlock", f"RLIMIT_MEMLOCK is {shown(have)}, expected {expected} (expect.memlock)", MEMLOCK_FIX)


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """sys.memlock when expect.memlock is set."""
    expected = settings(profile, "expect").get("memlock")
    return [check_memlock(facts, expected)] if expected is not None else []
