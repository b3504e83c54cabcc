"""Running the click commands in-process, as a new user would in an empty folder."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cluster_kit.cli import cli


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
