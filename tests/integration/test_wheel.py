"""The wheel works outside the checkout: built-in profiles and templates come from it.

Builds a wheel from a copy of the sources, installs it with its dependencies into a
fresh venv, and runs that venv's `clusterkit` from a folder that is not the checkout.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["cluster_kit", "templates", "profiles", "setup.cfg", "pyproject.toml", "README.md"]
BUILT_IN_PROFILES = {"base", "dev-nodes", "ib-ndr", "local-dev", "roce-v2", "tcp-only"}


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, f"{argv}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(venv's clusterkit, a work folder outside the checkout, the environment to run it in)."""
    root = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "CLUSTERKIT_PATH", "CLUSTERKIT_PROFILE")}
    env["HOME"] = str(root)  # no ~/.config/clusterkit of the machine's user
    # build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout
    source = root / "src"
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, source / name)  # type: ignore[operator]
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(root / "dist"), str(source)], root, env)
    wheel = next((root / "dist").glob("clusterkit-*.whl"))
    venv = root / "venv"
    run([sys.executable, "-m", "venv", str(venv)], root, env)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], root, env)
    work = root / "work"
    work.mkdir()
    return venv / "bin" / "clusterkit", work, env


def site_packages(clusterkit: Path) -> Path:
    return next((clusterkit.parent.parent / "lib").glob("python3*/site-packages"))


def test_profiles_list_finds_the_built_ins_in_the_wheel(installed: tuple[Path, Path, dict[str, str]]) -> None:
    clusterkit, work, env = installed
    rows = run([str(clusterkit), "profiles", "list"], work, env).stdout.splitlines()[1:]
    found = dict(row.split(None, 1) for row in rows)
    assert set(found) == BUILT_IN_PROFILES
    package = site_packages(clusterkit) / "cluster_kit" / "profiles"
    for name, path in found.items():
        assert Path(path) == package / f"{name}.yaml"
        assert str(REPO) not in path


def test_render_outside_the_checkout_uses_the_wheels_templates(
        installed: tuple[Path, Path, dict[str, str]]) -> None:
    clusterkit, work, env = installed
    shutil.copy2(REPO / "examples" / "train_ddp.py", work / "train_ddp.py")  # the jobs' script
    for example in ("cpu-ddp.yaml", "gpu-ddp.yaml"):  # gpu-ddp embeds the in-job preflight
        shutil.copy2(REPO / "examples" / example, work / example)
        script = run([str(clusterkit), "render", example, "-o", "job.sbatch"], work, env)
        assert script.stdout == ""
        text = (work / "job.sbatch").read_text()
        assert text.startswith("#!/bin/bash\n#SBATCH --job-name=")
        assert 'from template "ddp"' in text
    shown = run([str(clusterkit), "profiles", "show", "local-dev"], work, env).stdout
    assert shown.startswith(f"# {site_packages(clusterkit) / 'cluster_kit' / 'profiles' / 'local-dev.yaml'}\n")
    # where templates are searched: the wheel's folder, never the checkout's
    (work / "job.yaml").write_text("profile: local-dev\nscript: train_ddp.py\nnodes: 1\ntemplate: nosuch\n")
    done = subprocess.run([str(clusterkit), "render", "job.yaml"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert str(site_packages(clusterkit) / "cluster_kit" / "templates") in done.stderr
    assert str(REPO) not in done.stderr


def test_every_module_of_the_package_is_in_the_wheel(installed: tuple[Path, Path, dict[str, str]]) -> None:
    clusterkit, work, env = installed
    modules = sorted(".".join(p.relative_to(REPO).with_suffix("").parts)
                     for p in (REPO / "cluster_kit").rglob("*.py") if p.name != "__main__.py")
    wheel = site_packages(clusterkit)
    missing = [m for m in modules if not (wheel / Path(*m.split("."))).with_suffix(".py").exists()]
    assert missing == [], "add their packages to setup.cfg's packages"
    run([str(clusterkit), "diagnose", "--help"], work, env)  # the job commands import cluster_kit.lifecycle
