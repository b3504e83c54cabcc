"""What a new user runs into, fed exactly that input: each message names FILE:LINE or the
node, says what to do, and `validate` refuses what `render` and `submit` would.

Most cases run the click command in-process (CliRunner, real files in a temporary
folder); a few run the real `clusterkit` process where the exit path matters.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cluster_kit.cli import cli
from cluster_kit.config import SearchPath, builtin_dir, load_profile

BUILTIN_PROFILES = sorted(p.stem for p in builtin_dir("profiles").glob("*.yaml"))


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty folder as cwd and HOME, with no CLUSTERKIT_* settings."""
    for name in ("CLUSTERKIT_PATH", "CLUSTERKIT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def ck(*args: str) -> Result:
    """`clusterkit ARGS...` in-process; stdout and stderr kept apart."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---------------------------------------------------------------- profiles show | validate


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_what_profiles_show_prints_is_a_valid_profile_with_the_same_settings(work: Path, name: str) -> None:
    shown = ck("profiles", "show", name)
    assert shown.exit_code == 0, shown.stderr
    assert ": null" not in shown.stdout and ": []" not in shown.stdout and ": {}" not in shown.stdout
    copy = write(work / f"{name}-copy.yaml", shown.stdout)
    checked = ck("validate", str(copy))
    assert checked.exit_code == 0, checked.stderr
    assert checked.stdout == "1 file(s) valid\n"
    search = SearchPath.from_environment()
    assert load_profile(str(copy), search).data == load_profile(name, search).data


def test_the_dev_nodes_profile_ships() -> None:
    assert "dev-nodes" in BUILTIN_PROFILES and "local-dev" in BUILTIN_PROFILES
    assert os.path.basename(str(builtin_dir("profiles"))) == "profiles"


# ---------------------------------------------------------------- YAML slips


@pytest.mark.parametrize("command", ["validate", "render"])
def test_bad_indentation_prints_a_hint_beyond_pyyamls_words(work: Path, command: str) -> None:
    job = write(work / "job.yaml", "profile: local-dev\nscript: t.py\nslurm:\n    partition: debug\n"
                                   "  time: \"00:01:00\"\n")
    done = ck(command, str(job))
    assert done.exit_code == 2 and done.stdout == ""
    assert done.stderr == (f"{job}:5: expected <block end>, but found '<block mapping start>' (while parsing "
                           "a block mapping started on line 1); line 5 (`time:`) is indented 2 spaces, which "
                           "lines up with no key above it: indent it 4 spaces like `partition:` on line 4 "
                           "or 0 spaces like `slurm:` on line 3\n")
