"""`clusterkit audit` end to end: the real CLI against the dev cluster's sshd nodes and Slurm.

The fake nodes ib-ok, ib-portdown, ib-nohca and ib-nopeermem are alike except
where the dev cluster makes them differ (mlx5_3 down / missing, no peermem);
each test adds its own differences through `dev_cluster.override` (restored
after), so the drift and the changes it asserts are exactly the ones it made.
"""
from __future__ import annotations

import contextlib
import html
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

IB_NODES = ["ib-nohca", "ib-nopeermem", "ib-ok", "ib-portdown"]
DRIVER = "550.54.15"
OLD_DRIVER = "535.104.05"
NEW_DRIVER = "560.35.03"
FW = "28.39.1002"
NEW_FW = "28.40.1000"
DRAIN_REASON = "clusterkit: rdma.port_state"
ADMIN_REASON = "admin: fan"


def clusterkit_argv() -> list[str]:
    """The installed `clusterkit` script of this interpreter's environment."""
    script = Path(sys.executable).with_name("clusterkit")
    if script.exists():
        return [str(script)]
    found = shutil.which("clusterkit")
    return [found] if found else [sys.executable, "-m", "cluster_kit"]


def clusterkit(dev_cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (no terminal: no progress on stderr)."""
    return subprocess.run([*clusterkit_argv(), *args], capture_output=True, text=True, check=False,
                          timeout=120, stdin=subprocess.DEVNULL, env=dev_cluster.slurm_env())


def ssh_section(dev_cluster: Any) -> dict[str, Any]:
    return {"user": dev_cluster.user, "identity_file": str(dev_cluster.ssh_key),
            "known_hosts": str(dev_cluster.known_hosts), "connect_timeout": 3}


def write_profile(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture()
def ib_profile(dev_cluster: Any, tmp_path: Path) -> Path:
    """An InfiniBand profile for the 8-GPU fake nodes; checks only mlx5_0:1 and mlx5_1:1."""
    return write_profile(tmp_path / "ib.yaml", {
        "name": "audit-ib",
        "ssh": ssh_section(dev_cluster),
        "network": {"fabric": "infiniband", "ib_hca": ["mlx5_0:1", "mlx5_1:1"]},
        "expect": {"gpus_per_node": 8, "gpu_model": "H100", "min_driver": "550.54", "peermem": True},
    })


def gpus_csv_with_driver(dev_cluster: Any, node: str, driver: str) -> str:
    """The node's gpus.csv with every GPU on `driver`."""
    return (dev_cluster.node_dir(node) / "gpus.csv").read_text().replace(DRIVER, driver)


def audit_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def drift_entry(fact: str, majority: str, majority_nodes: str, outliers: dict[str, str]) -> dict[str, Any]:
    return {"fact": fact, "majority": majority, "majority_nodes": majority_nodes, "outliers": outliers}


def expected_drift() -> list[dict[str, Any]]:
    """The drift of IB_NODES with ib-nopeermem on OLD_DRIVER and ib-portdown's mlx5_1 on NEW_FW."""
    three_with_mlx5_3 = "ib-nopeermem,ib-ok,ib-portdown"
    mlx5_3_up = "ib-nopeermem,ib-ok"
    missing = {"ib-nohca": "absent"}
    # ib-nohca lacks mlx5_3, the HCA on GPUs 6/7's PCIe switch: their nearest is another one
    nearest_elsewhere = {"ib-nohca": "mlx5_2 (same NUMA node)"}
    return [
        drift_entry("gpu.6.nic", "mlx5_3 (same PCIe switch)", three_with_mlx5_3, nearest_elsewhere),
        drift_entry("gpu.7.nic", "mlx5_3 (same PCIe switch)", three_with_mlx5_3, nearest_elsewhere),
        drift_entry("gpu.driver", DRIVER, "ib-nohca,ib-ok,ib-portdown", {"ib-nopeermem": OLD_DRIVER}),
        drift_entry("net.ib3.carrier", "1", mlx5_3_up, {"ib-nohca": "absent", "ib-portdown": "0"}),
        drift_entry("net.ib3.mtu", "4092", three_with_mlx5_3, missing),
        drift_entry("net.ib3.operstate", "up", mlx5_3_up, {"ib-nohca": "absent", "ib-portdown": "down"}),
        drift_entry("rdma.hcas", "mlx5_0,mlx5_1,mlx5_2,mlx5_3", three_with_mlx5_3,
                    {"ib-nohca": "mlx5_0,mlx5_1,mlx5_2"}),
        drift_entry("rdma.mlx5_1.fw_ver", FW, "ib-nohca,ib-nopeermem,ib-ok", {"ib-portdown": NEW_FW}),
        drift_entry("rdma.mlx5_3.1.gid.0.type", "IB/RoCE v1", three_with_mlx5_3, missing),
        drift_entry("rdma.mlx5_3.1.link_layer", "InfiniBand", three_with_mlx5_3, missing),
        drift_entry("rdma.mlx5_3.1.phys_state", "5: LinkUp", mlx5_3_up,
                    {"ib-nohca": "absent", "ib-portdown": "2: Polling"}),
        drift_entry("rdma.mlx5_3.1.rate", "400 Gb/sec (4X NDR)", mlx5_3_up,
                    {"ib-nohca": "absent", "ib-portdown": "10 Gb/sec (4X SDR)"}),
        drift_entry("rdma.mlx5_3.1.sm_lid", "0x1", three_with_mlx5_3, missing),
        drift_entry("rdma.mlx5_3.1.state", "4: ACTIVE", mlx5_3_up,
                    {"ib-nohca": "absent", "ib-portdown": "1: DOWN"}),
        drift_entry("rdma.mlx5_3.board_id", "MT_0000000838", three_with_mlx5_3, missing),
        drift_entry("rdma.mlx5_3.fw_ver", FW, three_with_mlx5_3, missing),
        drift_entry("rdma.mlx5_3.hca_type", "MT4129", three_with_mlx5_3, missing),
        drift_entry("rdma.mlx5_3.pci.current_link_speed", "32.0 GT/s PCIe", three_with_mlx5_3, missing),
        drift_entry("rdma.mlx5_3.pci.current_link_width", "16", three_with_mlx5_3, missing),
        drift_entry("rdma.mlx5_3.pci.max_link_speed", "32.0 GT/s PCIe", three_with_mlx5_3, missing),
        drift_entry("rdma.mlx5_3.pci.max_link_width", "16", three_with_mlx5_3, missing),
        drift_entry("rdma.mlx5_3.pci.numa_node", "1", three_with_mlx5_3, missing),
        drift_entry("rdma.peermem", "nvidia_peermem", "ib-nohca,ib-ok,ib-portdown", {"ib-nopeermem": "none"}),
    ]


def outlier_text(outliers: dict[str, str]) -> str:
    """How table and Markdown write outliers: `value on nodes; ...`, most nodes first, then by value."""
    groups: dict[str, list[str]] = {}
    for node, value in outliers.items():
        groups.setdefault(value, []).append(node)
    ordered = sorted(groups, key=lambda v: (-len(groups[v]), v))
    return "; ".join(f"{v} on {','.join(groups[v])}" for v in ordered)


def section(text: str, heading: str) -> list[str]:
    """The lines after `heading` (blank lines right after it skipped) up to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    body: list[str] = []
    for line in lines[start + 1:]:
        if not line.strip():
            if body:
                break
            continue
        body.append(line)
    return body


def unescape_markdown(cell: str) -> str:
    return re.sub(r"\\(.)", r"\1", cell).replace("&lt;", "<").replace("&amp;", "&")


def markdown_rows(text: str, heading: str) -> list[list[str]]:
    """Cells of the Markdown table under `heading`, unescaped, header and rule left out."""
    rows = [line for line in section(text, heading) if line.startswith("|")][2:]
    return [[unescape_markdown(cell.strip()) for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]


@pytest.fixture()
def drifted(dev_cluster: Any) -> Iterator[None]:
    """ib-nopeermem on an older driver, ib-portdown's mlx5_1 on newer firmware."""
    with dev_cluster.override("ib-nopeermem", "gpus.csv",
                              gpus_csv_with_driver(dev_cluster, "ib-nopeermem", OLD_DRIVER)), \
            dev_cluster.override("ib-portdown", "class/infiniband/mlx5_1/fw_ver", NEW_FW):
        yield


# ---------------------------------------------------------------- drift, in every format


def test_drift_names_exactly_the_differing_nodes_and_values(dev_cluster: Any, ib_profile: Path,
                                                            drifted: None, tmp_path: Path) -> None:
    nodes = ",".join([*IB_NODES, "refuse"])
    result = clusterkit(dev_cluster, "audit", "--profile", str(ib_profile), "--nodes", nodes, "--format", "json")
    audit = audit_json(result)
    assert result.returncode == 1  # ib-nopeermem fails, refuse is unreachable
    assert audit["profile"] == "audit-ib"
    assert audit["nodes"] == IB_NODES
    assert audit["unreachable"] == ["refuse"]
    assert audit["drift"] == expected_drift()
    status = {entry["node"]: entry["status"] for entry in audit["checks"]}
    # the profile lists two of the four rails: topo.gpu_nic warns on every node
    assert status == {"ib-nohca": "warn", "ib-nopeermem": "fail", "ib-ok": "warn", "ib-portdown": "warn",
                      "refuse": "unreachable"}
    failing = {c["id"] for e in audit["checks"] if e["node"] == "ib-nopeermem"
               for c in e["checks"] if c["status"] == "fail"}
    assert failing == {"gpu.driver", "rdma.peermem"}
    expected_counts = {"nodes": 5, "reachable": 4, "unreachable": 1, "fail": 1, "drifting_facts": 23,
                       "drifting_nodes": 3, "changes": 0}
    assert {key: audit["summary"][key] for key in expected_counts} == expected_counts
    assert "changes" not in audit
    assert set(audit["facts"]) == set(IB_NODES)
    assert audit["facts"]["ib-nopeermem"]["gpu.driver"] == OLD_DRIVER

    table = clusterkit(dev_cluster, "audit", "--profile", str(ib_profile), "--nodes", nodes)
    assert table.returncode == 1 and "Traceback" not in table.stderr
    drift_rows = section(table.stdout, "DRIFT")[1:]
    assert len(drift_rows) == len(expected_drift())
    for row, entry in zip(drift_rows, expected_drift()):
        assert re.split(r"\s{2,}", row.strip()) == [
            entry["fact"], f"{entry['majority']} on {entry['majority_nodes']}", outlier_text(entry["outliers"])]
    checks = "\n".join(section(table.stdout, "CHECKS"))
    assert re.search(r"unreachable\s+refuse\s+ssh\.reachable\s+connection refused", checks)
    assert re.search(r"fail\s+ib-nopeermem\s+gpu\.driver\s+.*535\.104\.05", checks)
    assert re.search(r"fail\s+ib-nopeermem\s+rdma\.peermem\s", checks)
    assert "profile audit-ib: 5 nodes, 4 reachable, 1 unreachable, 1 failing, 23 drifting facts" in table.stdout

    markdown = clusterkit(dev_cluster, "audit", "--profile", str(ib_profile), "--nodes", nodes,
                          "--format", "markdown")
    assert markdown.returncode == 1 and "Traceback" not in markdown.stderr
    assert markdown.stdout.startswith("# clusterkit audit: audit-ib\n")
    assert markdown_rows(markdown.stdout, "## Drift") == [
        [e["fact"], e["majority"], e["majority_nodes"], outlier_text(e["outliers"])] for e in expected_drift()]
    problems = {(row[0], row[1], row[2]) for row in markdown_rows(markdown.stdout, "## Checks")}
    assert problems == {("unreachable", "refuse", "ssh.reachable"), ("fail", "ib-nopeermem", "gpu.driver"),
                        ("fail", "ib-nopeermem", "rdma.peermem"), ("warn", "ib-nohca", "topo.gpu_nic"),
                        ("warn", "ib-nopeermem,ib-ok,ib-portdown", "topo.gpu_nic")}

    page = tmp_path / "audit.html"
    written = clusterkit(dev_cluster, "audit", "--profile", str(ib_profile), "--nodes", nodes,
                         "--format", "html", "-o", str(page))
    assert written.returncode == 1 and written.stdout == "" and "Traceback" not in written.stderr
    assert_html_report(page.read_text(), expected_drift(), [*IB_NODES, "refuse"])


def assert_html_report(text: str, drift: list[dict[str, Any]], nodes: list[str]) -> None:
    """Every drift fact, value and node is on the page, and the page fetches nothing."""
    assert text.lstrip().lower().startswith("<!doctype html>")
    for entry in drift:
        for value in [entry["fact"], entry["majority"], entry["majority_nodes"], *entry["outliers"].values()]:
            assert html.escape(value, quote=False) in text, value
    for node in nodes:
        assert node in text
    assert_self_contained(text)


def assert_self_contained(text: str) -> None:
    """Nothing to fetch: no http(s) URL, no tag with an external src/href, no fetching script."""
    assert not re.search(r"https?://", text, re.IGNORECASE)
    markup = re.sub(r"(?is)<(script|style)\b[^>]*>.*?</\1>", "", text)
    for tag in re.findall(r"<[a-zA-Z][^>]*>", markup):
        assert not re.match(r"<(link|img|iframe|object|embed|base|source)\b", tag, re.IGNORECASE), tag
        for url in re.findall(r"\b(?:src|href|action|srcset|poster)\s*=\s*[\"']?([^\"'\s>]*)", tag, re.IGNORECASE):
            assert url.startswith(("#", "data:")), tag
    scripts = "".join(body for _, body in re.findall(r"(?is)<script\b([^>]*)>(.*?)</script>", text))
    assert not re.findall(r"(?is)<script\b[^>]*\bsrc\s*=", text)
    assert not re.search(r"\bfetch\(|XMLHttpRequest|WebSocket|EventSource|\bimport\(|sendBeacon|\.src\s*=",
                         scripts)
    assert not re.search(r"@import|url\(\s*[\"']?(?!data:|#)", text, re.IGNORECASE)
    assert "default-src 'none'" in text  # the page's CSP forbids fetches even if one slipped in


def test_unreachable_nodes_are_listed_and_the_report_covers_every_node(dev_cluster: Any,
                                                                       ib_profile: Path) -> None:
    result = clusterkit(dev_cluster, "audit", "--profile", str(ib_profile), "--nodes", "ib-ok,refuse,silent",
                        "--format", "json")
    audit = audit_json(result)
    assert result.returncode == 1
    assert audit["nodes"] == ["ib-ok"]
    assert audit["unreachable"] == ["refuse", "silent"]
    assert audit["drift"] == []  # one reachable node cannot drift; unreachable ones add no "absent"
    entries = {e["node"]: e for e in audit["checks"]}
    assert set(entries) == {"ib-ok", "refuse", "silent"}
    assert [(c["id"], c["status"]) for c in entries["ib-ok"]["checks"] if c["status"] != "pass"] == [
        ("topo.gpu_nic", "warn")]  # the profile lists two of its four rails
    for node, words in (("refuse", "connection refused"), ("silent", "no answer within 3s")):
        assert entries[node]["status"] == "unreachable"
        assert [(c["id"], c["status"]) for c in entries[node]["checks"]] == [("ssh.reachable", "unreachable")]
        assert words in entries[node]["checks"][0]["message"]
    assert set(audit["facts"]) == {"ib-ok"}
    summary = audit["summary"]
    assert (summary["nodes"], summary["reachable"], summary["unreachable"]) == (3, 1, 2)


# ---------------------------------------------------------------- baseline


def test_changes_since_a_baseline(dev_cluster: Any, ib_profile: Path, tmp_path: Path) -> None:
    nodes = "ib-ok,ib-nohca,ib-nopeermem"
    baseline = tmp_path / "b.json"
    saved = clusterkit(dev_cluster, "audit", "--profile", str(ib_profile), "--nodes", nodes,
                       "--format", "json", "--save-baseline", str(baseline))
    assert "changes" not in audit_json(saved)  # stdout stays one JSON document
    document = json.loads(baseline.read_text())
    assert (document["format"], document["version"], document["profile"]) == ("clusterkit-audit-baseline", 1,
                                                                              "audit-ib")
    assert sorted(document["nodes"]) == ["ib-nohca", "ib-nopeermem", "ib-ok"]
    assert document["nodes"]["ib-ok"]["gpu.driver"] == DRIVER

    with contextlib.ExitStack() as changed:
        for node in ("ib-ok", "ib-nohca"):
            changed.enter_context(dev_cluster.override(node, "gpus.csv",
                                                       gpus_csv_with_driver(dev_cluster, node, NEW_DRIVER)))
        changed.enter_context(dev_cluster.override("ib-nopeermem", "class/infiniband/mlx5_0/ports/1/state",
                                                   "1: DOWN"))
        after = clusterkit(dev_cluster, "audit", "--profile", str(ib_profile), "--nodes", nodes,
                           "--format", "json", "--baseline", str(baseline))
        table = clusterkit(dev_cluster, "audit", "--profile", str(ib_profile), "--nodes", nodes,
                           "--baseline", str(baseline))

    audit = audit_json(after)
    assert audit["changes"] == [
        {"node": "ib-nohca", "fact": "gpu.driver", "before": DRIVER, "after": NEW_DRIVER},
        {"node": "ib-nopeermem", "fact": "rdma.mlx5_0.1.state", "before": "4: ACTIVE", "after": "1: DOWN"},
        {"node": "ib-ok", "fact": "gpu.driver", "before": DRIVER, "after": NEW_DRIVER},
    ]
    assert audit["summary"]["changes"] == 3
    assert audit["baseline"] == {"created": document["created"], "profile": "audit-ib"}
    assert "Traceback" not in table.stderr
    assert section(table.stdout, "CHANGES since") == [
        f"gpu.driver {DRIVER} -> {NEW_DRIVER} on ib-nohca,ib-ok",
        "rdma.mlx5_0.1.state 4: ACTIVE -> 1: DOWN on ib-nopeermem",
    ]
    assert f"CHANGES since {document['created']}" in table.stdout


@pytest.mark.parametrize(("content", "words"), [
    ("this is not JSON {", "not a JSON baseline"),
    ('["a", "list"]', "not a clusterkit audit baseline"),
    (None, "no such file"),
])
def test_a_bad_baseline_is_bad_input(dev_cluster: Any, ib_profile: Path, tmp_path: Path,
                                     content: str | None, words: str) -> None:
    baseline = tmp_path / "b.json"
    if content is not None:
        baseline.write_text(content)
    result = clusterkit(dev_cluster, "audit", "--profile", str(ib_profile), "--nodes", "ib-ok",
                        "--baseline", str(baseline))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert f"{baseline}" in result.stderr and words in result.stderr
    assert "--save-baseline" in result.stderr  # says how to make a good one


# ---------------------------------------------------------------- drain / undrain on the real Slurm


def slurm_nodes(dev_cluster: Any) -> dict[str, tuple[str, str]]:
    """{node: (sinfo state, reason)} of partition debug straight from Slurm (partition side's
    nodes change state with the tests that run beside these)."""
    done = subprocess.run(["sinfo", "--Node", "--noheader", "--partition=debug", "--format=%N|%T|%E"],
                          capture_output=True, text=True, check=True, env=dev_cluster.slurm_env(), timeout=30)
    rows = (line.split("|", 2) for line in done.stdout.splitlines() if line.strip())
    return {node: (state, "" if reason == "none" else reason) for node, state, reason in rows}


def scontrol_update(dev_cluster: Any, *args: str, check: bool = True) -> None:
    subprocess.run(["scontrol", "update", *args], capture_output=True, text=True, check=check,
                   env=dev_cluster.slurm_env(), timeout=30)


@pytest.fixture()
def slurm_restored(dev_cluster: Any) -> Iterator[None]:
    """n1 and n2 back in service whatever happens: other tests submit jobs to them."""
    try:
        yield
    finally:
        scontrol_update(dev_cluster, "NodeName=n[1-2]", "State=RESUME", check=False)


@pytest.fixture()
def slurm_profile(dev_cluster: Any, tmp_path: Path) -> dict[str, Any]:
    """Like profiles/local-dev.yaml, for this dev cluster's state dir."""
    return {
        "name": "audit-slurm",
        "nodes": "n[1-2]",
        "ssh": ssh_section(dev_cluster),
        "slurm": {"partition": "debug", "gpus_per_node": 4},
        "network": {"fabric": "infiniband", "ib_hca": ["mlx5_0:1", "mlx5_1:1"]},
        "expect": {"gpus_per_node": 4, "ib_rate_gbps": 400, "peermem": True},
    }


def test_drain_and_undrain_round_trip(dev_cluster: Any, slurm_profile: dict[str, Any], tmp_path: Path,
                                      slurm_restored: None) -> None:
    profile = write_profile(tmp_path / "slurm.yaml", slurm_profile)
    login_profile = write_profile(tmp_path / "via-login.yaml", {
        **slurm_profile, "name": "audit-login",
        "login": {"host": "login", "config_file": str(dev_cluster.ssh_config)}})
    audit = ["audit", "--profile", str(profile), "--nodes", "n[1-2]"]
    before = slurm_nodes(dev_cluster)
    assert not any("drain" in before[n][0] for n in ("n1", "n2")), f"n1/n2 already drained: {before}"

    with dev_cluster.override("n2", "class/infiniband/mlx5_0/ports/1/state", "1: DOWN"):
        planned = clusterkit(dev_cluster, *audit, "--drain")
        assert planned.returncode == 1, planned.stderr
        drain_lines = [line for line in planned.stdout.splitlines() if line.startswith("scontrol ")]
        assert [shlex.split(line) for line in drain_lines] == [
            ["scontrol", "update", "NodeName=n2", "State=DRAIN", f"Reason={DRAIN_REASON}"]]
        assert slurm_nodes(dev_cluster) == before  # printed, not run

        # Through the login node the same drain runs as ckuser, whom Slurm does not let update nodes.
        refused = clusterkit(dev_cluster, "audit", "--profile", str(login_profile), "--nodes", "n[1-2]",
                             "--drain", "--apply")
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "Traceback" not in refused.stderr
        assert "clusterkit: error: scontrol failed on login: slurm_update error: Invalid user id" in refused.stderr
        assert "applied:" not in refused.stdout  # nothing was applied
        assert slurm_nodes(dev_cluster) == before

        applied = clusterkit(dev_cluster, *audit, "--drain", "--apply")
        assert applied.returncode == 1, applied.stderr
        assert (f"applied: {shlex.join(['scontrol', 'update', 'NodeName=n2', 'State=DRAIN', f'Reason={DRAIN_REASON}'])}"
                in applied.stdout)
        drained = slurm_nodes(dev_cluster)
        assert "drain" in drained["n2"][0] and drained["n2"][1] == DRAIN_REASON
        assert drained["n1"] == before["n1"]
    # n2's port is ACTIVE again; an admin drains n1 for a reason of their own.
    scontrol_update(dev_cluster, "NodeName=n1", "State=DRAIN", f"Reason={ADMIN_REASON}")

    undrained = clusterkit(dev_cluster, *audit, "--undrain", "--apply")
    after = slurm_nodes(dev_cluster)
    scontrol_update(dev_cluster, "NodeName=n1", "State=RESUME", check=False)  # keep the drained window short
    assert undrained.returncode == 0, undrained.stdout + undrained.stderr
    assert after["n1"] == ("drained", ADMIN_REASON) or "drain" in after["n1"][0], (after, undrained.stdout)
    assert "applied: scontrol update NodeName=n2 State=UNDRAIN" in undrained.stdout
    assert "NodeName=n1" not in undrained.stdout
    assert "drain" not in after["n2"][0]
    assert "drain" in after["n1"][0] and after["n1"][1] == ADMIN_REASON
    # The report shows Slurm's view of the drained nodes as it was when the audit ran.
    drained_rows = [re.split(r"\s{2,}", row.strip()) for row in section(undrained.stdout, "DRAINED IN SLURM")[1:]]
    assert sorted((row[1], row[2]) for row in drained_rows) == [("n1", ADMIN_REASON), ("n2", DRAIN_REASON)]
    assert all("drain" in row[0] for row in drained_rows)


def test_audit_json_carries_slurm_state_of_the_audited_nodes_only(dev_cluster: Any, slurm_profile: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "slurm.yaml", slurm_profile)
    result = clusterkit(dev_cluster, "audit", "--profile", str(profile), "--nodes", "n1", "--format", "json")
    audit = audit_json(result)
    assert result.returncode == 0, result.stderr
    assert audit["nodes"] == ["n1"] and audit["drift"] == []
    assert set(audit["slurm"]) == {"n1"}
    assert set(audit["slurm"]["n1"]) == {"state", "reason"}
