"""On CI, a skip for want of something scripts/setup installs is a failure.

Tests skip when a tool is missing so that they run on a bare developer machine.
CI (CI=true, `.ci/run`) runs scripts/setup first, so there the same skip would
hide a lost capability: it fails instead, with the skip's reason. Skips for
things scripts/setup does not provide (a Python 3.6 interpreter, torch) stay
skips; `scripts/test` runs pytest with -rs, so every skip is listed with its reason.
"""
from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

# The start of each skip reason whose cause scripts/setup's APT_PACKAGES remove.
SETUP_PROVIDES = (
    "shellcheck is not installed",
    "scontrol is not installed",
    "chromium is not installed",
    "needs root and OpenSSH's sshd",
    "needs OpenSSH's ssh-keygen",
    "needs a C++ compiler",
)


def skip_reason(report: pytest.TestReport) -> str:
    """The reason of a skipped report ("" when there is none)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report)
    if reason.startswith(SETUP_PROVIDES):
        report.outcome = "failed"
        report.longrepr = f"skipped on CI, where scripts/setup provides it: {reason}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use the dev cluster get the ``dev_cluster`` mark: scripts/test runs
    them one after another (those marked ``side_partition`` in a lane of their own),
    and all others beside them (``-m "not dev_cluster"``)."""
    for item in items:
        if "dev_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.dev_cluster)
