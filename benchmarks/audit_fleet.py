"""`clusterkit audit` of 500 nodes end to end: the real CLI, real sshds, fake hardware.

    .venv/bin/python benchmarks/audit_fleet.py [--nodes 500] [--repeat 1] [--no-chromium]

Needs root (it starts sshds in mount namespaces and creates the user `ckbench`),
OpenSSH's sshd, util-linux's unshare; Chromium is used when installed. Everything
is built here and torn down at the end (each sshd is stopped by its pid):

- SERVERS real OpenSSH sshds on 127.0.8.1-4 port 22 (a loopback range nothing else
  here uses), each in its own mount+UTS namespace where a fake /sys/class and
  /sys/module (built with scripts/devcluster/fakehw.py, as the dev cluster does)
  are bind-mounted and the stand-in nvidia-smi comes first on PATH. Two servers
  are healthy InfiniBand H100 nodes (8 GPUs, mlx5_0..3 NDR), one has an older
  driver, one has mlx5_1 port 1 DOWN;
- node names gpu001..gpuNNN, each an alias in a generated ssh_config (HostName,
  User, IdentityFile, UserKnownHostsFile) that clusterkit reads through
  `ssh.config_file`: most aliases point at the healthy servers, 2% at the old
  driver, 1% at the DOWN port, two at an address where nothing listens.

Measured, each through a wrapper process so that getrusage(RUSAGE_CHILDREN)
covers that one command: wall time and peak RSS of `clusterkit audit --format json`
and `--format html -o FILE`, the sizes of what they wrote, and Chromium's
`--dump-dom` time for the page (browser start included; a blank page for scale).
The sshds and the probes they run share this machine's CPUs with the client.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "devcluster"))
sys.path.insert(0, str(ROOT))

import fakehw  # type: ignore[import-not-found]  # scripts/devcluster, not a package
from sshbench import (
    USER,
    clusterkit_argv,
    ensure_user,
    keygen,
    sshd_config,
    stop_daemons,
    wait_listening,
)

ADDRESS_PREFIX = "127.0.8."
NOWHERE = "127.0.8.250"  # nothing listens here: connection refused
OLD_DRIVER = "535.104.05"
CHILD_FLAG = "--measure-child"
RUN_TIMEOUT_S = 1800
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
# name -> (fakehw spec, driver). Order gives each server distinct GUIDs and MACs.
SERVERS = {
    "healthy-a": (fakehw.ib_node(4, 8), fakehw.DRIVER),
    "healthy-b": (fakehw.ib_node(4, 8), fakehw.DRIVER),
    "old-driver": (fakehw.ib_node(4, 8), OLD_DRIVER),
    "port-down": (fakehw.ib_node(4, 8, down=("mlx5_1",)), fakehw.DRIVER),
}


@dataclass(frozen=True)
class Fleet:
    directory: Path
    profile: Path
    names: list[str]
    placement: dict[str, str]  # alias -> server name, or "unreachable"


# ---------------------------------------------------------------- the fleet


def build_tree(node_dir: Path, server: str, index: int) -> None:
    """A fake /sys/class, /sys/module, gpus.csv, nvidia-smi and dmesg, as fakehw lays them out."""
    spec, driver = SERVERS[server]
    fakehw.build_infiniband(str(node_dir / "class" / "infiniband"), spec, server, index)
    fakehw.build_net(str(node_dir / "class" / "net"), spec, index)
    fakehw.build_modules(str(node_dir / "module"), str(node_dir / "proc_modules"), spec)
    fakehw.build_counters(str(node_dir / "class" / "infiniband"), spec)
    fakehw.write(str(node_dir / "gpus.csv"), fakehw.gpus_csv(server, spec).replace(fakehw.DRIVER, driver))
    fakehw.write(str(node_dir / "cuda_version"), fakehw.CUDA)
    fakehw.install_tools(str(node_dir), spec)   # the stand-in nvidia-smi and dmesg


def namespaced_sshd(directory: Path, server: str) -> list[str]:
    """sshd -D in a new mount+UTS namespace that sees the server's fake tree (exec: same pid)."""
    script = ('set -e; hostname "$1"; mount --bind "$2/class" /sys/class; '
              'mount --bind "$2/module" /sys/module; shift 2; exec "$@"')
    return ["unshare", "--mount", "--uts", "--propagation", "private", "--", "/bin/sh", "-c", script,
            "in-node", server, str(directory / server), "/usr/sbin/sshd", "-D",
            "-f", str(directory / f"sshd-{server}.conf"), "-E", str(directory / f"sshd-{server}.log")]


def placement(count: int) -> dict[str, str]:
    """alias -> server: 2% old driver, 1% DOWN port, two unreachable, the rest healthy."""
    names = [f"gpu{i:03d}" for i in range(1, count + 1)]
    old, down = max(1, count // 50), max(1, count // 100)
    where = {}
    for position, name in enumerate(names):
        if position >= count - 2:
            where[name] = "unreachable"
        elif position >= count - 2 - down:
            where[name] = "port-down"
        elif position >= count - 2 - down - old:
            where[name] = "old-driver"
        else:
            where[name] = "healthy-a" if position % 2 == 0 else "healthy-b"
    return where


def client_config(directory: Path, where: dict[str, str], addresses: dict[str, str]) -> str:
    blocks = [f"""\
Host {name}
    HostName {addresses.get(server, NOWHERE)}
    User {USER}
    IdentityFile {directory}/id_ed25519
    UserKnownHostsFile {directory}/known_hosts
""" for name, server in where.items()]
    return "\n".join(blocks)


def profile_text(directory: Path, count: int) -> str:
    return json.dumps({
        "name": "fleet-bench",
        "nodes": f"gpu[001-{count:03d}]",
        "ssh": {"config_file": str(directory / "ssh_config"), "connect_timeout": 30, "command_timeout": 300},
        "network": {"fabric": "infiniband", "ib_hca": ["mlx5_0:1", "mlx5_1:1"]},
        "expect": {"gpus_per_node": 8, "gpu_model": "H100", "min_driver": "550.54", "ib_rate_gbps": 400,
                   "peermem": True},
    }, indent=1)


@contextmanager
def bench_fleet(count: int) -> Iterator[Fleet]:
    """Start the sshds, write keys, trees and configs; stop the sshds (by pid) on the way out."""
    if os.geteuid() != 0:
        raise SystemExit("needs root: it starts sshds in mount namespaces and creates the user ckbench")
    ensure_user()
    os.makedirs("/run/sshd", exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="ckbench-audit-"))
    directory.chmod(0o755)  # ckbench reads authorized_keys, nvidia-smi and its CSV here
    daemons: list[subprocess.Popen[bytes]] = []
    old_umask = os.umask(0o022)
    try:
        host_key = keygen(directory / "host_ed25519").split()
        (directory / "authorized_keys").write_text(keygen(directory / "id_ed25519") + "\n")
        addresses = {server: f"{ADDRESS_PREFIX}{i}" for i, server in enumerate(SERVERS, start=1)}
        (directory / "known_hosts").write_text(f"{','.join(addresses.values())} {host_key[0]} {host_key[1]}\n")
        where = placement(count)
        (directory / "ssh_config").write_text(client_config(directory, where, addresses))
        profile = directory / "fleet.yaml"
        profile.write_text(profile_text(directory, count))
        for index, server in enumerate(SERVERS):
            build_tree(directory / server, server, index)
            (directory / f"sshd-{server}.conf").write_text(sshd_config(directory, addresses[server], 22, server,
                            f"SetEnv PATH={directory}/{server}/bin:/usr/local/bin:/usr/bin:/bin\n"))
            daemons.append(subprocess.Popen(namespaced_sshd(directory, server), stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + 15
        for address in addresses.values():
            wait_listening(address, 22, deadline)
        yield Fleet(directory, profile, list(where), where)
    finally:
        os.umask(old_umask)
        stop_daemons(daemons)
        shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------- measuring


def measure_child(argv: list[str]) -> int:
    """Run argv (stdout to argv[0]'s file); print wall, peak RSS and CPU of that one command."""
    stdout_path, command = argv[0], argv[1:]
    started = time.perf_counter()
    with open(stdout_path, "wb") as out:
        proc = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                              timeout=RUN_TIMEOUT_S, check=False)
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wall_s": wall, "maxrss_kib": usage.ru_maxrss, "cpu_s": usage.ru_utime + usage.ru_stime,
                      "rc": proc.returncode, "stderr": proc.stderr.decode(errors="replace")[-2000:]}))
    return 0


def measured(command: list[str], stdout_path: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), CHILD_FLAG, str(stdout_path), *command],
                          capture_output=True, text=True, check=True, timeout=RUN_TIMEOUT_S + 60)
    return json.loads(done.stdout)


def chromium_load(url: str, workdir: Path, repeat: int = 2) -> float:
    """Best wall time of `chromium --headless --dump-dom URL`, browser start included."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise FileNotFoundError("chromium")
    argv = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={workdir / 'chromium-profile'}", "--dump-dom", url]
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        best = min(best, time.perf_counter() - started)
        if "data-ready" not in done.stdout and "<html" not in done.stdout:
            raise RuntimeError(f"chromium did not load {url}: {done.stderr[-500:]}")
    return best


def check_document(document: dict[str, Any], fleet: Fleet) -> dict[str, Any]:
    """What the JSON says about the fleet, checked against how it was built."""
    unreachable = sorted(n for n, s in fleet.placement.items() if s == "unreachable")
    assert document["unreachable"] == unreachable, document["unreachable"]
    assert len(document["nodes"]) + len(unreachable) == len(fleet.names)
    drift = {d["fact"]: d for d in document["drift"]}
    old = sorted(n for n, s in fleet.placement.items() if s == "old-driver")
    assert sorted(drift["gpu.driver"]["outliers"]) == old, drift.get("gpu.driver")
    down = sorted(n for n, s in fleet.placement.items() if s == "port-down")
    assert sorted(drift["rdma.mlx5_1.1.state"]["outliers"]) == down
    return {"drifting_facts": len(document["drift"]), "facts_per_node": len(next(iter(document["facts"].values()))),
            "summary": document["summary"],
            "gpu.driver": f"{drift['gpu.driver']['majority']} on {drift['gpu.driver']['majority_nodes']}; "
                          f"{OLD_DRIVER} on {len(old)} nodes"}


def run(count: int, repeat: int, use_chromium: bool) -> dict[str, Any]:
    results: dict[str, Any] = {"nodes": count}
    with bench_fleet(count) as fleet:
        base = [*clusterkit_argv(), "audit", "--profile", str(fleet.profile)]
        json_out, html_out = fleet.directory / "audit.json", fleet.directory / "audit.html"
        runs: dict[str, list[dict[str, Any]]] = {"json": [], "html": []}
        for _ in range(repeat):
            runs["json"].append(measured([*base, "--format", "json"], json_out))
            runs["html"].append(measured([*base, "--format", "html", "-o", str(html_out)],
                                         fleet.directory / "html.stdout"))
        for kind, samples in runs.items():
            for sample in samples:
                if sample["rc"] not in (0, 1):
                    raise SystemExit(f"audit --format {kind} exited {sample['rc']}: {sample['stderr']}")
            results[kind] = min(samples, key=lambda s: s["wall_s"])
            results[kind]["all_wall_s"] = [round(s["wall_s"], 2) for s in samples]
        results["json_bytes"] = json_out.stat().st_size
        results["html_bytes"] = html_out.stat().st_size
        results.update(check_document(json.loads(json_out.read_text()), fleet))
        if use_chromium and (shutil.which("chromium") or shutil.which("chromium-browser")):
            blank = fleet.directory / "blank.html"
            blank.write_text("<!DOCTYPE html><html><body>blank</body></html>")
            results["chromium_blank_s"] = chromium_load(blank.as_uri(), fleet.directory)
            results["chromium_audit_s"] = chromium_load(html_out.as_uri(), fleet.directory)
    return results


def print_table(r: dict[str, Any]) -> None:
    rows = [
        ("nodes (aliases) / sshds", f"{r['nodes']} / {len(SERVERS)}"),
        ("reachable / unreachable / failing",
         f"{r['summary']['reachable']} / {r['summary']['unreachable']} / {r['summary']['fail']}"),
        ("facts per node / drifting facts", f"{r['facts_per_node']} / {r['drifting_facts']}"),
        ("audit --format json: wall", f"{r['json']['wall_s']:.2f} s  (runs: {r['json']['all_wall_s']})"),
        ("audit --format json: CPU of the CLI", f"{r['json']['cpu_s']:.2f} s"),
        ("audit --format json: peak RSS", f"{r['json']['maxrss_kib'] / 1024:.1f} MiB"),
        ("audit --format html -o: wall", f"{r['html']['wall_s']:.2f} s  (runs: {r['html']['all_wall_s']})"),
        ("audit --format html -o: CPU of the CLI", f"{r['html']['cpu_s']:.2f} s"),
        ("audit --format html -o: peak RSS", f"{r['html']['maxrss_kib'] / 1024:.1f} MiB"),
        ("JSON size", f"{r['json_bytes']:,} B"),
        ("HTML size", f"{r['html_bytes']:,} B"),
    ]
    if "chromium_audit_s" in r:
        rows += [("Chromium --dump-dom, blank page", f"{r['chromium_blank_s']:.2f} s"),
                 ("Chromium --dump-dom, audit page", f"{r['chromium_audit_s']:.2f} s")]
    width = max(len(name) for name, _ in rows)
    print(f"{'measure':<{width}}  value")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(f"\ngpu.driver drift: {r['gpu.driver']}")
    print(f"python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        return measure_child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each format; the fastest is shown")
    parser.add_argument("--no-chromium", action="store_true")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()
    results = run(args.nodes, args.repeat, not args.no_chromium)
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
