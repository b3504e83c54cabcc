"""`preflight: true`: the rendered script probes every allocated node and checks the
facts (the embedded checks bundle) before any rank starts, on the dev cluster's Slurm.

Slurm's nodes n1/n2 run in their own namespaces, so the in-job probe sees each
node's fake hardware (mlx5_0/mlx5_1 NDR, nvidia_peermem, 4 GPUs from the
stand-in nvidia-smi). The jobs run as root (the submitter), and the "training"
is a stdlib script that prints one line per rank: what matters here is whether
it starts. `--no-preflight` skips the SSH preflight at submit time, so that the
in-job one is what stops a bad job.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from jobcli import (
    REPO,
    clusterkit,
    finish,
    job_id_of,
    rank_lines,
    start,
    write_ranks_script,
    write_yaml,
)

pytestmark = pytest.mark.integration

NOT_STARTED = "clusterkit: preflight failed (see the per-node lines above); training was not started"


def write_job(folder: Path, name: str, profile: str) -> Path:
    """2 nodes x 1 rank of ranks.py with the in-job preflight."""
    return write_yaml(folder / f"{name}.yaml", {
        "name": name, "profile": profile, "nodes": 2, "gpus_per_node": 1, "time": "00:02:00",
        "script": str(write_ranks_script(folder)), "output": f"{folder}/%x-%j.out", "preflight": True})


def verdict_lines(log: str) -> dict[str, list[str]]:
    """{node: [its status, then its problem lines]} from the bundle's `clusterkit preflight:` lines."""
    nodes: dict[str, list[str]] = {}
    node = None
    for line in log.splitlines():
        head = re.fullmatch(r"clusterkit preflight: (\S+): (pass|warn|fail)", line)
        if head:
            node = head.group(1)
            nodes[node] = [head.group(2)]
        elif line.startswith("clusterkit preflight:   ") and node:
            nodes[node].append(line.removeprefix("clusterkit preflight:   "))
    return nodes


def submit_and_read(dev_cluster: Any, proc: Any) -> tuple[int, str]:
    """(exit status of `submit --wait`, the job's log through `clusterkit logs`)."""
    done = finish(proc)
    job_id = job_id_of(done)
    logs = clusterkit(dev_cluster, "logs", job_id)
    assert logs.returncode == 0, logs.stderr
    assert f"job {job_id} finished with exit code {done.returncode}" in done.stderr
    return done.returncode, logs.stdout


def test_passing_and_failing_expectations(dev_cluster: Any, tmp_path: Path) -> None:
    """local-dev's expectations hold on n1/n2, so the ranks run; the same job on a
    profile expecting 8 GPUs per node stops before any rank, naming both nodes."""
    eight = write_yaml(tmp_path / "eight-gpus.yaml", {
        "name": "eight-gpus", "extends": str(REPO / "profiles" / "local-dev.yaml"),
        "expect": {"gpus_per_node": 8}})
    good = start(dev_cluster, "submit", str(write_job(tmp_path, "ck-pf-ok", "local-dev")),
                 "--wait", "--no-preflight")
    bad = start(dev_cluster, "submit", str(write_job(tmp_path, "ck-pf-8gpus", str(eight))),
                "--wait", "--no-preflight")

    code, log = submit_and_read(dev_cluster, good)
    assert code == 0, log
    verdicts = verdict_lines(log)
    assert sorted(verdicts) == ["n1", "n2"], log
    for status, *problems in verdicts.values():
        # Only socket_ifname lo warns (loopback is all the dev cluster has).
        assert status == "warn" and len(problems) == 1, log  # nccl.torch passed: local-dev's python has torch
        assert problems[0].startswith("net.socket_ifname: network.socket_ifname 'lo' selects only"), log
    ranks = rank_lines(log)
    assert sorted(ranks) == [0, 1], log
    assert [ranks[r]["SLURMD_NODENAME"] for r in (0, 1)] == ["n1", "n2"]
    assert log.index("clusterkit preflight: n2") < log.index("ck-rank")  # checked before training

    code, log = submit_and_read(dev_cluster, bad)
    assert code == 1, log
    verdicts = verdict_lines(log)
    assert sorted(verdicts) == ["n1", "n2"], log
    for lines in verdicts.values():
        assert lines[0] == "fail", log
        assert any(line.startswith("gpu.count: ") and "4" in line and "8" in line for line in lines), log
    assert NOT_STARTED in log
    assert rank_lines(log) == {}


def test_a_port_down_on_one_node_stops_the_job(dev_cluster: Any, tmp_path: Path) -> None:
    job = write_job(tmp_path, "ck-pf-portdown", "local-dev")
    with dev_cluster.override("n2", "class/infiniband/mlx5_0/ports/1/state", "1: DOWN"):
        code, log = submit_and_read(dev_cluster, start(dev_cluster, "submit", str(job), "--wait",
                                                       "--no-preflight"))
    assert code == 1, log
    verdicts = verdict_lines(log)
    assert verdicts["n1"][0] == "warn", log  # only the loopback warning
    assert verdicts["n2"][0] == "fail", log
    port_lines = [line for line in verdicts["n2"] if line.startswith("rdma.port_state: ")]
    assert len(port_lines) == 1 and "mlx5_0" in port_lines[0] and "DOWN" in port_lines[0], log
    assert NOT_STARTED in log
    assert rank_lines(log) == {}


def test_a_python_without_torch_stops_the_job_naming_it_and_its_setup_lines(dev_cluster: Any,
                                                                             tmp_path: Path) -> None:
    """The job's python is what the in-job probe imports torch with, after the setup lines."""
    job = write_yaml(tmp_path / "ck-pf-notorch.yaml", {
        **yaml_of(write_job(tmp_path, "ck-pf-notorch", "local-dev")),
        "environment": {"python": "/usr/bin/python3", "setup": ["export CK_SETUP=1"]}})
    code, log = submit_and_read(dev_cluster, start(dev_cluster, "submit", str(job), "--wait", "--no-preflight"))
    assert code == 1, log
    verdicts = verdict_lines(log)
    assert sorted(verdicts) == ["n1", "n2"], log
    for status, *problems in verdicts.values():
        assert status == "fail", log
        torch = [line for line in problems if line.startswith("nccl.torch: ")]
        assert len(torch) == 1, log
        assert torch[0].startswith("nccl.torch: environment.python (/usr/bin/python3) cannot import torch: "
                                   "import torch failed: ModuleNotFoundError: No module named 'torch' "
                                   "(fix: the job ran /usr/bin/python3 after its environment.setup lines "
                                   "(`export CK_SETUP=1`): "), log
    assert NOT_STARTED in log
    assert rank_lines(log) == {}


TORCH_PY = """import sys, torch
print("ck-torch version=%s python=%s" % (torch.__version__, sys.executable), flush=True)
"""


def test_local_dev_jobs_find_torch_from_any_folder(dev_cluster: Any, tmp_path: Path) -> None:
    """Submitted from a folder that is not the checkout, the shipped profile's python still
    has torch, and the in-job preflight checked that before the script ran."""
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    script = elsewhere / "uses_torch.py"
    script.write_text(TORCH_PY)
    job = write_yaml(elsewhere / "ck-pf-torch.yaml", {
        "name": "ck-pf-torch", "profile": "local-dev", "nodes": 1, "gpus_per_node": 1, "time": "00:02:00",
        "script": "uses_torch.py", "output": f"{elsewhere}/%x-%j.out", "preflight": True})
    code, log = submit_and_read(dev_cluster, start(dev_cluster, "submit", str(job), "--wait", "--no-preflight",
                                                   cwd=elsewhere))
    assert code == 0, log
    assert "ck-torch version=" in log and "python=/tmp/clusterkit-dev/venv/bin/python" in log, log
    assert not [line for line in log.splitlines() if line.startswith("clusterkit preflight:   nccl.torch")], log


def yaml_of(path: Path) -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load(path.read_text()))


def test_a_cpu_job_on_a_gpu_profile_is_preflighted_without_gpus(dev_cluster: Any, tmp_path: Path) -> None:
    """gpus_per_node: 0 on a profile expecting 8 GPUs per node (n1/n2 have 4): neither the
    SSH preflight at submit nor the in-job one demands GPUs, and Slurm is asked for none."""
    eight = write_yaml(tmp_path / "eight-gpus.yaml", {
        "name": "eight-gpus", "extends": str(REPO / "profiles" / "local-dev.yaml"),
        "expect": {"gpus_per_node": 8, "torch_cuda": True}})
    job = write_yaml(tmp_path / "ck-pf-cpu.yaml", {
        **yaml_of(write_job(tmp_path, "ck-pf-cpu", str(eight))), "gpus_per_node": 0})
    rendered = clusterkit(dev_cluster, "render", str(job))
    assert "gpus-per-node" not in rendered.stdout and "#SBATCH --ntasks-per-node=1\n" in rendered.stdout
    code, log = submit_and_read(dev_cluster, start(dev_cluster, "submit", str(job), "--wait"))
    assert code == 0, log
    for status, *problems in verdict_lines(log).values():
        assert status == "warn" and [p.split(":")[0] for p in problems] == ["net.socket_ifname"], log
    assert sorted(rank_lines(log)) == [0, 1], log
