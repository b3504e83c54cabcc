"""Job files as new users wrote them (issue 24), fed exactly as reported, through the
real `validate` and `render` commands (in-process, real files, the shipped profiles).

Each rendered script is also run through `bash -n` and shellcheck.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import clirun
import pytest
from clirun import ck

from cluster_kit.config.search import builtin_dir

work = clirun.work  # the fixture: an empty folder as cwd and HOME

LOCAL_DEV = builtin_dir("profiles") / "local-dev.yaml"


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

    cpu_torch = {"status": "ok", "python": "python3", "version": "2.13.0+cpu", "cuda": None,
                 "cuda_available": False, "device_count": 0, "nccl": None, "distributed_nccl": False}
    no_gpus = {"gpu": {"status": "absent", "error": "nvidia-smi not found on PATH"}, "slurm_node": "n1",
               "peermem": {"status": "ok", "nvidia_peermem": False, "nv_peer_mem": False}, "torch": cpu_torch}
    profile = work / "gpu-torch.yaml"  # local-dev, but demanding a CUDA torch as real clusters do
    profile.write_text(f"extends: {LOCAL_DEV}\nexpect: {{torch_cuda: true}}\n")
    settings = _effective(job_file(work, CPU_JOB.replace("local-dev", str(profile))))
    ids = {finding.id for finding in evaluate(no_gpus, settings, deep=True) if finding.status == "fail"}
    assert not {"gpu.count", "gpu.model", "gpu.driver", "rdma.peermem", "nccl.library", "nccl.torch"} & ids, ids
    gpu_job = _effective(job_file(work, CPU_JOB.replace("gpus_per_node: 0", "gpus_per_node: 2")
                                  .replace("local-dev", str(profile))))
    failed = {f.id for f in evaluate(no_gpus, gpu_job, deep=True) if f.status == "fail"}
    assert {"gpu.count", "rdma.peermem", "nccl.torch"} <= failed


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
    job = job_file(work, "profile: local-dev\nscript: train.py\nnodes: 5\n")
    for command in ("validate", "render"):
        done = ck(command, str(job))
        assert done.exit_code == 2, (command, done.stdout)
        assert done.stderr.splitlines()[0] == (
            f"{job}:3: nodes: 5 but profile local-dev lists 4 nodes (n[1-4]); fix: ask for at most 4 "
            f"(nodes: 4), or add nodes to the profile's `nodes:` ({LOCAL_DEV}:{line_of(LOCAL_DEV, 'nodes:')})")
        assert "Traceback" not in done.stderr


def test_as_many_nodes_as_listed_pass(work: Path) -> None:
    assert ck("validate", str(job_file(work, "profile: local-dev\nscript: train.py\nnodes: 4\n"))).exit_code == 0


def test_without_a_hostlist_in_the_profile_the_node_count_is_left_to_slurm(work: Path) -> None:
    profile = work / "no-list.yaml"
    profile.write_text("slurm: {partition: debug}\n")
    job = job_file(work, f"profile: {profile}\nscript: train.py\nnodes: 300\n")
    done = ck("validate", str(job))
    assert done.exit_code == 0, done.stderr


# ---------------------------------------------------------------- 3. the job's own environment

def profile_with_setup(folder: Path) -> Path:
    path = folder / "profiles" / "venv-profile.yaml"
    path.parent.mkdir()
    path.write_text(f"extends: {LOCAL_DEV}\nenvironment:\n  python: python3\n"
                    "  setup: ['. /opt/profile-venv/bin/activate']\n  env: {FROM_PROFILE: p, SHARED: p}\n")
    return path


def task_python(script: str) -> str:
    """The interpreter the srun line starts (the word after `clusterkit-task`)."""
    line = next(line for line in script.splitlines() if line.lstrip().startswith("clusterkit-task "))
    return line.split()[1]


def test_the_job_files_environment_overrides_the_profiles(work: Path) -> None:
    profile = profile_with_setup(work)
    job = job_file(work, f"profile: {profile}\nscript: train.py\nnodes: 2\n"
                         "environment:\n  python: /opt/job-venv/bin/python\n"
                         "  setup: ['. /opt/job-venv/bin/activate']\n  env: {SHARED: e, FROM_ENVIRONMENT: e}\n"
                         "env: {FROM_ENVIRONMENT: top}\n")
    assert ck("validate", str(job)).exit_code == 0
    script = rendered(job)
    assert ". /opt/job-venv/bin/activate" in script.splitlines()
    assert "/opt/profile-venv" not in script                     # setup lines replace the profile's
    assert task_python(script) == "/opt/job-venv/bin/python"
    exports = [line for line in script.splitlines() if line.startswith("export ")]
    assert "export FROM_PROFILE=p" in exports and "export SHARED=e" in exports
    assert "export FROM_ENVIRONMENT=top" in exports               # the top-level env: wins
    assert_shell_clean(script, work)


def test_a_job_setting_only_its_python_keeps_the_profiles_setup_lines(work: Path) -> None:
    profile = profile_with_setup(work)
    script = rendered(job_file(work, f"profile: {profile}\nscript: train.py\nnodes: 1\n"
                                     "environment: {python: /opt/job-venv/bin/python}\n"))
    assert ". /opt/profile-venv/bin/activate" in script.splitlines()
    assert task_python(script) == "/opt/job-venv/bin/python"


def test_relative_pythons_start_at_the_file_that_sets_them(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's at the job file's folder (the workdir when it has one), the profile's at
    the profile's folder; wherever render runs from."""
    profile = work / "profiles" / "rel.yaml"
    profile.parent.mkdir()
    profile.write_text(f"extends: {LOCAL_DEV}\nenvironment: {{python: ../venvs/p/bin/python}}\n")
    jobs = work / "jobs"
    jobs.mkdir()
    by_profile = job_file(jobs, f"profile: {profile}\nscript: train.py\nnodes: 1\n")
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert task_python(rendered(by_profile)) == f"{work}/venvs/p/bin/python"
    by_job = by_profile.with_name("own.yaml")
    by_job.write_text(by_profile.read_text() + "environment: {python: .venv/bin/python}\n")
    assert task_python(rendered(by_job)) == f"{jobs}/.venv/bin/python"
    in_workdir = by_profile.with_name("workdir.yaml")
    in_workdir.write_text(by_job.read_text() + f"workdir: {jobs}\n")
    assert task_python(rendered(in_workdir)) == ".venv/bin/python"  # the job starts in its workdir


def test_a_python_under_tilde_is_refused_at_its_line(work: Path) -> None:
    job = job_file(work, "profile: local-dev\nscript: train.py\nenvironment:\n  python: ~/venv/bin/python\n")
    done = ck("validate", str(job))
    assert done.exit_code == 2
    assert done.stderr.splitlines()[0] == (
        f"{job}:4: environment.python: '~/venv/bin/python' starts with ~, which the job does not expand "
        "(the value is quoted); write the full path, e.g. /home/alice/venv/bin/python")


def test_the_schema_has_the_jobs_environment_and_cpu_jobs(work: Path) -> None:
    import json

    schema = json.loads(ck("schema", "job").stdout)
    environment = schema["properties"]["environment"]
    assert sorted(environment["properties"]) == ["env", "modules", "python", "setup"]
    assert environment["additionalProperties"] is False
    assert {"type": "integer", "minimum": 0} in schema["properties"]["gpus_per_node"]["anyOf"]


# ---------------------------------------------------------------- 4. the shipped local-dev profile

def test_local_dev_renders_the_same_python_from_any_folder(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its python is a full path (the dev cluster's venv) and its setup lines, if any,
    name nothing relative: a job finds torch wherever it was submitted from."""
    scripts = []
    for folder in ("a", "b/c"):
        where = work / folder
        where.mkdir(parents=True)
        monkeypatch.chdir(where)
        scripts.append(rendered(job_file(where, "profile: local-dev\nscript: train.py\nnodes: 1\n")))
    pythons = {task_python(script) for script in scripts}
    assert pythons == {"/tmp/clusterkit-dev/venv/bin/python"}
    for script in scripts:
        assert ".venv/bin/activate" not in script
