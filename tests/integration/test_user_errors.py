"""What a new user meets on the dev cluster's real sshd nodes and login node: the
shipped dev-nodes profile, names that do not resolve, a changed host key, the
HCA fixes, more GPUs than expected, and the job's script looked for on login.host.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jobcli import clusterkit, shared_dir, ssh_section, write_yaml

pytestmark = pytest.mark.integration

CLI_TIMEOUT = 90
DEFAULT_STATE_DIR = Path("/tmp/clusterkit-dev")
IB_EXPECT = {"gpus_per_node": 8, "gpu_model": "H100", "ib_rate_gbps": 400, "peermem": True}


def preflight(dev_cluster: Any, *args: str, cwd: Path) -> tuple[dict[str, Any], int]:
    done = clusterkit(dev_cluster, "preflight", "--json", *args, cwd=cwd, timeout=CLI_TIMEOUT)
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout), done.returncode


def checks(report: dict[str, Any], node: str) -> dict[str, dict[str, str]]:
    entry = next(e for e in report["nodes"] if e["node"] == node)
    return {c["id"]: c for c in entry["checks"] if c["status"] != "pass"}


@pytest.fixture()
def ib_profile(dev_cluster: Any, tmp_path: Path) -> Path:
    return write_yaml(tmp_path / "ib.yaml", {
        "name": "ib", "ssh": ssh_section(dev_cluster, connect_timeout=3, command_timeout=20),
        "network": {"fabric": "infiniband", "ib_hca": [f"mlx5_{i}:1" for i in range(4)]},
        "expect": IB_EXPECT})


def test_the_shipped_dev_nodes_profile_works_right_after_up(dev_cluster: Any, tmp_path: Path) -> None:
    if dev_cluster.state_dir != DEFAULT_STATE_DIR:
        pytest.skip("profiles/dev-nodes.yaml points at the default state dir")
    report, code = preflight(dev_cluster, "--profile", "dev-nodes", cwd=tmp_path)
    assert code == 1 and report["profile"] == "dev-nodes"
    failing = {e["node"]: sorted(checks(report, e["node"])) for e in report["nodes"]}
    assert failing == {"ib-ok": [], "ib-portdown": ["rdma.port_state"], "ib-nohca": ["rdma.hca_present"],
                       "ib-nopeermem": ["rdma.peermem"]}


def test_the_shipped_local_dev_profile_imports_torch_over_ssh(dev_cluster: Any, tmp_path: Path) -> None:
    """`preflight --deep` as ckuser, from any folder: the profile names the dev cluster's
    python by its full path (no setup lines run over SSH), and its torch is a CPU build."""
    if dev_cluster.state_dir != DEFAULT_STATE_DIR:
        pytest.skip("profiles/local-dev.yaml points at the default state dir")
    report, _code = preflight(dev_cluster, "--profile", "local-dev", "--deep", cwd=tmp_path)
    for entry in report["nodes"]:
        torch = next(c for c in entry["checks"] if c["id"] == "nccl.torch")
        assert torch["status"] == "pass", torch
        assert torch["message"].startswith("torch 2.") and "/tmp/clusterkit-dev/venv/bin/python" in torch["message"]
    assert sorted(e["node"] for e in report["nodes"]) == ["n1", "n2", "n3", "n4"]


def test_hca_fixes_print_the_profile_line_and_one_equals_sign(dev_cluster: Any, ib_profile: Path) -> None:
    report, _ = preflight(dev_cluster, "--profile", str(ib_profile), "--nodes", "ib-portdown,ib-nohca",
                          cwd=ib_profile.parent)
    line = 'network.ib_hca: [mlx5_0:1, mlx5_1:1, mlx5_2:1] (the job then gets NCCL_IB_HCA="=mlx5_0:1,mlx5_1:1,mlx5_2:1")'
    for node, check_id in (("ib-portdown", "rdma.port_state"), ("ib-nohca", "rdma.hca_present")):
        fix = checks(report, node)[check_id]["fix"]
        assert fix.endswith(line) and "==" not in fix, fix


def test_more_gpus_than_expected_blames_the_profile(dev_cluster: Any, ib_profile: Path) -> None:
    report, code = preflight(dev_cluster, "--profile", str(ib_profile), "--nodes", "ib-ok", cwd=ib_profile.parent)
    assert code == 0
    four = write_yaml(ib_profile.with_name("four.yaml"), {
        "name": "four", "ssh": ssh_section(dev_cluster, connect_timeout=3), "expect": {"gpus_per_node": 4}})
    report, code = preflight(dev_cluster, "--profile", str(four), "--nodes", "ib-ok", cwd=four.parent)
    check = checks(report, "ib-ok")["gpu.count"]
    assert code == 1 and check["message"] == "nvidia-smi sees 8 GPUs, expected 4 (expect.gpus_per_node)"
    assert "missing or hidden" not in check["fix"] and "set expect.gpus_per_node: 8" in check["fix"]


def test_a_name_that_does_not_resolve_says_so(dev_cluster: Any, ib_profile: Path) -> None:
    report, _ = preflight(dev_cluster, "--profile", str(ib_profile), "--nodes", "ib-ok,ib-okk.invalid",
                          cwd=ib_profile.parent)
    check = checks(report, "ib-okk.invalid")["ssh.reachable"]
    assert check["message"].startswith("hostname does not resolve (ib-okk.invalid")
    assert "sshd" not in check["fix"]
    assert check["fix"].startswith("ib-okk.invalid does not resolve on this machine: ")
    assert "/etc/hosts" in check["fix"] and "HostName" in check["fix"]


def test_a_changed_host_key_says_its_fix_once(dev_cluster: Any, ib_profile: Path) -> None:
    report, _ = preflight(dev_cluster, "--profile", str(ib_profile), "--nodes", "badkey", cwd=ib_profile.parent)
    check = checks(report, "badkey")["ssh.reachable"]
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED for badkey" in check["message"]
    assert "verify" not in check["message"] and "ssh-keygen" not in check["message"]
    known = dev_cluster.known_hosts
    assert check["fix"] == ("verify the new fingerprint out of band, then replace the old key: "
                            f"`ssh-keygen -R 'badkey' -f {known}` and `ssh-keyscan -H badkey >> {known}`")


def test_the_script_is_looked_for_on_the_login_host(dev_cluster: Any, tmp_path: Path) -> None:
    login = {"host": "login", **ssh_section(dev_cluster, connect_timeout=5)}
    profile = write_yaml(tmp_path / "remote.yaml", {"name": "remote", "login": login,
                                                    "slurm": {"partition": "debug"}})
    with shared_dir("ck-script-") as folder:
        (folder / "train.py").write_text("print('here')\n")
        (folder / "train.py").chmod(0o644)
        there = write_yaml(tmp_path / "there.yaml", {"profile": str(profile), "script": "train.py",
                                                     "workdir": str(folder)})
        done = clusterkit(dev_cluster, "validate", str(there), cwd=tmp_path, timeout=CLI_TIMEOUT)
        assert done.returncode == 0, done.stderr
        gone = write_yaml(tmp_path / "gone.yaml", {"profile": str(profile), "script": "gone.py",
                                                   "workdir": str(folder)})
        for command in (["validate"], ["submit", "--no-preflight"]):
            done = clusterkit(dev_cluster, *command, str(gone), cwd=tmp_path, timeout=CLI_TIMEOUT)
            assert done.returncode == 2 and done.stdout == "", done.stderr
            assert done.stderr == (f"{gone}:2: script: no file {folder}/gone.py on login (workdir {folder} "
                                   "+ gone.py); check the name, or put gone.py into the workdir\n")


def test_logs_and_status_of_a_job_slurm_never_had(dev_cluster: Any, tmp_path: Path) -> None:
    for command in ("logs", "status"):
        done = clusterkit(dev_cluster, command, "99999999", cwd=tmp_path, timeout=CLI_TIMEOUT)
        assert done.returncode == 3, done.stderr
        assert done.stderr.startswith("clusterkit: error: Slurm on this machine does not know job 99999999\n"
                                      "  fix: "), done.stderr
