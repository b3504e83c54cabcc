"""dcgm.diag (`--deep`): DCGM's quick diagnostic, where DCGM is installed.

The probe runs `dcgmi diag -r 1` (deployment checks: denylist, NVML, CUDA, permissions,
persistence mode, environment, page retirement / row remap, graphics processes,
inforom; seconds) only for `preflight --deep`, never inside a job. A test whose result
is Fail fails the node with DCGM's own words; without dcgmi the check passes with a
note that it was skipped; a diagnostic that could not run (no host engine) warns.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    failed,
    passed,
    plural,
    section,
    warned,
)

FIX = ("read the full report on the node (`dcgmi diag -r 1`, then `dcgmi diag -r 3` for the long tests) and act on "
       "its failed tests; drain the node (`clusterkit audit --drain --apply`) until they pass")


def failing(tests: list[Mapping[str, Any]]) -> list[str]:
    """ "PCIe: Fail - All (GPU 0's NvLink link 0 is currently down ...)" per failed test."""
    shown = []
    for test in tests:
        if str(test.get("result", "")).startswith("Fail"):
            details = "; ".join(str(d) for d in test.get("details") or [])
            shown.append(f"{test.get('test')}: {test.get('result')}" + (f" ({details})" if details else ""))
    return shown


def check_diag(facts: Facts) -> Finding | None:
    """dcgm.diag on the probe's dcgm section; None when the probe did not run it."""
    dcgm = section(facts, "dcgm")
    status = dcgm.get("status")
    if not dcgm or status == "skipped":
        return None
    if status == "absent":
        return passed("dcgm.diag", f"skipped: {dcgm.get('error')}")
    if status != "ok":
        return warned("dcgm.diag", f"the diagnostic did not run: {dcgm.get('error')}",
                      "start DCGM's host engine (`systemctl start nvidia-dcgm`, or `nv-hostengine`) and run "
                      "`dcgmi diag -r 1` on the node")
    tests = [test for test in dcgm.get("tests") or [] if isinstance(test, Mapping)]
    bad = failing(tests)
    if bad:
        return failed("dcgm.diag", "dcgmi diag -r 1: " + "; ".join(bad), FIX)
    return passed("dcgm.diag", f"dcgmi diag -r 1: {plural(len(tests), 'test')}, none failed")


def check(facts: Facts, profile: Profile, deep: bool = False) -> list[Finding]:
    """dcgm.diag under --deep."""
    if not deep:
        return []
    finding = check_diag(facts)
    return [finding] if finding else []
