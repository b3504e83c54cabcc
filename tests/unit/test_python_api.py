"""The Python API's surface: cheap to import, typed, errors with exit codes and fixes,
and submit's checks before anything reaches Slurm (no cluster needed for these)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import cluster_kit
from cluster_kit.config.search import builtin_dir

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("click", "jinja2", "yaml", "paramiko", "torch")


def test_importing_cluster_kit_loads_nothing_heavy() -> None:
    code = f"import json, sys, cluster_kit; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def test_the_api_names_are_there_and_typed() -> None:
    for name in ("submit", "submit_sweep", "Job", "JobResult", "ClusterKitError"):
        assert name in cluster_kit.__all__
        assert getattr(cluster_kit, name).__doc__
    assert (REPO / "cluster_kit" / "py.typed").exists()
    with pytest.raises(AttributeError):
        cluster_kit.nothing_here  # noqa: B018


def test_errors_carry_the_cli_exit_code_and_fix() -> None:
    from cluster_kit.errors import CheckFailed, ClusterRefused, InputError

    assert issubclass(InputError, cluster_kit.ClusterKitError)
    assert (InputError("x").exit_code, CheckFailed("x").exit_code, ClusterRefused("x").exit_code) == (2, 1, 3)
    assert InputError("x", fix="do y").fix == "do y"


@pytest.fixture
def job(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "job.yaml"
    path.write_text(f"profile: {builtin_dir('profiles') / 'local-dev.yaml'}\nscript: train.py\nnodes: 1\n"
                    "gpus_per_node: 0\n")
    return path


def test_a_bad_override_raises_before_anything_is_submitted(job: Path) -> None:
    with pytest.raises(cluster_kit.ClusterKitError) as caught:
        cluster_kit.submit(job, overrides={"slurm.tme": "01:00:00"})
    assert caught.value.exit_code == 2
    assert caught.value.message.startswith("overrides['slurm.tme']: unknown key 'tme' in slurm")


def test_a_bad_sweep_value_names_its_key(job: Path) -> None:
    with pytest.raises(cluster_kit.ClusterKitError) as caught:
        cluster_kit.submit_sweep(job, {"nodes": [1, "two"]})
    assert caught.value.exit_code == 2
    assert "sweep nodes: nodes: expected an integer" in caught.value.message


def test_an_empty_sweep_is_refused(job: Path) -> None:
    with pytest.raises(cluster_kit.ClusterKitError, match="give a non-empty list"):
        cluster_kit.submit_sweep(job, {"env.LR": []})


def test_a_bad_job_id_is_refused() -> None:
    with pytest.raises(cluster_kit.ClusterKitError) as caught:
        cluster_kit.Job.attach("12; rm -rf /")
    assert caught.value.exit_code == 2


def test_a_bad_after_is_refused(job: Path) -> None:
    with pytest.raises(cluster_kit.ClusterKitError, match="--after 12:later"):
        cluster_kit.submit(job, after="12:later", preflight=False)


def test_a_missing_job_file_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(cluster_kit.ClusterKitError) as caught:
        cluster_kit.submit(tmp_path / "nope.yaml")
    assert caught.value.exit_code == 2
