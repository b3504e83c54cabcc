"""Bad input through the real `clusterkit` process: exit 2, FILE:LINE or the option, the fix.

No cluster is touched: every case is refused before anything runs. Each runs as a
subprocess so the exit code and stderr are what a user sees (no traceback).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def clusterkit_argv() -> list[str]:
    """The installed console script next to this interpreter, else `python -m cluster_kit`."""
    script = Path(sys.executable).parent / "clusterkit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cluster_kit"]


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERKIT_PATH", "CLUSTERKIT_PROFILE")}
    return subprocess.run([*clusterkit_argv(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, check=False,
                          env={**env, "HOME": str(cwd)})


def refused(cwd: Path, *args: str) -> str:
    """stderr of a command that must be refused as bad input (exit 2, nothing on stdout)."""
    done = run(cwd, *args)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""
    return done.stderr


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


JOB = "profile: local-dev\nscript: train.py\nnodes: 1\n"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """A folder of broken profiles and jobs (and one good job)."""
    write(tmp_path / "badyaml.yaml", "name: x\nslurm:\n  partition: [gpu\n")
    write(tmp_path / "unknown.yaml", "name: x\nslurm:\n  partiton: gpu\n")
    write(tmp_path / "wrongtype.yaml", "name: x\nslurm:\n  gpus_per_node: eight\n")
    write(tmp_path / "cycle-a.yaml", "name: a\nextends: ./cycle-b.yaml\n")
    write(tmp_path / "cycle-b.yaml", "name: b\nextends: ./cycle-a.yaml\n")
    write(tmp_path / "inject.yaml",
          'name: x\nslurm:\n  account: "proj\\n#SBATCH --qos=high"\n  partition: gpu$(reboot)\n')
    write(tmp_path / "badnodes.yaml", "name: x\nnodes: gpu[01-\n")
    write(tmp_path / "train.py", "print('training')\n")
    write(tmp_path / "t.py", "print('training')\n")
    write(tmp_path / "job.yaml", JOB)
    write(tmp_path / "nl-job.yaml", JOB + 'name: "a\\nb"\n')
    write(tmp_path / "subst-job.yaml", JOB + "output: logs/$(id).out\n")
    write(tmp_path / "noprofile-job.yaml", "profile: ./nope.yaml\nscript: t.py\nnodes: 1\n")
    write(tmp_path / "template-job.yaml", JOB + "template: nosuch\n")
    return tmp_path


@pytest.mark.parametrize("name, expected", [
    ("badyaml.yaml", "badyaml.yaml:4: expected ',' or ']'"),
    ("unknown.yaml", "unknown.yaml:3: unknown key 'partiton' in slurm; did you mean 'partition'?"),
    ("wrongtype.yaml", "wrongtype.yaml:3: slurm.gpus_per_node: 'eight' is not a GPU count; use a number"),
    ("cycle-a.yaml", "cycle-b.yaml:2: extends: cycle"),
    ("badnodes.yaml", "badnodes.yaml:2: nodes: 'gpu[01-' is not a Slurm hostlist"),
    ("nl-job.yaml", "nl-job.yaml:4: name: contains a newline"),
    ("noprofile-job.yaml", "noprofile-job.yaml:1: profile: no profile file nope.yaml (a relative path"),
])
def test_validate_names_file_line_and_the_fix(files: Path, name: str, expected: str) -> None:
    assert refused(files, "validate", name).startswith(expected)


def test_sbatch_bound_values_with_newline_or_substitution_are_refused(files: Path) -> None:
    err = refused(files, "validate", "inject.yaml")
    assert "inject.yaml:3: slurm.account: contains a newline; values must be a single line" in err
    assert "inject.yaml:4: slurm.partition: 'gpu$(reboot)' contains '$', '(', ')'" in err
    err = refused(files, "render", "subst-job.yaml")
    assert err.startswith("subst-job.yaml:4: output:") and "$" in err


def test_validate_prints_every_problem_of_every_file_at_once(files: Path) -> None:
    err = refused(files, "validate", "badyaml.yaml", "unknown.yaml", "wrongtype.yaml", "inject.yaml",
                  "job.yaml")
    lines = err.splitlines()
    assert [line.split(":", 2)[:2] for line in lines] == [
        ["badyaml.yaml", "4"], ["unknown.yaml", "3"], ["wrongtype.yaml", "3"],
        ["inject.yaml", "3"], ["inject.yaml", "4"]]


def test_validate_good_file_passes(files: Path) -> None:
    done = run(files, "validate", "job.yaml")
    assert done.returncode == 0 and done.stdout == "1 file(s) valid\n", done.stderr


@pytest.mark.parametrize("args, expected", [
    (["render", "nosuch.yaml"], "'JOB_FILE': Path 'nosuch.yaml' does not exist"),
    (["render", "template-job.yaml"], "template-job.yaml:4: template: no template 'nosuch' on the search path"),
    (["render", "job.yaml", "-o", "missing-dir/job.sbatch"], "-o missing-dir/job.sbatch: cannot write"),
    (["profiles", "show", "nosuch"], "no profile 'nosuch' on the search path"),
    (["preflight", "--profile", "./nope.yaml"], "no profile file nope.yaml"),
    (["preflight", "--profile", "./badnodes.yaml"], "badnodes.yaml:2: nodes: 'gpu[01-' is not"),
    (["preflight", "--profile", "local-dev", "--nodes", "n[1-"], "--nodes 'n[1-': invalid hostlist"),
    (["preflight", "--profile", "local-dev", "--nodes", "n[3-1]"], "the range '3-1' is reversed"),
    (["preflight", "--profile", "local-dev", "--nodes", ""], "--nodes is empty"),
    (["preflight"], "Missing option '--profile'"),
    (["bench", "allreduce", "job.yaml", "--max-bytes", "lots"], "--max-bytes 'lots' is not a size"),
    (["bench", "allreduce", "job.yaml", "--max-bytes", "0"], "--max-bytes '0' is below"),
    (["status", "abc"], "Invalid value for 'JOB_ID': not a Slurm job id: 'abc'"),
    (["cancel", "1;rm -rf ~"], "not a Slurm job id"),
    (["logs", "--follow", "x"], "not a Slurm job id"),
    (["--profile-path", "no-such-dir", "profiles", "list"], "Directory 'no-such-dir' does not exist"),
])
def test_bad_input_exits_2_with_the_option_and_a_fix(files: Path, args: list[str], expected: str) -> None:
    err = refused(files, *args)
    assert expected in err, err
    # one-line message, then the fix (ours) or click's usage hint
    assert "fix:" in err or "Try 'clusterkit" in err or err.count("\n") == 1, err
    assert not (files / "missing-dir").exists()


def test_render_writes_nothing_on_bad_input(files: Path) -> None:
    refused(files, "render", "template-job.yaml", "-o", "out.sbatch")
    assert not (files / "out.sbatch").exists()
