"""cli_audit's drain/undrain edge: what is printed when Slurm accepts or refuses a command."""
from __future__ import annotations

import io
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from cluster_kit.commands import audit as cli_audit
from cluster_kit.errors import ClusterRefused
from cluster_kit.slurm.builders import NODE_UPDATE_FIX
from cluster_kit.slurm.runner import Completed

DRAIN = ["scontrol", "update", "NodeName=gpu[001-002]", "State=DRAIN", "Reason=clusterkit: gpu.driver"]
UNDRAIN = ["scontrol", "update", "NodeName=gpu007", "State=UNDRAIN"]


class ScriptedRunner:
    """Answers each argv with the next (returncode, stderr); records what ran."""

    where = "on login01"

    def __init__(self, answers: list[tuple[int, str]]) -> None:
        self.answers = list(answers)
        self.ran: list[list[str]] = []

    def run(self, argv: Sequence[str], stdin: str | None = None, timeout: float = 60) -> Completed:
        self.ran.append(list(argv))
        code, stderr = self.answers.pop(0)
        return Completed(list(argv), code, "", stderr)


def apply(runner: ScriptedRunner, commands: list[list[str]]) -> tuple[str, ClusterRefused | None]:
    app: Any = SimpleNamespace(runner=lambda data: runner)
    out = io.StringIO()
    try:
        cli_audit.apply_commands(app, SimpleNamespace(data={}), commands, True, out)
    except ClusterRefused as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


def test_applied_is_printed_only_for_commands_slurm_accepted() -> None:
    runner = ScriptedRunner([(0, ""), (1, "slurm_update error: Invalid node name specified")])
    out, error = apply(runner, [DRAIN, UNDRAIN])
    assert runner.ran == [DRAIN, UNDRAIN]
    assert out == "applied: scontrol update 'NodeName=gpu[001-002]' State=DRAIN 'Reason=clusterkit: gpu.driver'\n"
    assert error is not None and "Invalid node name specified" in error.message


@pytest.mark.parametrize("stderr", ["slurm_update error: Invalid user id",
                                    "slurm_update error: Access/permission denied"])
def test_a_permission_refusal_says_who_may_drain(stderr: str) -> None:
    out, error = apply(ScriptedRunner([(1, stderr)]), [DRAIN])
    assert out == ""
    assert error is not None and error.exit_code == 3
    assert error.message == f"scontrol failed on login01: {stderr}"
    assert error.fix == NODE_UPDATE_FIX
