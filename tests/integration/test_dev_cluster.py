"""The dev cluster itself: real Slurm, and each SSH test node shows what the table says."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import host_names, read_node_table

if TYPE_CHECKING:
    from conftest import DevCluster

pytestmark = pytest.mark.integration

HCA_FILES = "/sys/class/infiniband/{hca}/ports/1/{attr}"


def sh(cluster: DevCluster, node: str, command: str) -> str:
    done = cluster.ssh(node, command)
    assert done.returncode == 0, f"{node}: {command!r} failed: {done.stderr}"
    return done.stdout


def read_on(cluster: DevCluster, node: str, hca: str, attr: str) -> str:
    return sh(cluster, node, "cat " + HCA_FILES.format(hca=hca, attr=attr)).strip()


def sbatch_wait(cluster: DevCluster, tmp_path: Path, *args: str) -> str:
    """Submit, wait for the end, return the job's output."""
    out = tmp_path / "job-%j.out"
    done = subprocess.run(["sbatch", "--parsable", "--wait", "-o", str(out), *args],
                          check=False, capture_output=True, text=True, timeout=120,
                          env=cluster.slurm_env())
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    return (tmp_path / f"job-{job_id}.out").read_text()


@pytest.mark.parametrize(("partition", "nodes"), [("debug", ["n1", "n2", "n3", "n4"]), ("side", ["s1", "s2"])])
def test_slurm_nodes_are_idle_with_four_gpus(dev_cluster: DevCluster, partition: str, nodes: list[str]) -> None:
    done = subprocess.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N %t %G %c"],
                          capture_output=True, text=True, check=True, env=dev_cluster.slurm_env())
    rows = sorted(line.split() for line in done.stdout.splitlines())
    assert [row[0] for row in rows] == nodes == sorted(n for n, p in dev_cluster.partitions.items() if p == partition)
    for name, state, gres, cpus in rows:
        assert state in ("idle", "mix", "alloc", "comp"), name  # side: the tests beside come and go
        assert gres == "gpu:4" and cpus == "8"


def test_job_runs_on_both_nodes_under_their_names(dev_cluster: DevCluster, tmp_path: Path) -> None:
    output = sbatch_wait(dev_cluster, tmp_path, "-N2", "--wrap", "srun hostname")
    assert sorted(output.split()) == ["n1", "n2"]


def test_gpu_request_sets_cuda_visible_devices(dev_cluster: DevCluster, tmp_path: Path) -> None:
    output = sbatch_wait(dev_cluster, tmp_path, "-N1", "--gpus-per-node=4", "--wrap",
                         'echo "CVD=$CUDA_VISIBLE_DEVICES"')
    assert "CVD=0,1,2,3" in output


def test_login_node_runs_the_slurm_client_as_ckuser(dev_cluster: DevCluster) -> None:
    out = sh(dev_cluster, "login", "id -un; sbatch --parsable --wrap true -o /dev/null; squeue -h -o %u")
    lines = out.split()
    assert lines[0] == "ckuser"
    assert re.fullmatch(r"\d+(;\w+)?", lines[1])


HARDWARE_NODES = [name for name, _, kind in read_node_table() if kind in ("slurm", "fake")]
SLURM_NODES = [name for name, _, kind in read_node_table() if kind == "slurm"]
HOST_NAMES = host_names()


@pytest.mark.parametrize("node", HARDWARE_NODES)
def test_fake_node_has_its_own_hostname_and_gpus(dev_cluster: DevCluster, node: str) -> None:
    out = sh(dev_cluster, node, "hostname; nvidia-smi --query-gpu=name,driver_version "
             "--format=csv,noheader; nvidia-smi | grep -o 'CUDA Version: [0-9.]*'")
    lines = out.splitlines()
    gpus = 4 if node in SLURM_NODES else 8
    assert lines[0] == HOST_NAMES.get(node, node)
    assert lines[1:1 + gpus] == ["NVIDIA H100 80GB HBM3, 550.54.15"] * gpus
    assert lines[-1] == "CUDA Version: 12.4"


def test_nvidia_smi_answers_any_field_order_with_units_or_not(dev_cluster: DevCluster) -> None:
    out = sh(dev_cluster, "ib-ok", "nvidia-smi --query-gpu=pci.bus_id,memory.total,index "
             "--format=csv,nounits -i 0")
    assert out.splitlines() == ["pci.bus_id, memory.total [MiB], index", "00000000:18:00.0, 81559, 0"]


def test_healthy_infiniband_node(dev_cluster: DevCluster) -> None:
    assert sh(dev_cluster, "ib-ok", "ls /sys/class/infiniband").split() == [
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert read_on(dev_cluster, "ib-ok", "mlx5_3", "state") == "4: ACTIVE"
    assert read_on(dev_cluster, "ib-ok", "mlx5_3", "phys_state") == "5: LinkUp"
    assert read_on(dev_cluster, "ib-ok", "mlx5_0", "rate") == "400 Gb/sec (4X NDR)"
    assert read_on(dev_cluster, "ib-ok", "mlx5_0", "link_layer") == "InfiniBand"
    assert read_on(dev_cluster, "ib-ok", "mlx5_0", "gids/0").startswith("fe80:0000:0000:0000:")
    assert "nvidia_peermem" in sh(dev_cluster, "ib-ok", "ls /sys/module").split()


def test_broken_infiniband_nodes(dev_cluster: DevCluster) -> None:
    assert read_on(dev_cluster, "ib-portdown", "mlx5_3", "state") == "1: DOWN"
    assert read_on(dev_cluster, "ib-portdown", "mlx5_3", "phys_state") == "2: Polling"
    assert sh(dev_cluster, "ib-nohca", "ls /sys/class/infiniband").split() == [
        "mlx5_0", "mlx5_1", "mlx5_2"]
    assert "nvidia_peermem" not in sh(dev_cluster, "ib-nopeermem", "ls /sys/module").split()


@pytest.mark.parametrize("node, gid3_type", [("roce-ok", "RoCE v2"), ("roce-v1", "IB/RoCE v1")])
def test_roce_nodes(dev_cluster: DevCluster, node: str, gid3_type: str) -> None:
    assert read_on(dev_cluster, node, "mlx5_0", "link_layer") == "Ethernet"
    assert read_on(dev_cluster, node, "mlx5_0", "gid_attrs/types/3") == gid3_type
    assert read_on(dev_cluster, node, "mlx5_0", "gid_attrs/types/1") == "RoCE v2"
    assert read_on(dev_cluster, node, "mlx5_0", "gid_attrs/ndevs/3") == "eth0"
    assert re.fullmatch(r"(0000:){5}ffff:0a01:[0-9a-f]{4}", read_on(dev_cluster, node, "mlx5_0", "gids/3"))


def test_a_change_from_outside_is_seen_by_the_node(dev_cluster: DevCluster) -> None:
    relpath = "class/infiniband/mlx5_0/ports/1/state"
    with dev_cluster.override("ib-ok", relpath, "1: DOWN"):
        assert read_on(dev_cluster, "ib-ok", "mlx5_0", "state") == "1: DOWN"
    assert read_on(dev_cluster, "ib-ok", "mlx5_0", "state") == "4: ACTIVE"


def test_unreachable_nodes_fail_the_way_they_should(dev_cluster: DevCluster) -> None:
    badkey = dev_cluster.ssh("badkey", "true")
    assert badkey.returncode == 255 and "Host key verification failed" in badkey.stderr
    refuse = dev_cluster.ssh("refuse", "true")
    assert refuse.returncode == 255 and "Connection refused" in refuse.stderr
    silent = subprocess.run(["ssh", "-F", str(dev_cluster.ssh_config), "-o", "ConnectTimeout=1",
                             "silent", "true"], check=False, capture_output=True, text=True, timeout=30,
                            stdin=subprocess.DEVNULL)
    assert silent.returncode == 255 and "timed out during banner exchange" in silent.stderr


def test_known_hosts_records_name_and_address(dev_cluster: DevCluster) -> None:
    lines = dev_cluster.known_hosts.read_text().splitlines()
    hosts = {line.split()[0] for line in lines}
    assert "ib-ok,127.0.2.1" in hosts and "n1,127.0.1.1" in hosts


def test_up_again_keeps_the_same_daemons(dev_cluster: DevCluster) -> None:
    run_dir = dev_cluster.state_dir / "run"
    before = {p.name: p.read_text() for p in run_dir.glob("*.pid")}
    subprocess.run([str(dev_cluster.script), "up"], check=True, capture_output=True, timeout=120,
                   stdin=subprocess.DEVNULL,
                   env={**dev_cluster.slurm_env(), "CLUSTERKIT_DEV_DIR": str(dev_cluster.state_dir)})
    after = {p.name: p.read_text() for p in run_dir.glob("*.pid")}
    assert after == before
    # Ours: slurmctld, and per node of nodes.tsv its slurmd, sshd or silent listener (a shared
    # state dir may also hold the daemons of nodes another checkout's table adds).
    expected = {"slurmctld.pid"}
    for node, kind in dev_cluster.kinds.items():
        expected |= {f"slurmd-{node}.pid"} if kind == "slurm" else set()
        expected |= {f"sshd-{node}.pid"} if kind in ("slurm", "fake", "login", "badkey") else set()
        expected |= {f"silent-{node}.pid"} if kind == "silent" else set()
    assert expected <= set(before), sorted(expected - set(before))


def test_stand_ins_answer_health_fields_kernel_log_and_counters(dev_cluster: DevCluster) -> None:
    """What the probe reads on gpu-ecc, gpu-xid and ib-flap, as real nvidia-smi/dmesg/sysfs print it."""
    ecc = sh(dev_cluster, "gpu-ecc", "nvidia-smi --query-gpu=index,ecc.errors.uncorrected.volatile.total,"
             "clocks_throttle_reasons.active --format=csv -i 2; nvidia-smi --query-remapped-rows="
             "gpu_bus_id,remapped_rows.pending,remapped_rows.failure --format=csv,noheader -i 2")
    assert ecc.splitlines() == [
        "index, ecc.errors.uncorrected.volatile.total, clocks_throttle_reasons.active",
        "2, 2, 0x0000000000000001", "00000000:3A:00.0, Yes, No"]
    old = dev_cluster.ssh("gpu-powercap", "nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv")
    assert (old.returncode, old.stdout) == (2, 'Field "clocks_event_reasons.active" is not a valid field to query.\n')
    log = sh(dev_cluster, "gpu-xid", "dmesg").splitlines()
    assert len(log) == 2 and re.fullmatch(r"\[ *\d+\.\d{6}\] NVRM: Xid \(PCI:0000:2a:00\): 79, .*", log[0])
    counters = sh(dev_cluster, "ib-flap", "cat /sys/class/infiniband/mlx5_1/ports/1/counters/link_downed "
                  "/sys/class/infiniband/mlx5_0/ports/1/counters/link_downed")
    assert counters.split() == ["37", "0"]
