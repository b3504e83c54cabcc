"""Preflight report, grouped table and the in-job checks bundle, on real probe output.

The facts are what the real probe printed for fake nodes laid out like the
kernel's sysfs (tests/data/facts/). The fan-out is a parameter of run_preflight,
so it is given the per-host results SSH would have returned.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cluster_kit.checks import injob
from cluster_kit.fleet.preflight import (
    build_probe_command,
    exit_code,
    probe_source,
    run_preflight,
)
from cluster_kit.report.preflight import preflight_table
from cluster_kit.ssh import HostResult

FACTS_DIR = Path(__file__).resolve().parents[2] / "data" / "facts"
PROFILE: dict[str, Any] = {
    "name": "ib-ndr",
    "network": {"fabric": "infiniband", "ib_hca": [f"mlx5_{n}:1" for n in range(8)], "socket_ifname": "eth0"},
    "environment": {"python": "python3"},
    "expect": {"gpus_per_node": 8, "gpu_model": "H100", "min_driver": "535.104", "ib_rate_gbps": 400,
               "peermem": True},
}


def facts_text(name: str) -> str:
    """The facts as the probe prints them: one JSON line."""
    return json.dumps(json.loads((FACTS_DIR / f"{name}.json").read_text()))


def answered(host: str, facts: str) -> HostResult:
    return HostResult(host, True, 0, "Welcome to the cluster\n" + facts, "", None, 0.31)


def fan_out_of(results: dict[str, HostResult]) -> Any:
    """What remote.fan_out returns for these hosts, in the order asked."""
    calls: list[tuple[str, bytes]] = []

    def fan_out(hosts: list[str], command: str, stdin: bytes | None = None, on_result: Any = None) -> list:
        calls.append((command, stdin or b""))
        return [results[h] for h in hosts]

    fan_out.calls = calls  # type: ignore[attr-defined]
    return fan_out


def test_report_has_the_spec_shape_and_worst_status_per_node() -> None:
    results = {
        "gpu001": answered("gpu001", facts_text("ib-ok")),
        "gpu002": answered("gpu002", facts_text("ib-portdown")),
        "gpu003": HostResult("gpu003", False, None, "", "", "connection refused (gpu003 port 22)", 0.01),
        "gpu004": HostResult("gpu004", False, 127, "", "python3 not found\n", None, 0.2),
        "gpu005": HostResult("gpu005", False, 1, "", "Traceback ...\nMemoryError\n", None, 0.2),
    }
    fan_out = fan_out_of(results)
    report, facts = run_preflight(list(results), PROFILE, fan_out)

    assert set(report) == {"profile", "nodes", "summary"} and report["profile"] == "ib-ndr"
    by_node = {e["node"]: e for e in report["nodes"]}
    assert [e["node"] for e in report["nodes"]] == list(results)
    assert {n: e["status"] for n, e in by_node.items()} == {
        "gpu001": "pass", "gpu002": "fail", "gpu003": "unreachable", "gpu004": "fail", "gpu005": "fail"}
    failing = [c for c in by_node["gpu002"]["checks"] if c["status"] == "fail"]
    assert [c["id"] for c in failing] == ["rdma.port_state"]
    assert "mlx5_3 port 1 is DOWN" in failing[0]["message"]
    assert set(failing[0]) == {"id", "status", "message", "fix"}
    assert by_node["gpu003"]["checks"] == [{"id": "ssh.reachable", "status": "unreachable",
                                           "message": "connection refused (gpu003 port 22)",
                                           "fix": "check that the node is up and sshd answers "
                                                  "(ssh.connect_timeout, ssh.proxy_jump)"}]
    assert by_node["gpu004"]["checks"][0]["id"] == "probe.python"
    assert by_node["gpu005"]["checks"][0]["message"] == "the probe failed: MemoryError"
    assert report["summary"] == {"pass": 1, "warn": 0, "fail": 3, "unreachable": 1}
    assert exit_code(report) == 1 and set(facts) == {"gpu001", "gpu002"}
    command, stdin = fan_out.calls[0]
    assert stdin == probe_source().encode() and command.startswith("sh -c ")


def test_healthy_fleet_exits_0_and_prints_one_line() -> None:
    hosts = [f"gpu{n:03d}" for n in range(1, 65)]
    report, _ = run_preflight(hosts, PROFILE, fan_out_of({h: answered(h, facts_text("ib-ok")) for h in hosts}))
    assert exit_code(report) == 0
    table = preflight_table(report).splitlines()
    assert table[1].split()[:3] == ["pass", "gpu[001-064]", "-"]
    assert len(table) == 4 and table[-1] == "profile ib-ndr: 64 pass, 0 warn, 0 fail, 0 unreachable"


def test_identical_problems_fold_into_one_row_per_problem() -> None:
    hosts = ["gpu001", "gpu002", "gpu003", "gpu010"]
    results = {h: answered(h, facts_text("ib-portdown" if h != "gpu003" else "ib-ok")) for h in hosts}
    rows = preflight_table(run_preflight(hosts, PROFILE, fan_out_of(results))[0]).splitlines()
    assert rows[1].split()[:3] == ["fail", "gpu[001-002,010]", "rdma.port_state"]
    assert rows[2].split()[:2] == ["pass", "gpu003"]


def run_probe_command(path: str, stdin: bytes) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=path)
    return subprocess.run(["sh", "-c", build_probe_command("python3")], input=stdin, env=env,
                          capture_output=True, timeout=120, check=False)


def test_probe_command_runs_the_probe_from_stdin(tmp_path: Path) -> None:
    (tmp_path / "python3").symlink_to(sys.executable)
    done = run_probe_command(f"{tmp_path}:/usr/bin:/bin", probe_source().encode())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.decode().splitlines()[-1])["probe_version"] == 1


def test_probe_command_without_python_says_so_with_127(tmp_path: Path) -> None:
    for tool in ("sh", "echo"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True, check=False).stdout.strip()
        if found.startswith("/"):
            (tmp_path / tool).symlink_to(found)
    done = run_probe_command(str(tmp_path), b"")
    assert (done.returncode, done.stderr.decode().strip()) == (127, "python3 not found")


def job_facts(name: str, node: str) -> dict[str, Any]:
    """A node's facts as the job's own probe prints them: its Slurm name, and (it runs
    --deep with the job's python) torch, here as a real H200 node answered."""
    facts = dict(json.loads(facts_text(name)), slurm_node=node)
    facts["torch"] = json.loads(facts_text("real-h200"))["torch"]
    return facts


def test_injob_bundle_runs_on_a_bare_python_and_names_the_failing_node(tmp_path: Path) -> None:
    bundle = tmp_path / "checks.pyz"
    bundle.write_bytes(injob.build_bundle(PROFILE))
    lines = [json.dumps(job_facts(name, node)) for node, name in (("n1", "ib-ok"), ("n2", "ib-portdown"))]
    (tmp_path / "facts.jsonl").write_text("srun: noise\n" + "\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, "-I", str(bundle), str(tmp_path / "facts.jsonl"), "n1", "n2", "n3"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)
    assert done.returncode == 1
    assert "clusterkit preflight: n1: pass" in done.stderr
    assert "clusterkit preflight: n2: fail" in done.stderr
    assert "rdma.port_state: mlx5_3 port 1 is DOWN" in done.stderr
    assert "clusterkit preflight: n3: fail" in done.stderr and "printed nothing" in done.stderr


def test_injob_bundle_passes_when_every_node_passes(tmp_path: Path) -> None:
    bundle = tmp_path / "checks.pyz"
    bundle.write_bytes(injob.build_bundle(PROFILE))
    (tmp_path / "facts.jsonl").write_text(json.dumps(job_facts("ib-ok", "n1")) + "\n")
    done = subprocess.run([sys.executable, "-I", str(bundle), str(tmp_path / "facts.jsonl"), "n1"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)
    assert (done.returncode, done.stderr.strip()) == (0, "clusterkit preflight: n1: pass")


def test_an_unresolvable_name_says_so_instead_of_blaming_sshd() -> None:
    error = "hostname does not resolve (gpu0x1: Name or service not known)"
    results = {"gpu0x1": HostResult("gpu0x1", False, None, "", "", error, 0.01)}
    report, _ = run_preflight(list(results), PROFILE, fan_out_of(results))
    check = report["nodes"][0]["checks"][0]
    assert (check["id"], check["status"], check["message"]) == ("ssh.reachable", "unreachable", error)
    assert "sshd" not in check["fix"]
    assert check["fix"].startswith("gpu0x1 does not resolve on this machine: ")
    assert "DNS" in check["fix"] and "/etc/hosts" in check["fix"] and "HostName" in check["fix"]


def test_the_fix_the_ssh_step_named_wins() -> None:
    results = {"n1": HostResult("n1", False, None, "", "", "host key verification failed: x", 0.01,
                                fix="run this once")}
    report, _ = run_preflight(list(results), PROFILE, fan_out_of(results))
    assert report["nodes"][0]["checks"][0]["fix"] == "run this once"
