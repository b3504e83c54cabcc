"""Job files as new users wrote them (issue 24), fed exactly as reported, through the
real `validate` and `render` commands (in-process, real files, the shipped profiles).

Each rendered script is also run through `bash -n` and shellcheck.
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cluster_kit.cli import cli
from cluster_kit.config.search import builtin_dir

LOCAL_DEV = builtin_dir("profiles") / "local-dev.yaml"


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


def job_file(folder: Path, text: str) -> Path:
    """job.yaml with `text`, and the train.py it names next to it."""
    (folder / "train.py").write_text("print('hi')\n")
    path = folder / "job.yaml"
    path.write_text(text)
    return path


def rendered(job: Path) -> str:
    """`clusterkit render JOB` must pass; its script."""
    done = ck("render", str(job))
    assert done.exit_code == 0, done.stderr
    return done.stdout


def line_of(path: Path, start: str) -> int:
    """The number of the first line of `path` that starts with `start`."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(start))


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def assert_shell_clean(script: str, folder: Path) -> None:
    """`bash -n` and shellcheck (when installed) accept the script, warnings included."""
    path = folder / "job.sh"
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (CI installs it)")
    lint = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout


# ---------------------------------------------------------------- 1. a CPU job: gpus_per_node: 0

CPU_JOB = "profile: local-dev\nscript: train.py\nnodes: 2\ngpus_per_node: 0\n"


def test_gpus_per_node_0_validates(work: Path) -> None:
    done = ck("validate", str(job_file(work, CPU_JOB)))
    assert done.exit_code == 0, done.stderr
    assert done.stdout == "1 file(s) valid\n"


def test_gpus_per_node_0_renders_no_gpu_request_and_one_task_per_node(work: Path) -> None:
    script = rendered(job_file(work, CPU_JOB))
    lines = sbatch_lines(script)
    assert not [line for line in lines if "gpu" in line.lower()], lines  # local-dev asks for 4
    assert "#SBATCH --ntasks-per-node=1" in lines
    assert "--ntasks-per-node=1 --ntasks=\"$(( SLURM_JOB_NUM_NODES * 1 ))\"" in script
    assert_shell_clean(script, work)


def test_gpus_per_node_0_drops_the_profiles_gpu_gres_and_keeps_the_rest(work: Path) -> None:
    profile = work / "gres.yaml"
    profile.write_text(f"extends: {LOCAL_DEV}\nslurm:\n  gres: gpu:4,nvme:1\n  cpus_per_gpu: 2\n")
    script = rendered(job_file(work, CPU_JOB.replace("local-dev", str(profile))))
    lines = sbatch_lines(script)
    assert "#SBATCH --gres=nvme:1" in lines
    assert not [line for line in lines if "gpu" in line.lower()], lines
    assert_shell_clean(script, work)


def test_gpus_per_node_0_with_a_gpu_request_of_the_job_is_refused_at_its_line(work: Path) -> None:
    job = job_file(work, CPU_JOB + "slurm:\n  gres: gpu:2\n")
    done = ck("validate", str(job))
    assert done.exit_code == 2
    assert done.stderr.splitlines()[0] == (
        f"{job}:6: slurm.gres: 'gpu:2' asks for GPUs, but gpus_per_node: 0 asks for none; remove one of the two")


def test_the_in_job_preflight_of_a_cpu_job_expects_no_gpus(work: Path) -> None:
    """local-dev expects 4 GPUs and peermem of every node; a CPU job checks neither."""
    from cluster_kit.checks import evaluate

    no_gpus = {"gpu": {"status": "absent", "error": "nvidia-smi not found on PATH"},
               "peermem": {"status": "ok", "nvidia_peermem": False, "nv_peer_mem": False}}
    settings = _effective(job_file(work, CPU_JOB))
    ids = {finding.id for finding in evaluate(no_gpus, settings) if finding.status == "fail"}
    assert not {"gpu.count", "gpu.model", "gpu.driver", "rdma.peermem", "nccl.library"} & ids, ids
    gpu_job = _effective(job_file(work, CPU_JOB.replace("gpus_per_node: 0", "gpus_per_node: 2")))
    assert {"gpu.count", "rdma.peermem"} <= {f.id for f in evaluate(no_gpus, gpu_job) if f.status == "fail"}


def _effective(job: Path) -> dict:
    from cluster_kit.config.effective import effective
    from cluster_kit.config.load import load_job
    from cluster_kit.config.search import SearchPath

    return effective(load_job(job, SearchPath.from_environment(environ={}, cwd=job.parent, home=job.parent)))


@pytest.mark.parametrize(("value", "message"), [
    ("-1", "gpus_per_node: -1 is below 0; use 0 for a job without GPUs, or a number such as 8"),
    ("eight", ("gpus_per_node: 'eight' is not a GPU count; use a number such as 8 (0 for a job without "
              "GPUs), or type:count such as h100:8")),
])
def test_a_bad_gpu_count_says_what_to_write(work: Path, value: str, message: str) -> None:
    job = job_file(work, CPU_JOB.replace("gpus_per_node: 0", f"gpus_per_node: {value}"))
    done = ck("validate", str(job))
    assert done.exit_code == 2
    assert done.stderr.splitlines()[0] == f"{job}:4: {message}"


# ---------------------------------------------------------------- 2. more nodes than the profile lists

def test_more_nodes_than_the_profiles_hostlist_is_refused_at_the_jobs_line(work: Path) -> None:
    job = job_file(work, "profile: local-dev\nscript: train.py\nnodes: 3\n")
    for command in ("validate", "render"):
        done = ck(command, str(job))
        assert done.exit_code == 2, (command, done.stdout)
        assert done.stderr.splitlines()[0] == (
            f"{job}:3: nodes: 3 but profile local-dev lists 2 nodes (n[1-2]); fix: ask for at most 2 "
            f"(nodes: 2), or add nodes to the profile's `nodes:` ({LOCAL_DEV}:{line_of(LOCAL_DEV, 'nodes:')})")
        assert "Traceback" not in done.stderr


def test_as_many_nodes_as_listed_pass(work: Path) -> None:
    assert ck("validate", str(job_file(work, "profile: local-dev\nscript: train.py\nnodes: 2\n"))).exit_code == 0


def test_without_a_hostlist_in_the_profile_the_node_count_is_left_to_slurm(work: Path) -> None:
    profile = work / "no-list.yaml"
    profile.write_text("slurm: {partition: debug}\n")
    job = job_file(work, f"profile: {profile}\nscript: train.py\nnodes: 300\n")
    done = ck("validate", str(job))
    assert done.exit_code == 0, done.stderr
