"""`resilience:` in job files: its defaults, every refusal as FILE:LINE with the fix, the
effective settings, and the #SBATCH lines a supervised job's script gets."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cluster_kit.cli import cli
from cluster_kit.config import json_schema
from cluster_kit.config.effective import effective
from cluster_kit.config.load import load_job, validate_files
from cluster_kit.config.search import SearchPath
from cluster_kit.config.validators import time_limit_seconds

DEFAULTS = {"max_restarts": 3, "hang_timeout": 300, "startup_timeout": None, "exclude": "blamed",
            "exclude_on": "node_faults", "grace": 120, "max_time_requeues": 5, "checkpoint_dir": None,
            "spare_nodes": 0, "min_nodes": None, "checkpoint_every": None, "keep_checkpoints": 3, "mtbf_hours": None}
KEYS = ("max_restarts, hang_timeout, startup_timeout, exclude, exclude_on, grace, max_time_requeues, checkpoint_dir, "
        "spare_nodes, min_nodes, checkpoint_every, keep_checkpoints, mtbf_hours")


@pytest.fixture
def search(tmp_path: Path) -> SearchPath:
    return SearchPath.from_environment([], environ={}, cwd=tmp_path, home=tmp_path)


def job_file(tmp_path: Path, text: str, profile: str = "slurm: {partition: gpu, time: '04:00:00'}\n") -> Path:
    """A job file (profile, script: lines 1-2, then `text` from line 3) and its profile."""
    (tmp_path / "p.yaml").write_text(profile)
    path = tmp_path / "job.yaml"
    path.write_text("profile: ./p.yaml\nscript: /bin/true\n" + text)
    return path


def settings(tmp_path: Path, search: SearchPath, text: str, **kwargs: Any) -> dict[str, Any]:
    return effective(load_job(job_file(tmp_path, text, **kwargs), search))


def sbatch_lines(tmp_path: Path, text: str, **kwargs: Any) -> list[str]:
    """The #SBATCH lines of `clusterkit render` for the job."""
    result = CliRunner().invoke(cli, ["render", str(job_file(tmp_path, text, **kwargs))])
    assert result.exit_code == 0, result.output
    return [line for line in result.output.splitlines() if line.startswith("#SBATCH")]


# --------------------------------------------------------------------------- on, off, defaults

@pytest.mark.parametrize("text", ["", "resilience:\n", "resilience: null\n", "resilience: ~\n"])
def test_absent_or_null_is_off(tmp_path: Path, search: SearchPath, text: str) -> None:
    assert settings(tmp_path, search, text)["resilience"] is None
    lines = sbatch_lines(tmp_path, text)
    assert not [line for line in lines if "signal" in line or "no-kill" in line]


def test_an_empty_block_turns_it_on_with_every_default(tmp_path: Path, search: SearchPath) -> None:
    assert settings(tmp_path, search, "resilience: {}\n")["resilience"] == DEFAULTS


def test_one_key_turns_it_on_and_the_others_keep_their_defaults(tmp_path: Path, search: SearchPath) -> None:
    got = settings(tmp_path, search, "resilience:\n  exclude: never\n")["resilience"]
    assert got == {**DEFAULTS, "exclude": "never"}


def test_every_key_given(tmp_path: Path, search: SearchPath) -> None:
    text = ("resilience:\n  max_restarts: 0\n  hang_timeout: 12.5\n  startup_timeout: 900\n  exclude: blamed\n"
            "  exclude_on: any_failure\n  grace: 0\n  max_time_requeues: 0\n  checkpoint_dir: /scratch/alice/run1/ckpt\n"
            "  spare_nodes: 1\n  min_nodes: 1\n  checkpoint_every: 30m\n  keep_checkpoints: 2\n  mtbf_hours: 2000\n")
    assert settings(tmp_path, search, text)["resilience"] == {
        "max_restarts": 0, "hang_timeout": 12.5, "startup_timeout": 900, "exclude": "blamed",
        "exclude_on": "any_failure", "grace": 0, "max_time_requeues": 0, "checkpoint_dir": "/scratch/alice/run1/ckpt",
        "spare_nodes": 1, "min_nodes": 1, "checkpoint_every": "30m", "keep_checkpoints": 2, "mtbf_hours": 2000}


@pytest.mark.parametrize(("text", "folder"), [
    ("resilience: {checkpoint_dir: ckpt}\n", "ckpt"),                       # where sbatch ran, as output
    ("workdir: /scratch/alice/run1\nresilience: {checkpoint_dir: ckpt/a}\n", "/scratch/alice/run1/ckpt/a"),
    ("workdir: /scratch/alice/run1\nresilience: {checkpoint_dir: /ckpt}\n", "/ckpt"),
])
def test_a_relative_checkpoint_dir_starts_at_the_workdir(tmp_path: Path, search: SearchPath,
                                                         text: str, folder: str) -> None:
    assert settings(tmp_path, search, text)["resilience"]["checkpoint_dir"] == folder


# --------------------------------------------------------------------------- refusals

@pytest.mark.parametrize(("text", "line", "message"), [
    ("resilience:\n  max_restart: 2\n", 4,
     f"unknown key 'max_restart' in resilience; did you mean 'max_restarts'? valid keys: {KEYS}"),
    ("resilience:\n  colour: red\n", 4, f"unknown key 'colour' in resilience; valid keys: {KEYS}"),
    ("resilience: 5\n", 3, "resilience: expected a mapping of keys, got an integer (5)"),
    ("resilience: [grace]\n", 3, "resilience: expected a mapping of keys, got a list"),
    ("resilience:\n  max_restarts: -1\n", 4, "resilience.max_restarts: -1 is too small; use 0 or more"),
    ("resilience:\n  max_restarts: '3'\n", 4, "resilience.max_restarts: expected an integer, got a string ('3')"),
    ("resilience:\n  hang_timeout: 0\n", 4, "resilience.hang_timeout: 0 must be greater than 0"),
    ("resilience:\n  hang_timeout: 5m\n", 4, "resilience.hang_timeout: expected a number, got a string ('5m')"),
    ("resilience:\n  hang_timeout: true\n", 4, "resilience.hang_timeout: expected a number, got a boolean (True)"),
    ("resilience:\n  exclude: all\n", 4, "resilience.exclude: 'all' is not one of blamed | never"),
    ("resilience:\n  exclude_on: crashes\n", 4,
     "resilience.exclude_on: 'crashes' is not one of node_faults | any_failure"),
    ("resilience:\n  grace: -1\n", 4, "resilience.grace: -1 is out of range; use 0-65535"),
    ("resilience:\n  grace: 70000\n", 4, "resilience.grace: 70000 is out of range; use 0-65535"),
    ("resilience:\n  grace: 1.5\n", 4, "resilience.grace: expected an integer, got a number (1.5)"),
    ("resilience:\n  max_time_requeues: -2\n", 4, "resilience.max_time_requeues: -2 is too small; use 0 or more"),
    ("resilience:\n  checkpoint_dir: ''\n", 4, "resilience.checkpoint_dir: expected a non-empty string"),
    ("resilience:\n  checkpoint_dir: 7\n", 4, "resilience.checkpoint_dir: expected a string, got an integer (7)"),
    ("resilience:\n  checkpoint_dir: ~/ckpt\n", 4,
     ("resilience.checkpoint_dir: '~/ckpt' starts with ~, which the job does not expand (the value is "
      "quoted); write the full path, e.g. /scratch/alice/run1/ckpt")),
])
def test_a_bad_value_is_one_problem_at_its_line(tmp_path: Path, search: SearchPath,
                                                text: str, line: int, message: str) -> None:
    job = job_file(tmp_path, text)
    assert validate_files([job], search) == [f"{job}:{line}: {message}"]


def test_every_problem_of_the_block_at_once(tmp_path: Path, search: SearchPath) -> None:
    job = job_file(tmp_path, "resilience:\n  max_restarts: -1\n  exclude: some\n  grace: x\n")
    assert validate_files([job], search) == [
        f"{job}:4: resilience.max_restarts: -1 is too small; use 0 or more",
        f"{job}:5: resilience.exclude: 'some' is not one of blamed | never",
        f"{job}:6: resilience.grace: expected an integer, got a string ('x')",
    ]


# --------------------------------------------------------------------------- grace and the time limit

def grace_problem(grace: str, seconds: int, source: str) -> str:
    return (f"resilience.grace: {grace} is not below the job's time limit of {seconds} seconds ({source}); "
            "the ranks would be told to checkpoint as soon as they start; fix: a grace below "
            f"{seconds} seconds (e.g. grace: {seconds // 2}), or a longer time limit")


def test_a_grace_at_the_jobs_time_limit_is_refused_at_its_line(tmp_path: Path, search: SearchPath) -> None:
    job = job_file(tmp_path, "time: '00:02:00'\nresilience:\n  max_restarts: 1\n  grace: 120\n")
    assert validate_files([job], search) == [f"{job}:6: {grace_problem('120', 120, 'time: ' + repr('00:02:00'))}"]


def test_a_grace_beyond_the_slurm_time_is_refused(tmp_path: Path, search: SearchPath) -> None:
    job = job_file(tmp_path, "slurm: {time: 2}\nresilience: {grace: 600}\n")
    assert validate_files([job], search) == [f"{job}:4: {grace_problem('600', 120, 'slurm.time: 2')}"]


def test_the_default_grace_beyond_the_profiles_time_is_refused_at_the_block(
        tmp_path: Path, search: SearchPath) -> None:
    job = job_file(tmp_path, "resilience: {}\n", profile="slurm:\n  partition: gpu\n  time: '1:00'\n")
    source = f"the profile's slurm.time: '1:00', {tmp_path / 'p.yaml'}:3"
    assert validate_files([job], search) == [f"{job}:3: {grace_problem('120 (the default)', 60, source)}"]


def test_a_grace_slurm_may_send_as_the_job_starts_is_refused(tmp_path: Path, search: SearchPath) -> None:
    """sbatch(1): the --signal signal "may be sent up to 60 seconds earlier than specified"; a
    job of one minute with grace 40 was killed by SIGUSR1 as it started, before its trap."""
    job = job_file(tmp_path, "time: '00:01:00'\nresilience:\n  grace: 40\n")
    assert validate_files([job], search) == [
        (f"{job}:5: resilience.grace: 40 is within 60 seconds of the job's time limit of 60 seconds "
        "(time: '00:01:00'); Slurm may send the grace signal up to 60 seconds early, as the job starts, "
        "before it can checkpoint; fix: a time limit above 100 seconds")]
    job = job_file(tmp_path, "time: '00:02:30'\nresilience: {}\n")
    assert validate_files([job], search) == [
        (f"{job}:4: resilience.grace: 120 (the default) is within 60 seconds of the job's time limit of 150 "
        "seconds (time: '00:02:30'); Slurm may send the grace signal up to 60 seconds early, as the job "
        "starts, before it can checkpoint; fix: a time limit above 180 seconds, or a grace below 90 seconds")]
    job = job_file(tmp_path, "time: '00:03:00'\nresilience: {}\n")
    assert validate_files([job], search) != []        # 120 + 60 is not below 180
    job = job_file(tmp_path, "time: '00:03:00'\nresilience: {grace: 119}\n")
    assert validate_files([job], search) == []


@pytest.mark.parametrize("text", [
    "time: '00:03:01'\nresilience: {grace: 120}\n",        # Slurm's 60 s, and one second to spare
    "time: UNLIMITED\nresilience: {grace: 120}\n",         # no limit
    "time: 0\nresilience: {grace: 120}\n",                 # 0 is no limit to sbatch
    "time: 1\nresilience: {grace: 0}\n",                   # no signal at all
    "time: 1\n",                                           # no resilience
])
def test_a_grace_below_the_limit_or_without_one_passes(tmp_path: Path, search: SearchPath, text: str) -> None:
    assert validate_files([job_file(tmp_path, text)], search) == []


@pytest.mark.parametrize(("value", "seconds"), [
    (30, 1800), ("30", 1800), ("5:30", 330), ("01:02:03", 3723), ("2-3", 183600),
    ("2-03:04", 183840), ("1-00:00:01", 86401), (0, None), ("0", None), ("UNLIMITED", None),
    ("infinite", None), ("25:61:00", None), (True, None), (-5, None), (None, None),
])
def test_time_limits_in_seconds(value: Any, seconds: int | None) -> None:
    assert time_limit_seconds(value) == seconds


# --------------------------------------------------------------------------- #SBATCH lines

def test_a_supervised_job_gets_the_signal_no_kill_and_requeue(tmp_path: Path) -> None:
    lines = sbatch_lines(tmp_path, "resilience: {}\n")
    assert "#SBATCH --signal=B:USR1@120" in lines and "#SBATCH --no-kill" in lines
    assert "#SBATCH --requeue" in lines  # the batch script's node failed: Slurm runs the job again


def test_spare_nodes_are_asked_for_beside_the_nodes(tmp_path: Path) -> None:
    assert "#SBATCH --nodes=3" in sbatch_lines(tmp_path, "nodes: 2\nresilience: {spare_nodes: 1}\n")
    assert "#SBATCH --nodes=2" in sbatch_lines(tmp_path, "nodes: 2\nresilience: {spare_nodes: 0}\n")


@pytest.mark.parametrize(("text", "line", "message"), [
    ("nodes: 2\nresilience:\n  min_nodes: 3\n", 5,
     ("resilience.min_nodes: 3 is more than nodes: 2; fix: give at most 2 (the job trains on `nodes`, with fewer "
     "only when no spare is left)")),
    ("resilience:\n  checkpoint_every: 30x\n", 4,
     "resilience.checkpoint_every: '30x' is not auto, a number of steps (500) or a duration (90s, 30m, 2h)"),
    ("resilience:\n  checkpoint_every: 0\n", 4, ("resilience.checkpoint_every: 0 is not a whole number of steps >= 1;"
     " give auto, a number of steps (500) or a duration (90s, 30m, 2h)")),
    ("resilience:\n  spare_nodes: -1\n", 4, "resilience.spare_nodes: -1 is too small; use 0 or more"),
])
def test_bad_spares_and_intervals_are_refused_at_their_line(tmp_path: Path, text: str, line: int,
                                                            message: str) -> None:
    job = job_file(tmp_path, text)
    assert validate_files([job], SearchPath.from_environment([], environ={}, cwd=tmp_path, home=tmp_path)) == [
        f"{job}:{line}: {message}"]


def test_grace_sets_the_signals_time_and_zero_sends_none(tmp_path: Path) -> None:
    assert "#SBATCH --signal=B:USR1@45" in sbatch_lines(tmp_path, "resilience: {grace: 45}\n")
    lines = sbatch_lines(tmp_path, "resilience: {grace: 0}\n")
    assert "#SBATCH --no-kill" in lines and not [line for line in lines if "signal" in line]


@pytest.mark.parametrize("text", [
    "slurm: {sbatch: {signal: 'B:USR2@300'}}\n",
    "slurm: {signal: 'B:USR2@300'}\n",
])
def test_the_jobs_own_signal_wins(tmp_path: Path, text: str) -> None:
    lines = sbatch_lines(tmp_path, text + "resilience: {grace: 60}\n")
    assert [line for line in lines if "signal" in line] == ["#SBATCH --signal=B:USR2@300"]
    assert "#SBATCH --no-kill" in lines


def test_the_jobs_own_no_kill_false_drops_the_flag(tmp_path: Path) -> None:
    lines = sbatch_lines(tmp_path, "slurm: {no_kill: false}\nresilience: {}\n")
    assert "#SBATCH --signal=B:USR1@120" in lines and not [line for line in lines if "no-kill" in line]


def test_the_supervisor_signal_wins_over_the_profiles(tmp_path: Path) -> None:
    profile = "slurm: {partition: gpu, signal: 'USR2@30'}\n"
    assert "#SBATCH --signal=USR2@30" in sbatch_lines(tmp_path, "", profile=profile)
    lines = sbatch_lines(tmp_path, "resilience: {}\n", profile=profile)
    assert [line for line in lines if "signal" in line] == ["#SBATCH --signal=B:USR1@120"]


def test_the_options_are_in_the_effective_slurm_extra(tmp_path: Path, search: SearchPath) -> None:
    extra = settings(tmp_path, search, "resilience: {grace: 90}\n")["slurm"]["extra"]
    assert extra == {"signal": "B:USR1@90", "no-kill": "", "requeue": "", "open-mode": "append"}


# --------------------------------------------------------------------------- schema

@pytest.mark.parametrize("value", [None, {}, {"grace": 60, "hang_timeout": 0.5, "checkpoint_dir": "ckpt"}])
def test_the_schema_accepts_what_the_validator_accepts(value: Any) -> None:
    import jsonschema

    job = {"profile": "p", "script": "t.py", "resilience": value}
    assert list(jsonschema.Draft202012Validator(json_schema.build("job")).iter_errors(job)) == []
