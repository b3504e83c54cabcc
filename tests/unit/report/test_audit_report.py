"""Audit reports: table, Markdown, JSON and HTML carry the right values, escaped;
the HTML loads in a real headless Chromium without a script error."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cluster_kit.fleet import audit
from cluster_kit.fleet.facts import is_per_node
from cluster_kit.report import audit as audit_report

HOSTILE = "<script>alert(1)</script>"
# Breaks out of the JSON <script> block if the data were not escaped for HTML.
BREAKOUT = "</script><img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
per_node = is_per_node


def node_facts(node: str, index: int) -> dict[str, str]:
    """Flat facts of a healthy node with 8 GPUs and 8 single-port HCAs (about 60 facts)."""
    facts = {"hostname": node, "os.kernel": "5.15.0-105-generic", "gpu.count": "8",
             "gpu.model": "NVIDIA H100 80GB HBM3", "gpu.driver": "550.54.15",
             "nccl.version": "2.21.5", "rdma.peermem": "nvidia_peermem", "sys.memlock": "unlimited"}
    for gpu in range(8):
        facts[f"gpu.{gpu}.uuid"] = f"GPU-{index:05d}{gpu:02d}-7f3a-4b2c-9d1e"
    for hca in (f"mlx5_{h}" for h in range(8)):
        facts.update({f"rdma.{hca}.fw_ver": "28.39.1002",
                      f"rdma.{hca}.node_guid": f"0c42:a103:{index:04x}:{hca[-1]}",
                      f"rdma.{hca}.1.state": "4: ACTIVE", f"rdma.{hca}.1.rate": "400 Gb/sec (4X NDR)",
                      f"rdma.{hca}.1.link_layer": "InfiniBand"})
    return facts


def entry(node: str, status: str) -> dict:
    checks = [{"id": "gpu.count", "status": "pass", "message": "8 GPUs", "fix": ""}]
    if status == "fail":
        checks.append({"id": "rdma.port_state", "status": "fail",
                       "message": "mlx5_3 port 1 is DOWN", "fix": "check the cable of mlx5_3"})
    if status == "unreachable":
        checks = [{"id": "ssh.reachable", "status": "unreachable", "message": "timed out",
                   "fix": "check that the node is up"}]
    return {"node": node, "status": status, "elapsed_s": 0.4, "checks": checks}


def make_audit(count: int, baseline: bool = True) -> dict:
    """`count` nodes: gpu0003 has an old driver (and a hostile value elsewhere), gpu0007 a DOWN
    port (and fails), gpu0009 lacks mlx5_3; one more node is unreachable; gpu0004 is drained."""
    nodes = [f"gpu{i:04d}" for i in range(1, count + 1)]
    facts = {node: node_facts(node, i) for i, node in enumerate(nodes)}
    facts["gpu0003"]["gpu.driver"] = "535.104.05"
    facts["gpu0005"]["os.kernel"] = HOSTILE
    facts["gpu0006"]["sys.memlock"] = BREAKOUT
    facts["gpu0007"]["rdma.mlx5_3.1.state"] = "1: DOWN"
    for fact in [f for f in facts["gpu0009"] if f.startswith("rdma.mlx5_3.")]:
        del facts["gpu0009"][fact]
    statuses = {node: "fail" if node == "gpu0007" else "pass" for node in nodes}
    statuses["gpu9999"] = "unreachable"
    report = {"profile": "prod", "nodes": [entry(n, s) for n, s in statuses.items()]}
    saved = None
    if baseline:
        old = {node: dict(f, **{"gpu.driver": "535.104.05"}) for node, f in facts.items()}
        saved = audit.save_baseline(old, profile="prod", created="2024-05-01T00:00:00Z")
    slurm = {"gpu0004": {"state": "drained", "reason": "RMA ticket 42"}}
    return audit.build_audit("prod", report, facts, saved, slurm, per_node=per_node, flatten=dict)


@pytest.fixture(scope="module")
def small() -> dict:
    return make_audit(12)


# ---------------------------------------------------------------- table / JSON / Markdown


def test_table_groups_drift_checks_changes_and_drains(small: dict) -> None:
    text = audit_report.render_table(small)
    assert re.search(r"gpu.driver +550.54.15 on gpu\[0001-0002,0004-0012\] +535.104.05 on gpu0003", text)
    assert "rdma.mlx5_3.1.state" in text and "1: DOWN on gpu0007; absent on gpu0009" in text
    assert re.search(r"fail +gpu0007 +rdma.port_state +mlx5_3 port 1 is DOWN", text)
    assert re.search(r"unreachable +gpu9999 +ssh.reachable", text)
    assert "gpu.driver 535.104.05 -> 550.54.15 on gpu[0001-0002,0004-0012]" in text
    assert re.search(r"drained +gpu0004 +RMA ticket 42", text)
    assert text.rstrip().endswith(
        "profile prod: 13 nodes, 12 reachable, 1 unreachable, 1 failing, 7 drifting facts, 11 changes")
    assert text.index("DRIFT") < text.index("CHECKS") < text.index("CHANGES") < text.index("DRAINED")


def test_table_shows_control_characters_instead_of_sending_them() -> None:
    doc = make_audit(12, baseline=False)
    doc["drift"][0]["outliers"] = {"gpu0003": "x\x1b[2Jy"}
    text = audit_report.render_table(doc)
    assert "\x1b" not in text and "x\\x1b[2Jy on gpu0003" in text


def test_table_of_a_clean_fleet_says_so() -> None:
    facts = {f"n{i}": node_facts(f"n{i}", i) for i in range(3)}
    report = {"nodes": [entry(n, "pass") for n in facts]}
    text = audit_report.render_table(audit.build_audit("lab", report, facts, per_node=per_node, flatten=dict))
    assert "DRIFT: none" in text and "CHECKS: every reachable node passed" in text
    assert "CHANGES" not in text and text.rstrip().endswith("0 changes")


def test_json_is_the_audit_document(small: dict) -> None:
    doc = json.loads(audit_report.render(small, "json"))
    assert doc["nodes"][0] == "gpu0001" and doc["unreachable"] == ["gpu9999"]
    assert {"fact", "majority", "majority_nodes", "outliers"} == set(doc["drift"][0])
    assert doc["changes"][0] == {"node": "gpu0001", "fact": "gpu.driver",
                                 "before": "535.104.05", "after": "550.54.15"}


def test_markdown_escapes_values_and_lists_findings(small: dict) -> None:
    text = audit_report.render_markdown(small)
    assert "| 13 | 12 | 1 | 1 | 7 | 11 |" in text
    assert "| gpu.driver | 550.54.15 | gpu\\[0001-0002,0004-0012\\] | 535.104.05 on gpu0003 |" in text
    assert HOSTILE not in text and "&lt;script>alert(1)&lt;/script>" in text
    assert "- gpu.driver 535.104.05 -> 550.54.15 on gpu\\[0001-0002,0004-0012\\]" in text
    assert "| drained | gpu0004 | RMA ticket 42 |" in text


def test_unknown_format_is_refused(small: dict) -> None:
    with pytest.raises(ValueError, match="table, json, markdown, html"):
        audit_report.render(small, "pdf")


# ---------------------------------------------------------------- HTML (static)


def test_html_escapes_hostile_values(small: dict) -> None:
    page = audit_report.render_html(small)
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "</script><img" not in page
    assert page.count("<script") == 2  # the JSON data block and the page's own script


def test_html_is_self_contained(small: dict) -> None:
    page = audit_report.render_html(small)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "@import" not in page and "url(" not in page and "<link" not in page
    assert "default-src 'none'" in page


def test_html_summary_and_default_columns(small: dict) -> None:
    page = audit_report.render_html(small)
    assert 'data-count="nodes">13<' in page and 'data-count="changes">11<' in page
    grid = audit_report.grid_data(small)
    shown = [c["name"] for c in grid["columns"] if c["shown"]]
    assert {"gpu.driver", "os.kernel", "rdma.mlx5_3.1.state"} <= set(shown)  # drift
    assert "gpu.count" not in shown and "rdma.mlx5_0.1.state" not in shown
    driver = next(c for c in grid["columns"] if c["name"] == "gpu.driver")
    assert driver["values"][driver["cells"][2]] == "535.104.05" and driver["cells"][-1] == -1


def test_facts_of_failing_checks_are_columns_even_without_drift() -> None:
    failing = {"checks": [{"node": "n1", "checks": [
        {"id": "gpu.driver", "status": "fail", "message": "driver 535 < 550", "fix": ""},
        {"id": "rdma.port_state", "status": "fail", "message": "mlx5_1 port 1 is DOWN", "fix": ""}]}]}
    names = ["gpu.driver", "gpu.count", "rdma.mlx5_1.1.state", "rdma.mlx5_1.1.phys_state",
             "rdma.mlx5_10.1.state", "rdma.mlx5_1.1.rate"]
    assert audit_report.failing_facts(failing, names) == {
        "gpu.driver", "rdma.mlx5_1.1.state", "rdma.mlx5_1.1.phys_state"}


# ---------------------------------------------------------------- HTML in Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def run_chromium(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
            "--v=0", *args, url]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)


def script_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Uncaught" in line or "CONSOLE" in line]


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_html_of_1000_nodes_loads_in_chromium(tmp_path: Path) -> None:
    doc = make_audit(1000)
    page = tmp_path / "audit.html"
    page.write_text(audit_report.render_html(doc))
    started = time.perf_counter()
    loaded = run_chromium(tmp_path, page.as_uri(), "--dump-dom")
    elapsed = time.perf_counter() - started
    print(f"\nchromium --dump-dom of {page.stat().st_size // 1024} KiB, 1001 nodes: {elapsed:.2f} s")
    dom = loaded.stdout
    assert 'data-ready="1"' in dom and 'data-pwned="1"' not in dom
    assert script_errors(loaded.stderr) == []
    for key, count in [("nodes", 1001), ("reachable", 1000), ("unreachable", 1), ("fail", 1),
                       ("drifting_facts", 7), ("changes", 999)]:
        assert f'data-count="{key}">{count}<' in dom
    assert dom.count('<th class="n" scope="row">') == 1001
    assert "≠ 1: DOWN" in dom and "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    every = run_chromium(tmp_path, page.as_uri() + "#all", "--dump-dom")
    assert re.search(r"1001 of 1001 nodes shown, (\d+) of \1 facts", every.stdout)
    assert 'data-windowed="1"' in every.stdout  # 1,001 x 60 cells: only the rows in view are drawn
    assert every.stdout.count('<th class="n" scope="row">') < 200
    shot = tmp_path / "audit.png"
    run_chromium(tmp_path, page.as_uri(), f"--screenshot={shot}", "--window-size=1400,900")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
