"""Audit report benchmark: synthetic probe facts of 500 and 1,000 nodes -> drift, audit,
baseline diff, every renderer, peak memory, HTML size and Chromium load time.

    .venv/bin/python benchmarks/audit.py [--nodes 500,1000] [--no-chromium]

Each node looks like a real H100 node's probe output (8 GPUs, 8 single-port NDR
HCAs with a 4-entry GID table, 10 netdevs); a few nodes drift: an older driver on
2%, a DOWN port, a missing HCA, older HCA firmware. The SSH fan-out itself is
not measured here (see the audit CLI benchmark).
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster_kit.fleet import audit
from cluster_kit.fleet.facts import flatten
from cluster_kit.report import audit as audit_report

REPEAT = 3
BUILD_MS = re.compile(r'data-build-ms="(\d+)"')
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def gpu_facts(index: int, driver: str) -> dict[str, Any]:
    gpus = [{"index": str(g), "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{index:05d}{g:03d}-7f3a-4b2c-9d1e",
             "driver_version": driver, "memory_total": "81559 MiB", "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0"}
            for g in range(8)]
    return {"status": "ok", "driver": driver, "cuda": "12.4", "gpus": gpus}


def port_facts(index: int, hca: int, state: str) -> dict[str, Any]:
    guid = f"0c42:a103:00{index % 256:02x}:{hca:04x}"
    return {"state": state, "phys_state": "5: LinkUp" if state == "4: ACTIVE" else "2: Polling",
            "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand", "lid": str(index * 8 + hca), "sm_lid": "1",
            "gids": {"0": f"fe80:0000:0000:0000:{guid}", "1": f"fe80:0000:0000:0000:{guid}",
                     "2": "0000:0000:0000:0000:0000:0000:0000:0000", "3": "0000:0000:0000:0000:0000:0000:0000:0000"},
            "gid_types": {"0": "IB/RoCE v1", "1": "RoCE v2"}, "gid_ndevs": {}}


def rdma_facts(index: int, fw: str, down: bool, missing: bool) -> dict[str, Any]:
    hcas = {}
    for h in range(7 if missing else 8):
        state = "1: DOWN" if down and h == 3 else "4: ACTIVE"
        hcas[f"mlx5_{h}"] = {"fw_ver": fw, "node_guid": f"0c42:a103:00{index % 256:02x}:{h:04x}",
                             "sys_image_guid": f"0c42:a103:00{index % 256:02x}:0000", "board_id": "MT_0000000838",
                             "hca_type": "MT4129", "node_type": "1: CA", "netdevs": [f"ibp{h}s0"],
                             "ports": {"1": port_facts(index, h, state)}}
    return {"status": "ok", "hcas": hcas}


def net_facts(index: int) -> dict[str, Any]:
    names = ["eth0", "lo"] + [f"ibp{h}s0" for h in range(8)]
    return {"status": "ok", "interfaces": {
        name: {"operstate": "up", "carrier": "1", "mtu": "9000" if name == "eth0" else "4092",
               "address": f"02:00:{index // 256 % 256:02x}:{index % 256:02x}:00:{n:02x}", "speed": "100000",
               "type": "1" if name.startswith("eth") else "32"} for n, name in enumerate(names)}}


def probe_facts(index: int, node: str) -> dict[str, Any]:
    """One node's probe output (docs/architecture.md, "Probe facts") with the drift rules applied."""
    return {
        "probe_version": 1, "hostname": node, "slurm_node": None,
        "os": {"status": "ok", "kernel": "5.15.0-105-generic", "arch": "x86_64", "os_release": "Ubuntu 22.04.4 LTS",
               "os_id": "ubuntu", "os_version_id": "22.04", "python": "3.10.12", "python_executable": "/usr/bin/python3"},
        "gpu": gpu_facts(index, "535.104.05" if index % 50 == 7 else "550.54.15"),
        "nccl": {"status": "ok", "version": "2.21.5", "path": "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
                 "candidates": ["/usr/lib/x86_64-linux-gnu/libnccl.so.2"]},
        "rdma": rdma_facts(index, "28.37.1014" if index % 97 == 5 else "28.39.1002", index == 11, index == 23),
        "net": net_facts(index),
        "peermem": {"status": "ok", "nvidia_peermem": True, "nv_peer_mem": False},
        "memlock": {"status": "ok", "soft_kib": "unlimited", "hard_kib": "unlimited"},
        "iommu": {"status": "ok", "groups": "0", "cmdline": ""},
        "torch": {"status": "skipped"},
    }


def preflight_entry(index: int, node: str) -> dict[str, Any]:
    """The preflight node entry that goes with probe_facts (three failing, two unreachable)."""
    if index in (3, 400):
        return {"node": node, "status": "unreachable", "elapsed_s": 10.0, "checks": [
            {"id": "ssh.reachable", "status": "unreachable", "message": "timed out", "fix": "check sshd"}]}
    failing = {11: ("rdma.port_state", "mlx5_3 port 1 is DOWN"), 23: ("rdma.hca_present", "mlx5_7 is missing")}
    checks = [{"id": cid, "status": "pass", "message": "ok", "fix": ""}
              for cid in ("gpu.count", "gpu.model", "gpu.driver", "nccl.library", "rdma.peermem", "sys.memlock")]
    if index in failing:
        checks.append({"id": failing[index][0], "status": "fail", "message": failing[index][1], "fix": "reseat"})
    return {"node": node, "status": "fail" if index in failing else "pass", "elapsed_s": 0.4, "checks": checks}


def fleet(count: int) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    nodes = [f"gpu{i:04d}" for i in range(1, count + 1)]
    entries = [preflight_entry(i, n) for i, n in enumerate(nodes, start=1)]
    facts = {n: probe_facts(i, n) for i, n in enumerate(nodes, start=1) if entries[i - 1]["status"] != "unreachable"}
    return {"profile": "prod", "nodes": entries}, facts


def timed(fn: Callable[[], Any], repeat: int = REPEAT) -> tuple[Any, float]:
    """fn's result and its best wall time of `repeat` runs (the machine is shared)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return result, best


def chromium_load(url: str, workdir: Path) -> tuple[float, float | None]:
    """Best wall time of `chromium --headless --dump-dom URL` (browser start included) and
    the page script's own time (its data-build-ms), over two runs."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise FileNotFoundError("chromium")
    argv = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={workdir / 'profile'}", "--dump-dom", url]
    runs = []
    for _ in range(2):
        started = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout
        match = BUILD_MS.search(out)
        runs.append((time.perf_counter() - started, float(match.group(1)) / 1000 if match else None))
    if "audit.html" in url and runs[0][1] is None:
        raise RuntimeError("the audit page did not finish its script")
    return min(runs, key=lambda run: run[0])


def audit_and_pages(report: dict[str, Any], facts: dict[str, Any], baseline: dict[str, Any],
                    r: dict[str, Any], repeat: int = REPEAT) -> dict[str, str]:
    """build_audit then every renderer, their times recorded in `r`; returns the pages."""
    doc, r["build_audit_s"] = timed(lambda: audit.build_audit("prod", report, facts, baseline), repeat)
    pages = {}
    for fmt in audit_report.FORMATS:
        pages[fmt], r[f"{fmt}_s"] = timed(functools.partial(audit_report.render, doc, fmt), repeat)
    return pages


def peak_mib(report: dict[str, Any], facts: dict[str, Any], baseline: dict[str, Any]) -> float:
    """Peak Python allocation of build_audit plus all renderers (a separate run: tracemalloc slows it)."""
    gc.collect()
    tracemalloc.start()
    audit_and_pages(report, facts, baseline, {}, repeat=1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def measure(count: int, use_chromium: bool) -> dict[str, Any]:
    """All figures of one fleet size."""
    report, facts = fleet(count)
    flat = {node: flatten(node_facts) for node, node_facts in facts.items()}
    r: dict[str, Any] = {"nodes": count, "facts_per_node": max(len(f) for f in flat.values())}
    drift, r["compute_drift_s"] = timed(lambda: audit.compute_drift(flat))
    r["drift_facts"] = len(drift)
    baseline = audit.save_baseline(flat, profile="prod")
    r["baseline_bytes"] = len(json.dumps(baseline))
    pages = audit_and_pages(report, facts, baseline, r)
    r.update({f"{fmt}_bytes": len(page.encode()) for fmt, page in pages.items()})
    r["peak_mib"] = peak_mib(report, facts, baseline)
    if use_chromium:
        r.update(chromium_figures(pages["html"]))
    return r


def chromium_figures(page: str) -> dict[str, Any]:
    """Load times of a blank page, the audit page and its all-facts view; {} without chromium."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = work / "audit.html"
        path.write_text(page)
        blank = work / "blank.htm"
        blank.write_text("<!DOCTYPE html><title>blank</title>")
        r: dict[str, Any] = {"chromium_blank_s": chromium_load(blank.as_uri(), work)[0]}
        r["chromium_audit_s"], r["script_s"] = chromium_load(path.as_uri(), work)
        r["chromium_all_s"], r["script_all_s"] = chromium_load(path.as_uri() + "#all", work)
        return r


ROWS = [("facts per node", "facts_per_node", "{}"), ("drifting facts", "drift_facts", "{}"),
        ("compute_drift", "compute_drift_s", "{:.3f} s"), ("build_audit (flatten, drift, diff)", "build_audit_s", "{:.3f} s"),
        ("render_table", "table_s", "{:.3f} s"), ("render_json", "json_s", "{:.3f} s"),
        ("render_markdown", "markdown_s", "{:.3f} s"), ("render_html", "html_s", "{:.3f} s"),
        ("peak Python memory (build + renders)", "peak_mib", "{:.1f} MiB"),
        ("HTML size", "html_bytes", "{:,} B"), ("JSON size", "json_bytes", "{:,} B"),
        ("baseline size", "baseline_bytes", "{:,} B"),
        ("Chromium --dump-dom, blank page", "chromium_blank_s", "{:.2f} s"),
        ("Chromium --dump-dom, audit page", "chromium_audit_s", "{:.2f} s"),
        ("Chromium --dump-dom, audit page, all facts (#all)", "chromium_all_s", "{:.2f} s"),
        ("page script (parse data, draw grid)", "script_s", "{:.3f} s"),
        ("page script, all facts", "script_all_s", "{:.3f} s")]


def print_table(results: list[dict[str, Any]]) -> None:
    print("| measure | " + " | ".join(f"{r['nodes']} nodes" for r in results) + " |")
    print("| --- |" + " ---: |" * len(results))
    for label, key, fmt in ROWS:
        cells = [fmt.format(r[key]) if r.get(key) is not None else "-" for r in results]
        print(f"| {label} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="500,1000", help="comma-separated fleet sizes")
    parser.add_argument("--no-chromium", action="store_true", help="skip the browser load time")
    args = parser.parse_args()
    print_table([measure(int(n), not args.no_chromium) for n in args.nodes.split(",")])


if __name__ == "__main__":
    main()
