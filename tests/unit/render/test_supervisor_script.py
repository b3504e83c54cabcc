"""The supervisor in a rendered script: exec'd with the launch as its command, its zip
app runs on the stdlib alone, and the benchmarks render the job without it."""
from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path

import pytest
from click.testing import CliRunner

from cluster_kit.cli import cli
from cluster_kit.config import specs
from cluster_kit.config.effective import effective
from cluster_kit.config.load import load_job
from cluster_kit.config.search import SearchPath
from cluster_kit.render.environment import render_job
from cluster_kit.supervisor.settings import (
    BadSettings,
    Resilience,
    Settings,
    parse_settings,
)

PROFILE = "slurm: {partition: gpu, time: '04:00:00', gpus_per_node: 4}\nenvironment: {python: /opt/venv/bin/python}\n"


def job_file(tmp_path: Path, text: str) -> Path:
    (tmp_path / "p.yaml").write_text(PROFILE)
    path = tmp_path / "job.yaml"
    path.write_text("profile: ./p.yaml\nscript: /bin/true\nnodes: 2\npreflight: false\n" + text)
    return path


def rendered(tmp_path: Path, text: str) -> str:
    result = CliRunner().invoke(cli, ["render", str(job_file(tmp_path, text))])
    assert result.exit_code == 0, result.output
    return result.output


def bundle_of(script: str) -> bytes:
    body = re.search(r"<<'(CLUSTERKIT_SUPERVISOR\w*)'\n(.*?)\n\1\n", script, re.DOTALL)
    assert body, "no supervisor heredoc"
    return base64.b64decode(body.group(2))


def test_the_script_execs_the_supervisor_with_the_launch_after_the_double_dash(tmp_path: Path) -> None:
    script = rendered(tmp_path, "resilience: {hang_timeout: 60, max_restarts: 2, exclude: never}\n")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    line = next(l for l in script.splitlines() if l.startswith("exec "))
    assert line.startswith('exec /opt/venv/bin/python "$clusterkit_supervisor" --bundle "$clusterkit_supervisor" '
                           "--settings '")
    words = shlex.split(line.rstrip("\\"))
    assert words[words.index("--settings") + 2:words.index("--") + 2] == [
        "--preflight-failed", "${clusterkit_preflight_failed:-}", "--script", "$0", "--", "srun"]
    settings = parse_settings(words[words.index("--settings") + 1])
    assert (settings.nodes, settings.tasks_per_node) == (2, 4)
    assert settings.resilience == Resilience(
        max_restarts=2, hang_timeout=60, startup_timeout=None, exclude="never", exclude_on="node_faults", grace=120,
        max_time_requeues=5, checkpoint_dir=None, spare_nodes=0, min_nodes=None, checkpoint_every=None,
        keep_checkpoints=3, mtbf_hours=None)


def test_every_resilience_key_of_the_spec_reaches_the_supervisor(tmp_path: Path) -> None:
    """Derived, not listed: the script hands the supervisor the effective `resilience:`
    (every key the job file's spec declares); a key the supervisor's settings do not
    know stops it (BadSettings), so a key added to the spec alone fails here."""
    line = next(l for l in rendered(tmp_path, "resilience: {}\n").splitlines() if l.startswith("exec "))
    words = shlex.split(line.rstrip("\\"))
    document = json.loads(words[words.index("--settings") + 1])
    assert set(document["resilience"]) == set(specs.RESILIENCE.fields)
    assert parse_settings(json.dumps(document)).resilience.to_dict() == document["resilience"]
    planted = dict(document, resilience={**document["resilience"], "new_key": 1})
    with pytest.raises(BadSettings, match="new_key"):
        parse_settings(json.dumps(planted))


def test_a_job_without_resilience_has_no_supervisor(tmp_path: Path) -> None:
    script = rendered(tmp_path, "")
    assert "clusterkit_supervisor" not in script and not [l for l in script.splitlines() if l.startswith("exec ")]


def test_the_zip_app_runs_on_the_stdlib_alone(tmp_path: Path) -> None:
    app = tmp_path / "supervisor"
    app.write_bytes(bundle_of(rendered(tmp_path, "resilience: {}\n")))
    names = zipfile.ZipFile(BytesIO(app.read_bytes())).namelist()
    assert "cluster_kit/supervisor/job.py" in names and "cluster_kit/analysis/culprit.py" in names
    assert not [n for n in names if n.startswith(("cluster_kit/config", "cluster_kit/commands"))]
    # -I: no site-packages and no cwd, so nothing of the installed clusterkit is found
    settings = Settings(2, 2, parse_settings(next(w for w in shlex.split(
        next(l for l in rendered(tmp_path, "resilience: {}\n").splitlines() if l.startswith("exec ")).rstrip("\\"))
        if w.startswith("{"))).resilience)
    done = subprocess.run([sys.executable, "-I", str(app), "--settings", settings.to_json(),
                           "--script", "/dev/null", "--", "true"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, check=False)
    assert (done.returncode, done.stderr) == (
        2, "clusterkit supervisor: SLURM_JOB_ID is not set: the supervisor runs inside a Slurm batch job\n")


@pytest.mark.parametrize("supervised", [True, False])
def test_the_benchmarks_render_the_job_without_its_supervisor(tmp_path: Path, supervised: bool) -> None:
    search = SearchPath.from_environment([], environ={}, cwd=tmp_path, home=tmp_path)
    settings = effective(load_job(job_file(tmp_path, "resilience: {grace: 30}\n"), search), supervised=supervised)
    script = render_job(settings, search.template_dirs())
    assert ("#SBATCH --signal=B:USR1@30" in script) is supervised
    assert ("#SBATCH --no-kill" in script) is supervised
    assert ("exec /opt/venv/bin/python \"$clusterkit_supervisor\"" in script) is supervised
