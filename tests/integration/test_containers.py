"""Jobs inside pyxis/enroot images on the dev cluster's real Slurm (scripts/devcluster/containers).

The image is Debian minbase with python3 and, in its /etc/environment, the kind of
defaults images ship: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME=image0 and
MASTER_ADDR=image-default. torch comes from the checkout's virtualenv, mounted
into the container with the interpreter it was made from. The jobs are submitted
together when the module starts (each container step unpacks the image first).
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jobcli import REPO, clusterkit, finish, rank_lines, start, write_yaml

pytestmark = pytest.mark.integration

ENV_SCRIPT = """\
import os, runpy, sys
keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
print("ck-env " + " ".join("%s=%s" % (k, os.environ.get(k, "?")) for k in keys), flush=True)
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def release_sources() -> list[Path]:
    """The enroot and pyxis release tarballs scripts/devcluster/containers builds from, where it looks."""
    folders = [Path(p) for p in (os.environ.get("CLUSTERKIT_THIRD_PARTY"),) if p]
    folders.append(REPO.parent / "shared" / "third_party")
    for folder in folders:
        found = sorted(folder.glob("enroot-*.tar.gz"))[:1] + sorted(folder.glob("pyxis-*.tar.gz"))[:1]
        if len(found) == 2:
            return found
    return []


def runtime_required() -> str | None:
    """Why a missing runtime must fail rather than skip: asked to, or CI with the sources at hand."""
    if os.environ.get("CLUSTERKIT_REQUIRE_CONTAINERS") == "1":
        return "CLUSTERKIT_REQUIRE_CONTAINERS=1"
    sources = release_sources()
    if os.environ.get("CI") == "true" and sources:
        return f"CI=true and the sources are here ({', '.join(str(p) for p in sources)})"
    return None


def images(dev_cluster: Any) -> Path:
    """The dev cluster's image folder; skips without pyxis, but fails when runtime_required().

    scripts/devcluster/containers installs the runtime from release sources it finds
    ($CLUSTERKIT_THIRD_PARTY, ../shared/third_party) or downloads; a machine with
    neither has no container runtime to test against. CI has the sources, so there
    a runtime that did not build is a lost capability, not a reason to skip."""
    folder = dev_cluster.state_dir / "images"
    helps = subprocess.run(["srun", "--help"], env=dev_cluster.slurm_env(), capture_output=True,
                           text=True, timeout=30, check=False).stdout
    missing = [] if "--container-image" in helps else ["pyxis in Slurm's plugstack"]
    missing += [str(p) for p in (folder / "python.sqsh", folder / "nopython.sqsh") if not p.exists()]
    if missing:
        why = f"no container runtime on the dev cluster ({', '.join(missing)}): see scripts/devcluster/containers"
        required = runtime_required()
        if required:
            pytest.fail(f"{why}; required because {required}", pytrace=False)
        pytest.skip(why)
    return folder


def mounts(tmp_path: Path) -> list[str]:
    """The checkout (venv + examples), the venv's base interpreter, the test's folder,
    and any other folder this Python imports from (a venv's .pth may point elsewhere)."""
    out = [f"{REPO}:{REPO}:ro", f"{tmp_path}:{tmp_path}"]
    base = Path(sys.base_prefix).resolve()
    if base != Path("/usr"):  # /usr/bin/python3 of the same Debian is in the image already
        out.append(f"{base}:{base}:ro")
    covered = [REPO, base, Path("/usr")]
    for entry in sys.path:
        path = Path(entry).resolve() if entry else None
        if path and path.is_dir() and not any(path.is_relative_to(c) for c in covered):
            out.append(f"{path}:{path}:ro")
            covered.append(path)
    return out


def container_job(tmp_path: Path, name: str, image: Path, **keys: Any) -> Path:
    profile = write_yaml(tmp_path / "ck-ct.yaml", {
        "name": "ck-ct", "nodes": "n[1-2]",
        "slurm": {"partition": "debug", "time": "00:05:00", "exclusive": False},
        "network": {"fabric": "ethernet", "socket_ifname": "lo"},
        "environment": {"python": str(REPO / ".venv" / "bin" / "python"), "env": {"OMP_NUM_THREADS": "1"}},
    })
    # gpus_per_node 0: a CPU job (the in-job preflight then accepts the CPU build of torch)
    job = {"name": name, "profile": str(profile), "nodes": 2, "gpus_per_node": 0, "launcher": "srun",
           "script": str(REPO / "examples" / "train_ddp.py"), "args": ["--steps", "3"],
           "output": f"{tmp_path}/%x-%j.out", "preflight": True,
           "slurm": {"ntasks_per_node": 2},
           "container": {"image": str(image), "mounts": mounts(tmp_path)}, **keys}
    return write_yaml(tmp_path / f"{name}.yaml", job)


@pytest.fixture(scope="module")
def runs(dev_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """{case: (Popen of `submit --wait`, its folder)}, all started at once."""
    folder = images(dev_cluster)
    cases: dict[str, Any] = {}
    ddp = tmp_path_factory.mktemp("ct-ddp")
    wrapper = ddp / "env_then_train.py"
    wrapper.write_text(ENV_SCRIPT)
    cases["ddp"] = container_job(ddp, "ct-ddp", folder / "python.sqsh", script=str(wrapper),
                                 args=[str(REPO / "examples" / "train_ddp.py"), "--steps", "3"]), ddp
    nopy = tmp_path_factory.mktemp("ct-nopy")
    cases["nopython"] = container_job(nopy, "ct-nopy", folder / "nopython.sqsh"), nopy
    gone = tmp_path_factory.mktemp("ct-gone")
    cases["missing"] = container_job(gone, "ct-gone", gone / "no-such-image.sqsh", preflight=False), gone
    procs = {case: (start(dev_cluster, "submit", str(job), "--no-preflight", "--wait"), where)
             for case, (job, where) in cases.items()}
    yield procs
    for proc, _where in procs.values():
        if proc.poll() is None:
            proc.kill()


def outcome(runs: dict[str, Any], case: str) -> tuple[subprocess.CompletedProcess[str], str]:
    proc, folder = runs[case]
    done = finish(proc, timeout=480)
    log = "".join(p.read_text() for p in sorted(Path(folder).glob("*.out")))
    return done, log


def test_ddp_runs_inside_the_image_with_the_jobs_own_values(runs: dict[str, Any]) -> None:
    done, log = outcome(runs, "ddp")
    assert done.returncode == 0, done.stdout + done.stderr + log
    envs = rank_lines(log, "ck-env")
    assert sorted(envs) == [0, 1, 2, 3], log
    for fields in envs.values():
        # the image says image0 / image-default; --container-env keeps the script's values
        assert (fields["WORLD_SIZE"], fields["MASTER_ADDR"]) == ("4", "n1"), log
        assert (fields["NCCL_SOCKET_IFNAME"], fields["GLOO_SOCKET_IFNAME"]) == ("lo", "lo"), log
    assert log.count(" expected=10 ok") == 4, log  # every rank's all-reduce over Gloo
    assert "weights_in_sync=true ok" in log, log
    assert "preflight" not in log.lower() or "failed" not in log.lower(), log


def test_image_without_python3_is_stopped_by_the_in_job_preflight(runs: dict[str, Any]) -> None:
    done, log = outcome(runs, "nopython")
    assert done.returncode == 1, done.stdout + done.stderr + log
    assert "the container image has no python3 with its standard library" in log, log
    assert "apt-get install -y python3" in log and "training was not started" in log, log
    assert "allreduce_sum" not in log, log


def test_missing_image_fails_with_pyxis_named(runs: dict[str, Any], dev_cluster: Any) -> None:
    done, log = outcome(runs, "missing")
    assert done.returncode == 1, done.stdout + done.stderr + log
    assert "pyxis" in log and "no-such-image.sqsh" in log, log


def test_validate_names_the_line_of_a_bad_container_key(dev_cluster: Any, tmp_path: Path) -> None:
    job = container_job(tmp_path, "ct-bad", tmp_path / "x.sqsh")
    data = yaml.safe_load(job.read_text())
    data["container"].update(runtime="docker", mounts=["relative:/x"])
    write_yaml(job, data)
    done = clusterkit(dev_cluster, "validate", str(job))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = {line.split(": ", 1)[1] for line in done.stderr.splitlines() if line.startswith(str(job))}
    assert any(line.startswith("container.runtime: ") and "pyxis | apptainer" in line for line in lines), done.stderr
    assert any("container.mounts[0]" in line and "absolute path" in line for line in lines), done.stderr
