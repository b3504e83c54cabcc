"""The supervisor's zip app carries what its diagnosis needs and runs it on Python 3.8."""
from __future__ import annotations

import glob
import io
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from cluster_kit.supervisor.bundle import MODULES, build_bundle

DATA = Path(__file__).resolve().parents[2] / "data"


def python38() -> str | None:
    found = glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8"))
    return found[0] if found else None


def test_the_bundle_holds_the_blame_modules() -> None:
    names = zipfile.ZipFile(io.BytesIO(build_bundle())).namelist()
    for module in ("analysis/faults.py", "analysis/culprit.py", "slurm/builders.py", "slurm/node_names.py"):
        assert module in MODULES and f"cluster_kit/{module}" in names


@pytest.mark.skipif(python38() is None, reason="no Python 3.8 interpreter here")
def test_the_blame_runs_from_the_bundle_on_python_38(tmp_path: Path) -> None:
    app = tmp_path / "supervisor.pyz"
    app.write_bytes(build_bundle())
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import cluster_kit.supervisor.job  # every module of the bundle loads on 3.8\n"
        "from cluster_kit.analysis import culprit, rank_files\n"
        "from cluster_kit.slurm import builders, node_names\n"
        "from cluster_kit.supervisor import decide\n"
        "nodes = builders.parse_scontrol_show_nodes(open(sys.argv[2]).read())\n"
        "crash = culprit.first_failure(rank_files.read_exceptions(sys.argv[3]), rank_files.read_failure_files(sys.argv[3]), 4)\n"
        "ended, blamed = decide.attempt_end(1, decide.Evidence(crash=crash, now=crash.time + 2))\n"
        "print(ended, blamed['kind'], blamed['ranks'], blamed['detected_after_s'])\n"
        "print(decide.on_slurm_names(dict(blamed, hosts=['gpu002', 'vm']), node_names.slurm_names(['gpu002', 'vm'], nodes))['hosts'])\n"
    )
    done = subprocess.run([python38() or "", "-I", "-c", code, str(app), str(DATA / "slurm" / "scontrol_show_node_fqdn.stdout"),
                           str(DATA / "flight_recorder" / "timeout")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["crash node [3] 2.0", "['n2']"]
