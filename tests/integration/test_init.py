"""`clusterkit init --from-node` as a real process against the dev cluster's sshd nodes.

The profile written from a node must validate, say where each value came from,
and pass preflight on that node; from a mixed set the outliers are named.
docs/dev-cluster.md describes each node's fake hardware.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from jobcli import cli_env, clusterkit

pytestmark = pytest.mark.integration

CLI_TIMEOUT = 90


def init(dev_cluster: Any, out: Path, host: str, *extra: str) -> Any:
    done = clusterkit(dev_cluster, "init", "--from-node", host, "--ssh-config", str(dev_cluster.ssh_config),
                      "-o", str(out), *extra, cwd=out.parent, timeout=CLI_TIMEOUT)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def preflight(dev_cluster: Any, profile: Path) -> tuple[dict[str, Any], int]:
    done = clusterkit(dev_cluster, "preflight", "--profile", str(profile), "--json",
                      cwd=profile.parent, timeout=CLI_TIMEOUT)
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout), done.returncode


@pytest.mark.parametrize(("node", "fabric", "ib_hca", "gid_index"), [
    ("ib-ok", "infiniband", [f"mlx5_{i}:1" for i in range(4)], None),
    ("roce-ok", "roce", ["mlx5_0:1", "mlx5_1:1"], 3),
    ("roce-v1", "roce", ["mlx5_0:1", "mlx5_1:1"], 2),
    ("ib-portdown", "infiniband", [f"mlx5_{i}:1" for i in range(3)], None),
])
def test_the_profile_from_a_node_passes_preflight_there(dev_cluster: Any, tmp_path: Path, node: str,
                                                         fabric: str, ib_hca: list[str],
                                                         gid_index: int | None) -> None:
    out = tmp_path / f"{node}.yaml"
    done = init(dev_cluster, out, node)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    data = yaml.safe_load(out.read_text())
    assert data["nodes"] == node
    assert data["network"]["fabric"] == fabric
    assert data["network"]["ib_hca"] == ib_hca
    assert data["network"].get("gid_index") == gid_index
    assert data["ssh"]["config_file"] == str(dev_cluster.ssh_config)
    assert data["ssh"]["user"] == dev_cluster.user
    assert data["expect"]["gpus_per_node"] == 8 and data["expect"]["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert data["expect"]["min_driver"] == "550.54.15" and data["expect"]["peermem"] is True
    validated = clusterkit(dev_cluster, "validate", str(out), cwd=tmp_path)
    assert validated.returncode == 0, validated.stderr
    report, code = preflight(dev_cluster, out)
    assert code == 0, report
    if node == "ib-portdown":
        # init leaves out mlx5_3, whose port is down; it is the nearest HCA of GPUs 6 and 7
        assert report["summary"] == {"pass": 0, "warn": 1, "fail": 0, "unreachable": 0}
        warned = [c["id"] for c in report["nodes"][0]["checks"] if c["status"] != "pass"]
        assert warned == ["topo.gpu_nic"]
    else:
        assert report["summary"] == {"pass": 1, "warn": 0, "fail": 0, "unreachable": 0}


def test_a_port_that_is_down_is_left_out_with_a_comment(dev_cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    assert init(dev_cluster, out, "ib-portdown").returncode == 0
    assert "  # mlx5_3:1: 1: DOWN / 2: Polling on ib-portdown: left out" in out.read_text().splitlines()


def test_from_a_mixed_set_the_outliers_are_named(dev_cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "mixed.yaml"
    done = init(dev_cluster, out, "ib-ok", "--nodes", "ib-portdown,ib-nopeermem")
    assert done.returncode == 0, done.stderr
    assert "outlier: ib-portdown: network.ib_hca port mlx5_3:1 is 1: DOWN / 2: Polling" in done.stderr
    assert "outlier: ib-nopeermem: GPUDirect RDMA (nvidia_peermem / nv_peer_mem) is not loaded" in done.stderr
    text = out.read_text()
    assert "#   ib-portdown: network.ib_hca port mlx5_3:1 is 1: DOWN / 2: Polling" in text
    data = yaml.safe_load(text)
    assert data["nodes"] == "ib-ok,ib-portdown,ib-nopeermem"
    assert data["network"]["ib_hca"] == [f"mlx5_{i}:1" for i in range(4)]
    assert data["expect"]["peermem"] is True
    report, code = preflight(dev_cluster, out)
    assert code == 1
    status = {entry["node"]: entry["status"] for entry in report["nodes"]}
    assert status == {"ib-ok": "pass", "ib-portdown": "fail", "ib-nopeermem": "fail"}


def test_an_unreachable_reference_node_writes_nothing(dev_cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "r.yaml"
    started = time.monotonic()
    done = init(dev_cluster, out, "refuse")
    assert done.returncode == 1
    assert "refuse: unreachable: connection refused" in done.stderr
    assert "nothing was written" in done.stderr
    assert not out.exists()
    assert time.monotonic() - started < 30


def test_unreachable_extra_nodes_are_named_and_left_out(dev_cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "partial.yaml"
    done = init(dev_cluster, out, "roce-ok", "--nodes", "badkey")
    assert done.returncode == 1
    assert "badkey: unreachable: host key verification failed" in done.stderr
    assert "1 node(s) could not be probed and were left out: badkey" in done.stderr
    assert yaml.safe_load(out.read_text())["nodes"] == "roce-ok"


def test_an_existing_file_is_kept_unless_forced(dev_cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "keep.yaml"
    out.write_text("name: mine\n")
    refused = init(dev_cluster, out, "ib-ok")
    assert refused.returncode == 2 and "the file exists; nothing was written" in refused.stderr
    assert out.read_text() == "name: mine\n"
    forced = init(dev_cluster, out, "ib-ok", "--force")
    assert forced.returncode == 0, forced.stderr
    assert yaml.safe_load(out.read_text())["network"]["fabric"] == "infiniband"


def test_without_o_the_profile_goes_to_stdout(dev_cluster: Any, tmp_path: Path) -> None:
    done = clusterkit(dev_cluster, "init", "--from-node", "roce-ok", "--ssh-config", str(dev_cluster.ssh_config),
                      cwd=tmp_path, timeout=CLI_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["network"]["gid_index"] == 3
    assert list(tmp_path.iterdir()) == []


def test_the_slurm_nodes_agree_and_their_profile_passes_on_both(dev_cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "slurm.yaml"
    done = init(dev_cluster, out, "n1", "--nodes", "n2")
    assert done.returncode == 0, done.stderr
    assert "outlier" not in done.stderr
    data = yaml.safe_load(out.read_text())
    assert data["nodes"] == "n[1-2]"
    assert data["network"]["ib_hca"] == ["mlx5_0:1", "mlx5_1:1"]
    assert data["slurm"]["gpus_per_node"] == data["expect"]["gpus_per_node"] == 4
    assert "on 2/2 nodes" in out.read_text()
    report, code = preflight(dev_cluster, out)
    assert code == 0, report
    assert report["summary"]["pass"] == 2


def fresh_home(dev_cluster: Any, tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """As a new user met it: a HOME without ~/.ssh, and an ssh_config that reaches ib-ok
    without naming a known_hosts file (so the key is looked for in ~/.ssh/known_hosts)."""
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host ib-ok\n    User {dev_cluster.user}\n    IdentityFile {dev_cluster.ssh_key}\n")
    return cli_env(dev_cluster, HOME=str(home)), home, config


def init_as(dev_cluster: Any, env: dict[str, str], config: Path, out: Path, *extra: str) -> Any:
    done = clusterkit(dev_cluster, "init", "--from-node", "ib-ok", "--ssh-config", str(config), "-o", str(out),
                      *extra, env=env, cwd=out.parent, timeout=CLI_TIMEOUT)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def test_an_unknown_host_keys_fix_is_one_init_can_follow(dev_cluster: Any, tmp_path: Path) -> None:
    env, home, config = fresh_home(dev_cluster, tmp_path)
    out = tmp_path / "p.yaml"
    done = init_as(dev_cluster, env, config, out)
    assert done.returncode == 1 and not out.exists()
    fixes = re.findall(r"fix: (.*)", done.stderr)
    assert fixes, done.stderr
    for fix in fixes:
        assert "profile" not in fix, fix  # there is no profile yet
        assert "rerun init with --accept-new" in fix, fix
    keyscan = re.search(r"`(mkdir [^`]*)`", fixes[0])
    assert keyscan is not None, fixes[0]
    assert keyscan.group(1) == f"mkdir -p -m 700 {home}/.ssh && ssh-keyscan -H ib-ok >> {home}/.ssh/known_hosts"
    subprocess.run(["bash", "-c", keyscan.group(1)], check=True, capture_output=True, timeout=30)
    again = init_as(dev_cluster, env, config, out)
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load(out.read_text())["nodes"] == "ib-ok"


def test_accept_new_records_the_key_and_init_goes_on(dev_cluster: Any, tmp_path: Path) -> None:
    env, home, config = fresh_home(dev_cluster, tmp_path)
    out = tmp_path / "p.yaml"
    done = init_as(dev_cluster, env, config, out, "--accept-new")
    assert done.returncode == 0, done.stderr
    assert " ssh-ed25519 " in (home / ".ssh" / "known_hosts").read_text()
    text = out.read_text()
    assert "--accept-new" in text.splitlines()[0]
    assert "host_key_policy" not in text  # the key is recorded: the profile stays strict
    assert init_as(dev_cluster, env, config, out, "--force").returncode == 0  # now known, no flag needed
