"""`scripts/dev-cluster up` reaches a working cluster from any earlier state.

Each test leaves the cluster in a state an earlier run could have left it in (an
`up` without the container runtime, daemons killed, a node frozen by `fail`), runs
`up` once, and checks the cluster works: jobs on every node, containers, SSH.
"""
from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from conftest import SCRIPT, start_dev_cluster
from test_containers import images

if TYPE_CHECKING:
    from conftest import DevCluster

pytestmark = pytest.mark.integration


def up(cluster: DevCluster, **env: str) -> str:
    done = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, check=False,
                          env={**os.environ, "CLUSTERKIT_DEV_DIR": str(cluster.state_dir), **env})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def srun(cluster: DevCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["srun", "--immediate=60", *args], capture_output=True, text=True,
                          timeout=180, check=False, env=cluster.slurm_env())


def pid_of(cluster: DevCluster, name: str) -> int:
    return int((cluster.state_dir / "run" / f"{name}.pid").read_text().strip())


@pytest.fixture
def restored(dev_cluster: DevCluster) -> Iterator[DevCluster]:
    """The dev cluster, brought back with a plain `up` whatever the test left."""
    yield dev_cluster
    start_dev_cluster()


def test_up_after_an_up_without_the_container_runtime(restored: DevCluster) -> None:
    folder = images(restored)  # the runtime exists here (else: skipped, or failed on CI)
    out = up(restored, CLUSTERKIT_DEV_CONTAINERS="off")
    assert "container runtime left out" in out
    assert "--container-image" not in srun(restored, "--help").stdout

    up(restored)
    done = srun(restored, "-N1", f"--container-image={folder / 'python.sqsh'}",
                "python3", "-c", "print('in the image', 6 * 7)")
    assert done.returncode == 0, done.stderr
    assert "in the image 42" in done.stdout


def test_up_after_daemons_died_and_a_node_froze(restored: DevCluster) -> None:
    ssh_node = next(name for name, kind in restored.kinds.items() if kind == "fake")
    frozen = subprocess.run([str(SCRIPT), "fail", "n3"], capture_output=True, text=True, timeout=60,
                            check=False, env={**os.environ, "CLUSTERKIT_DEV_DIR": str(restored.state_dir)})
    assert frozen.returncode == 0, frozen.stderr
    os.kill(pid_of(restored, "slurmctld"), signal.SIGKILL)
    os.kill(pid_of(restored, f"sshd-{ssh_node}"), signal.SIGKILL)

    up(restored)
    done = srun(restored, "-N3", "hostname")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["n1", "n2", "n3"]
    assert restored.ssh(ssh_node, "hostname").stdout.strip() == ssh_node



def test_up_from_another_checkout_restarts_the_sshds_it_reconfigures(restored: DevCluster) -> None:
    ssh_node = next(name for name, kind in restored.kinds.items() if kind == "fake")
    conf = (restored.state_dir / "sshd" / f"{ssh_node}.conf").read_text()
    if "LD_LIBRARY_PATH=" not in conf:
        pytest.skip("the fake nodes have no NCCL library to point elsewhere")
    lib = conf.split("LD_LIBRARY_PATH=", 1)[1].split()[0]
    elsewhere = restored.state_dir / "nccl-of-another-checkout"
    elsewhere.mkdir(mode=0o755, exist_ok=True)
    (elsewhere / "libnccl.so.2").unlink(missing_ok=True)
    (elsewhere / "libnccl.so.2").symlink_to(f"{lib}/libnccl.so.2")
    before = pid_of(restored, f"sshd-{ssh_node}")

    up(restored, CLUSTERKIT_DEV_NCCL_LIB=str(elsewhere))
    assert pid_of(restored, f"sshd-{ssh_node}") != before
    seen = restored.ssh(ssh_node, "printenv LD_LIBRARY_PATH").stdout.strip()
    assert seen == str(elsewhere)
