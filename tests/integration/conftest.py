"""The `dev_cluster` fixture: the dev cluster of scripts/dev-cluster, started once.

    def test_something(dev_cluster):
        dev_cluster.nodes["ib-ok"]          # "127.0.2.1"
        dev_cluster.ssh("ib-ok", "hostname")  # CompletedProcess, stdout "ib-ok\\n"
        with dev_cluster.override("ib-ok", "class/infiniband/mlx5_0/ports/1/state", "1: DOWN"):
            ...                              # the node sees the change at once

Attributes: state_dir, ssh_key, known_hosts, ssh_config (Paths), user ("ckuser"),
nodes (name -> address, every node of scripts/devcluster/nodes.tsv), kinds (name ->
kind: slurm, fake, login, badkey, silent, refuse), partitions (Slurm node -> its
partition), slurm_nodes (those of partition debug: ["n1", ..., "n4"]), slurm_conf and
script (Paths). Methods: node_dir(name), ssh(name, command), override(...),
reset_node(name), slurm_env(). docs/dev-cluster.md describes each node.

`up` runs once per session and fails the test loudly when the cluster cannot
start; it is idempotent, so a cluster already running is reused as it is. With
CLUSTERKIT_DEV_UP=off the session does not run it (scripts/test's lane of the tests
marked side_partition: `up` resumes nodes that the tests beside it drain on purpose).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "dev-cluster"
NODE_TABLE = REPO / "scripts" / "devcluster" / "nodes.tsv"
UP_TIMEOUT_S = 600  # a first run on a bare machine installs packages


def node_rows(path: Path = NODE_TABLE) -> list[list[str]]:
    """The fields of every node's line in the table, in its order."""
    return [line.split() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def read_node_table(path: Path = NODE_TABLE) -> list[tuple[str, str, str]]:
    """(name, address, kind) for every node in the table, in its order."""
    return [(fields[0], fields[1], fields[2]) for fields in node_rows(path)]


def leading_settings(fields: list[str]) -> dict[str, str]:
    """The `key=value` words a node's description begins with (hostname=, partition=)."""
    settings = {}
    for word in fields[3:]:
        key, equals, value = word.partition("=")
        if not equals:
            break
        settings[key] = value
    return settings


def host_names(path: Path = NODE_TABLE) -> dict[str, str]:
    """Node name -> its own host name, for the nodes whose description begins `hostname=H`."""
    return {fields[0]: settings["hostname"] for fields in node_rows(path)
            if "hostname" in (settings := leading_settings(fields))}


def partitions(path: Path = NODE_TABLE) -> dict[str, str]:
    """Slurm node -> its partition (`partition=P` in its description, else debug)."""
    return {fields[0]: leading_settings(fields).get("partition", "debug") for fields in node_rows(path)
            if fields[2] == "slurm"}


@dataclass(frozen=True)
class DevCluster:
    """Where the running dev cluster keeps things, and small helpers to use it."""

    state_dir: Path
    user: str = "ckuser"
    nodes: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    partitions: dict[str, str] = field(default_factory=dict)

    @property
    def ssh_key(self) -> Path:
        return self.state_dir / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "ssh" / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.state_dir / "ssh" / "config"

    @property
    def script(self) -> Path:
        """scripts/dev-cluster of this checkout."""
        return SCRIPT

    @property
    def slurm_conf(self) -> Path:
        return self.state_dir / "slurm" / "slurm.conf"

    @property
    def slurm_nodes(self) -> list[str]:
        """The Slurm nodes of partition debug, where jobs go unless they name another."""
        return [name for name, partition in self.partitions.items() if partition == "debug"]

    def node_dir(self, name: str) -> Path:
        """The node's fake hardware: class/ (= /sys/class), module/, gpus.csv, ..."""
        return self.state_dir / "nodes" / name

    def ssh(self, name: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run `command` on the node with OpenSSH; never raises for a non-zero exit."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), name, command], check=False,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def slurm_env(self) -> dict[str, str]:
        """os.environ with SLURM_CONF set, for sbatch/squeue in subprocesses."""
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf)}

    @contextlib.contextmanager
    def override(self, name: str, relpath: str, text: str | None) -> Iterator[Path]:
        """Write (or with None remove) one file of a node's fake tree, restore it after.

        The file is rewritten in place: the node's namespace holds bind mounts on
        class/, module/ and proc_modules, so those must never be replaced.
        Parent directories that did not exist are left behind (harmless).
        """
        path = self.node_dir(name) / relpath
        before = path.read_text() if path.is_file() else None
        try:
            if text is None:
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text if text.endswith("\n") else text + "\n")
            yield path
        finally:
            if before is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(before)

    def reset_node(self, name: str) -> None:
        """Restore a node's fake hardware to its defaults (scripts/dev-cluster reset)."""
        subprocess.run([str(SCRIPT), "reset", name], check=True, capture_output=True,
                       env={**os.environ, "CLUSTERKIT_DEV_DIR": str(self.state_dir)})


def start_dev_cluster(up: bool = True) -> DevCluster:
    """Run `scripts/dev-cluster up` (unless not `up`) and describe the result; pytest.fail on any problem."""
    state_dir = Path(os.environ.get("CLUSTERKIT_DEV_DIR", "/tmp/clusterkit-dev")).absolute()
    if up:
        run_up(state_dir)
    table = read_node_table()
    return DevCluster(state_dir=state_dir,
                      nodes={name: address for name, address, _ in table},
                      kinds={name: kind for name, _, kind in table}, partitions=partitions())


def run_up(state_dir: Path) -> None:
    try:
        done = subprocess.run([str(SCRIPT), "up"], check=False, capture_output=True, text=True,
                              timeout=UP_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              env={**os.environ, "CLUSTERKIT_DEV_DIR": str(state_dir)})
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.fail(f"scripts/dev-cluster up could not run: {error}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"scripts/dev-cluster up failed (rc {done.returncode}); it needs root "
                    f"on Debian 12.\n{done.stdout}{done.stderr}", pytrace=False)


@pytest.fixture(scope="session")
def dev_cluster() -> DevCluster:
    """The running dev cluster (started here if needed); see this module's docstring."""
    return start_dev_cluster(up=os.environ.get("CLUSTERKIT_DEV_UP") != "off")


@pytest.fixture(scope="session")
def keep_folder() -> Iterator[Path]:
    """A folder every node sees (and `ckuser` can enter) for the jobs that keep training."""
    from jobcli import shared_dir

    with shared_dir("ck-resilience-") as path:
        yield path


def clean_weights(dev_cluster: DevCluster, keep_folder: Path, name: str, **keys: Any) -> Path:
    """The weights of examples/train_resilient.py's training without a fault: one attempt, completed."""
    from keeptrain import chain_record, job, submit

    job_id = submit(dev_cluster, job(keep_folder, name, step_seconds=0, **keys))
    record = chain_record(keep_folder, job_id)
    assert [a["ended"] for a in record["attempts"]] == ["completed"], record
    assert record["final"] == {"ended": "completed", "exit_code": 0, "why": "completed"}
    return keep_folder / f"{name}.weights"


@pytest.fixture(scope="session")
def reference_weights(dev_cluster: DevCluster, keep_folder: Path) -> Path:
    """clean_weights on partition debug."""
    return clean_weights(dev_cluster, keep_folder, "ck-clean")


@pytest.fixture(scope="session")
def side_reference_weights(dev_cluster: DevCluster, keep_folder: Path) -> Path:
    """clean_weights on partition side, for the tests marked side_partition (their lane
    never waits for nodes of partition debug)."""
    from keeptrain import side_profile

    return clean_weights(dev_cluster, keep_folder, "ck-clean-side", profile=side_profile(keep_folder))
