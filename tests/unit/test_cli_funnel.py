"""cli.main()'s funnel: every outcome of a command becomes one message and its SPEC exit code."""
from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import click
import pytest

from cluster_kit.cli import run_to_exit_code
from cluster_kit.errors import (
    CheckFailed,
    ClusterRefused,
    ExitStatus,
    InputError,
    SshConnectError,
    exit_with,
)


def raising(exc: BaseException) -> Callable[[], NoReturn]:
    def invoke() -> NoReturn:
        raise exc
    return invoke


@pytest.mark.parametrize("exc, code, stderr", [
    (InputError("job.yaml:3: nodes: expected an integer", fix="write a number"), 2,
     "clusterkit: error: job.yaml:3: nodes: expected an integer\n  fix: write a number\n"),
    (CheckFailed("preflight failed; not submitting"), 1, "clusterkit: error: preflight failed; not submitting\n"),
    (ClusterRefused("sbatch failed here: Invalid account"), 3, "clusterkit: error: sbatch failed here: Invalid account\n"),
    (SshConnectError("login01", "connection refused"), 3,
     ("clusterkit: error: cannot reach login01 over SSH: connection refused\n"
      "  fix: check that `ssh login01` works with the profile's settings\n")),
    (ExitStatus(7), 7, ""),
    (FileNotFoundError(2, "No such file or directory", "out/x.json"), 2,
     "clusterkit: error: out/x.json: No such file or directory\n"),
    (KeyboardInterrupt(), 130, "clusterkit: interrupted\n"),
    (click.Abort(), 1, "Aborted!\n"),
])
def test_each_outcome_has_one_line_and_its_exit_code(exc: BaseException, code: int, stderr: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert run_to_exit_code(raising(exc)) == code
    out, err = capsys.readouterr()
    assert (out, err) == ("", stderr)


def test_a_command_that_returns_exits_0_and_exit_with_0_raises_nothing() -> None:
    assert run_to_exit_code(lambda: None) == 0
    assert run_to_exit_code(lambda: 4) == 4  # click's ctx.exit(4) in standalone_mode=False
    exit_with(0)
    with pytest.raises(ExitStatus) as info:
        exit_with(1)
    assert info.value.exit_code == 1


def test_ctrl_c_that_click_turned_into_abort_is_130(capsys: pytest.CaptureFixture[str]) -> None:
    def invoke() -> NoReturn:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:  # what click's main() does with Ctrl-C
            raise click.Abort() from exc
    assert run_to_exit_code(invoke) == 130
    assert capsys.readouterr().err == "clusterkit: interrupted\n"
