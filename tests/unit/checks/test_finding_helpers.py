"""The helpers every check shares: the worst status, a section's problem, dotted versions."""
from __future__ import annotations

import pytest

from cluster_kit.checks.findings import dotted, section_problem, with_fix, worst


def test_an_unknown_status_ranks_worst() -> None:
    assert worst(["fail", "lost", "pass"]) == "lost"
    assert worst(["unreachable", "fail"]) == "unreachable"
    assert worst([]) == "pass"


def test_section_problem_names_the_status() -> None:
    assert section_problem({"gpu": {"status": "absent"}}, "gpu") == "gpu facts are absent"
    assert section_problem({"gpu": {"status": "error", "error": "nvidia-smi hung"}}, "gpu") == "nvidia-smi hung"
    assert section_problem({"gpu": {"status": "ok"}}, "gpu") is None
    assert section_problem({"gpu": []}, "gpu") == "the probe sent no 'gpu' facts (an older or broken probe)"


def test_dotted() -> None:
    assert dotted(" 535.104.05 ") == (535, 104, 5)
    for bad in ("", "535.x", "r535"):
        with pytest.raises(ValueError, match="is not a dotted version"):
            dotted(bad)


def test_a_finding_without_fix_is_its_message_alone() -> None:
    assert with_fix("RLIMIT_MEMLOCK is unlimited", "") == "RLIMIT_MEMLOCK is unlimited"
    assert with_fix("low", "raise it") == "low (fix: raise it)"
