"""`clusterkit render` stays light: neither paramiko (SSH) nor torch is imported.

Checked in a fresh interpreter, since the test process may already hold either.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("paramiko", "torch", "cryptography")

RENDER_IN_PROCESS = """
import json, sys
from cluster_kit.cli import cli
after_import = sorted(m for m in {heavy!r} if m in sys.modules)
try:
    cli(["render", sys.argv[1], "-o", sys.argv[2]], prog_name="clusterkit")
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps({{"import": after_import, "render": sorted(m for m in {heavy!r} if m in sys.modules)}}))
"""


@pytest.mark.parametrize("job", ["cpu-ddp.yaml", "gpu-ddp.yaml"])
def test_render_imports_no_ssh_or_torch(job: str, tmp_path: Path) -> None:
    code = RENDER_IN_PROCESS.format(heavy=HEAVY)
    out = tmp_path / "job.sbatch"
    done = subprocess.run([sys.executable, "-c", code, str(REPO / "examples" / job), str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded == {"import": [], "render": []}
    assert out.read_text().startswith("#!/bin/bash\n")
