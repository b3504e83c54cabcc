"""A training script on nodes whose python has torch and nothing of clusterkit's own
dependencies (no click, jinja2, yaml, paramiko): the trainer imports from a checkout on
its path, and a supervised job crashes, resumes from its checkpoint and completes.

The python is a real one: a virtual environment of /usr/bin/python3 (as the dev
cluster's, see scripts/devcluster/torch-python) whose only site folder holds torch and
what torch needs to import, and whose path has the checkout's folder.
"""
from __future__ import annotations

import json
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from jobcli import REPO, clusterkit, write_yaml
from keeptrain import CHAIN_TIMEOUT_S, chain_record, job, log_of, side_profile

# clusterkit's own dependencies (and those of jinja2): none of them is on that python
LEFT_OUT = ("click", "jinja2", "markupsafe", "pyyaml", "paramiko", "packaging", "setuptools")
MODULES_LEFT_OUT = ("click", "jinja2", "yaml", "paramiko")


def _requirement(text: str) -> str:
    return re.split(r"[ ;<>=!~\[(]", text, maxsplit=1)[0].lower().replace("_", "-")


def torch_alone(folder: Path) -> Path:
    """A python with torch, what torch needs to import, numpy, and the checkout on its path: its path."""
    wanted, todo = set(), ["torch", "numpy"]  # numpy: torch's object collectives need it
    while todo:
        name = todo.pop()
        if name in wanted or name in LEFT_OUT:
            continue
        wanted.add(name)
        todo += [_requirement(r) for r in metadata.requires(name) or () if "extra ==" not in r]
    site = folder / "site"
    site.mkdir(parents=True)
    for name in wanted:
        distribution = metadata.distribution(name)
        for top in {f.parts[0] for f in distribution.files or () if len(f.parts) > 1 or f.suffix == ".py"}:
            if top.endswith(".dist-info") or top in ("..", "__pycache__", "bin"):
                continue
            source = Path(str(distribution.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    venv = folder / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, check=True).stdout.strip()
    (Path(packages) / "torch-alone.pth").write_text(f"{site}\n{REPO}\n")
    return python


@pytest.mark.side_partition
def test_a_supervised_job_on_a_python_with_torch_alone_resumes_from_its_checkpoint(
        dev_cluster: Any, keep_folder: Path) -> None:
    python = torch_alone(keep_folder / "torch-alone")
    for module in MODULES_LEFT_OUT:
        found = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, check=False)
        assert found.returncode == 1 and "ModuleNotFoundError" in found.stderr, (module, found.stderr)
    code = ("import sys, torch, torch.distributed\nfrom cluster_kit import checkpoint, ddp\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'click', 'jinja2', 'yaml', 'paramiko'}))")
    imported = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/", check=False)
    assert imported.returncode == 0 and imported.stdout.strip() == "[]", imported.stderr

    profile = write_yaml(keep_folder / "torch-alone.yaml", {
        "name": "torch-alone", "extends": side_profile(keep_folder), "environment": {"python": str(python)}})
    crashed = job(keep_folder, "ck-torch-alone", "--plant", "0:raise:1:6", profile=str(profile))
    rendered = clusterkit(dev_cluster, "submit", str(crashed), "--dry-run")
    assert rendered.returncode == 0 and str(python) in rendered.stdout, rendered.stderr
    waited = clusterkit(dev_cluster, "submit", str(crashed), "--no-preflight", "--wait", "--json",
                        timeout=CHAIN_TIMEOUT_S)
    assert waited.returncode == 0, waited.stderr
    doc = json.loads(waited.stdout)
    job_id, attempts = doc["job_id"], doc["attempts"]
    assert doc["exit_code"] == 0 and [a["ended"] for a in attempts] == ["crash", "completed"], attempts
    record = chain_record(keep_folder, job_id)
    assert [a["ended"] for a in record["attempts"]] == ["crash", "completed"]
    assert record["attempts"][0]["culprit"]["ranks"] == [1] and not record["attempts"][0].get("excluded")
    assert "rank 0: attempt 1 starts at step 4 of" in log_of(record["attempts"][1])  # the checkpoint before
    saved = sorted(p.name for p in (keep_folder / "ck-torch-alone.ckpt").iterdir())
    assert saved, "no checkpoint was written"
    assert (keep_folder / "ck-torch-alone.weights").stat().st_size > 0
