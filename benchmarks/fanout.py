"""SSH fan-out: clusterkit against pdsh (and clush) running the same probe on the
same nodes with the same fan-out, in the same run.

    .venv/bin/python benchmarks/fanout.py [--nodes 500] [--fanouts 32,64] [--repeat 3]
        [--scenarios direct,jump] [--peers clusterkit,ck-1proc,ck-by-200,pdsh,clush]

Needs root (it starts sshds and creates the user `ckbench`), OpenSSH's sshd and
client, pdsh; clush is used when installed. The script builds everything itself
and tears it down at the end (each sshd is stopped by its pid):

- `--servers` real OpenSSH sshds on 127.0.7.1..N port 22 (a range the dev
  cluster does not use), one host key of their own, key-only auth, user ckbench;
- node names b001..bNNN, assigned to the sshd addresses round-robin by a
  generated ssh_config (HostName, User, IdentityFile, HostKeyAlias,
  UserKnownHostsFile with every name's key recorded) that clusterkit
  (`SshSettings.config_file`) and the OpenSSH peers (`ssh -F`) both read.

Every peer runs one remote command per node, `python3 <dir>/probe.py --python
python3` (the probe as a file, because pdsh cannot feed a script on stdin);
`clusterkit fan_out` (benchmarks/fanout_child.py) calls `cluster_kit.ssh.fanout.fan_out` with exactly that command,
and `clusterkit preflight` is the real CLI end to end (probe sent on stdin,
checks evaluated, JSON report). Each peer runs as a subprocess of this script:
wall is its elapsed time, CPU its whole process tree's user+sys
(getrusage(RUSAGE_CHILDREN) deltas: pdsh's and clush's ssh children included).
The sshds and the probes they start are not in a peer's CPU: every peer pays the
same there. The machine's busy and idle CPU-seconds during each run (/proc/stat)
count them with the rest: idle near 0 means the run sat on the floor that probes,
sshds and client make together on these cores. The order of peers rotates from
one repetition to the next.

`--scenarios direct,jump` alternates the direct run with one through a jump host:
an sshd on 127.0.8.2 behind `relay.py` on 127.0.8.1, which holds every chunk
`--jump-delay-ms` (10) each way; every node's Host block then has `ProxyJump bjump`.
After each clusterkit run it prints the run's timeline summary (`timeline.py`):
where the wall went and how much of the fan-out window sat idle. `ck-1proc` is
`fan_out` held to one process (threads only): the default; with
`--clusterkit-prefix "env CK_FANOUT_PROCESSES=2"` the clusterkit peer runs the
opt-in worker processes against it. `ck-by-200` runs the same hosts as fan_out
calls of 200, one after the other, in one process: its CPU a node is what 200
nodes cost, measured in the same run as the fan-out over all of them.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from sshbench import (
    USER,
    ensure_user,
    keygen,
    sshd_config,
    stop_daemons,
    wait_listening,
)
from timeline import Timeline
from timeline import summarise as summarise_timelines

ROOT = Path(__file__).resolve().parent.parent
ADDRESS_PREFIX = "127.0.7."
PEERS = ("clusterkit", "preflight", "pdsh", "clush")  # and ck-1proc, ck-by-200, on request
TIMELINE_ENV = "CK_FANOUT_TIMELINE"  # where fanout_child.py writes its timelines
RUN_TIMEOUT_S = 1800


# ----------------------------------------------------------------------------
# The bench cluster: sshds, keys, ssh_config, known_hosts


@dataclass(frozen=True)
class Cluster:
    directory: Path
    config: Path
    probe: Path
    names: list[str]
    hostlist: str
    kex: str
    ciphers: str
    command: str = ""
    jump_config: Path | None = None  # the same nodes, each through JUMP_NAME
    scenario: str = "direct"

    @property
    def marker(self) -> str:
        """How each host's expected output line starts."""
        return "{" if not self.command else "ok"


JUMP_NAME = "bjump"
JUMP_RELAY = "127.0.8.1"  # relay.py listens here, delaying each chunk
JUMP_SSHD = "127.0.8.2"  # the jump host's sshd, behind the relay


def jump_block(directory: Path, port: int, kex: str) -> str:
    """The jump host as the client sees it: through the relay. KexAlgorithms pins
    the OpenSSH peers' `ssh -W` hop to the key exchange paramiko gets."""
    return f"""\
Host {JUMP_NAME}
    HostName {JUMP_RELAY}
    Port {port}
    User {USER}
    IdentityFile {directory}/id_ed25519
    IdentitiesOnly yes
    HostKeyAlias {JUMP_NAME}
    UserKnownHostsFile {directory}/known_hosts
    StrictHostKeyChecking yes
    BatchMode yes
    ControlMaster no
    ControlPath none
    KexAlgorithms {kex}
    LogLevel ERROR
"""


def jumped(config_text: str) -> str:
    """Every node block of `config_text` reached through the jump host."""
    return config_text.replace("    LogLevel ERROR\n", f"    ProxyJump {JUMP_NAME}\n    LogLevel ERROR\n")


def node_names(count: int) -> list[str]:
    return [f"b{i:03d}" for i in range(1, count + 1)]


def client_config(directory: Path, names: list[str], addresses: list[str], port: int) -> str:
    """One Host block per node name; the same file for clusterkit and ssh."""
    blocks = []
    for index, name in enumerate(names):
        blocks.append(f"""\
Host {name}
    HostName {addresses[index % len(addresses)]}
    Port {port}
    User {USER}
    IdentityFile {directory}/id_ed25519
    IdentitiesOnly yes
    HostKeyAlias {name}
    UserKnownHostsFile {directory}/known_hosts
    StrictHostKeyChecking yes
    BatchMode yes
    ControlMaster no
    ControlPath none
    LogLevel ERROR
""")
    return "\n".join(blocks)


def negotiated(client_order: list[str], server_list: str) -> str:
    """SSH picks the client's first algorithm that the server also offers."""
    offered = server_list.split(",")
    return next((alg for alg in client_order if alg in offered), "none")


def server_algorithms(conf: Path) -> dict[str, str]:
    text = subprocess.run(["/usr/sbin/sshd", "-T", "-f", str(conf)], capture_output=True, text=True,
                          check=True).stdout
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def openssh_choice(config: Path, kex: str, name: str) -> str:
    """The key exchange and cipher that ssh, as the peers run it, negotiates (ssh -v)."""
    done = subprocess.run(["ssh", "-v", "-F", str(config), "-o", f"KexAlgorithms={kex}", name, "true"],
                          capture_output=True, text=True, timeout=60, check=False)
    found = [line.split("kex: ", 1)[1] for line in done.stderr.splitlines()
             if "kex: algorithm:" in line or "kex: server->client" in line]
    return "; ".join(found) or f"unknown (ssh -v said: {_tail(done.stderr)})"


def paramiko_choice(server: dict[str, str]) -> tuple[str, str]:
    """(kex, cipher/mac) that clusterkit's paramiko negotiates with these sshds."""
    import paramiko

    from cluster_kit.ssh.connect import cipher_preference

    client = vars(paramiko.Transport)  # its algorithm lists, in preference order
    kex = negotiated(list(client["_preferred_kex"]), server["kexalgorithms"])
    cipher = negotiated(list(cipher_preference(client["_preferred_ciphers"])), server["ciphers"])
    mac = negotiated(list(client["_preferred_macs"]), server["macs"])
    return kex, f"{cipher} + {'its own MAC' if 'gcm' in cipher else mac}"


@contextmanager
def bench_cluster(count: int, servers: int, port: int, jump_delay_ms: float | None = None
                  ) -> Iterator[Cluster]:
    """Start the sshds, write keys and configs; stop the sshds (by pid) on the way out."""
    if os.geteuid() != 0:
        raise SystemExit("needs root: it starts sshds and creates the user ckbench")
    ensure_user()
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    directory = Path(tempfile.mkdtemp(prefix="ckbench-fanout-"))
    directory.chmod(0o755)  # ckbench reads authorized_keys and the probe here
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        host_key = keygen(directory / "host_ed25519").split()
        client_key = keygen(directory / "id_ed25519")
        (directory / "authorized_keys").write_text(client_key + "\n")
        (directory / "authorized_keys").chmod(0o644)
        shutil.copy(ROOT / "cluster_kit" / "node" / "probe.py", directory / "probe.py")
        (directory / "probe.py").chmod(0o644)
        names = node_names(count)
        addresses = [f"{ADDRESS_PREFIX}{i}" for i in range(1, servers + 1)]
        (directory / "known_hosts").write_text(
            "".join(f"{name} {host_key[0]} {host_key[1]}\n" for name in [*names, JUMP_NAME]))
        config = directory / "ssh_config"
        config.write_text(client_config(directory, names, addresses, port))
        deadline = time.monotonic() + 10
        jump_config = None
        if jump_delay_ms is not None:
            jump_config = directory / "ssh_config_jump"
            # curve25519: what paramiko negotiates with OpenSSH 9.2 (checked below)
            jump_config.write_text(jumped(client_config(directory, names, addresses, port)) + "\n"
                                   + jump_block(directory, port, "curve25519-sha256@libssh.org"))
            conf = directory / "sshd-jump.conf"
            conf.write_text(sshd_config(directory, JUMP_SSHD, port, "jump",
                                        "AllowTcpForwarding yes\n"))
            daemons.append(subprocess.Popen(
                ["/usr/sbin/sshd", "-D", "-f", str(conf), "-E", str(directory / "sshd-jump.log")],
                stdin=subprocess.DEVNULL))
            relay = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve().parent / "relay.py"), "--listen",
                 f"{JUMP_RELAY}:{port}", "--to", f"{JUMP_SSHD}:{port}", "--delay-ms", str(jump_delay_ms)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
            daemons.append(relay)
            assert relay.stdout is not None
            if relay.stdout.readline().strip() != "listening":
                raise SystemExit("the delaying relay did not start")
            addresses_to_wait = [JUMP_SSHD]
        else:
            addresses_to_wait = []
        for address in addresses:
            conf = directory / f"sshd-{address}.conf"
            conf.write_text(sshd_config(directory, address, port, address))
            daemons.append(subprocess.Popen(
                ["/usr/sbin/sshd", "-D", "-f", str(conf), "-E", str(directory / f"sshd-{address}.log")],
                stdin=subprocess.DEVNULL))
        for address in addresses + addresses_to_wait:
            wait_listening(address, port, deadline)
        server = server_algorithms(directory / f"sshd-{addresses[0]}.conf")
        kex, ciphers = paramiko_choice(server)
        if jump_config is not None and kex != "curve25519-sha256@libssh.org":
            jump_config.write_text(jump_config.read_text().replace("curve25519-sha256@libssh.org", kex))
        yield Cluster(directory, config, directory / "probe.py", names,
                      f"b[001-{count:03d}]", kex, ciphers, jump_config=jump_config)
    finally:
        stop_daemons(daemons)
        shutil.rmtree(directory, ignore_errors=True)


# ----------------------------------------------------------------------------
# Peers: each one a subprocess, measured the same way


@dataclass
class Sample:
    peer: str
    fanout: int
    wall_s: float
    cpu_s: float
    answered: int
    note: str = ""
    rep: int = 0
    scenario: str = "direct"
    rss_mb: float = 0.0
    machine_busy_s: float = 0.0  # every core's busy time during the run (/proc/stat)
    machine_idle_s: float = 0.0  # and idle time: near 0, the run sat on the machine's CPU floor
    timeline: list[str] = dataclasses.field(default_factory=list)


def measure(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str, str, int]:
    """(wall s, CPU s of the process tree, stdout, stderr, exit status). wait4 gives
    the CPU of this child and its reaped descendants (pdsh's and clush's ssh)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    streams: dict[str, str] = {}
    readers = [threading.Thread(target=lambda k=k, f=f: streams.__setitem__(k, f.read()))
               for k, f in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    killer = threading.Timer(RUN_TIMEOUT_S, proc.kill)
    killer.start()
    _, status, usage = os.wait4(proc.pid, 0)  # its own and its reaped descendants' usage
    wall = time.perf_counter() - started
    killer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    for reader in readers:
        reader.join()
    return wall, usage.ru_utime + usage.ru_stime, streams["out"], streams["err"], proc.returncode


def machine_cpu_s() -> tuple[float, float]:
    """(busy, idle) CPU-seconds of all cores since boot, from /proc/stat's first line
    (idle counts iowait; (0, 0) where there is no /proc)."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    hz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]
    return (sum(ticks[:8]) - idle) / hz, idle / hz


def hosts_with_facts(stdout: str, marker: str = "{") -> int:
    """Hosts whose `host: {...}` line carries the probe's JSON (pdsh/clush style)."""
    hosts = set()
    for line in stdout.splitlines():
        host, sep, rest = line.partition(": ")
        if sep and rest.startswith(marker) and (marker != "{" or rest.rstrip().endswith("}")):
            hosts.add(host)
    return len(hosts)


def remote_command(cluster: Cluster) -> list[str]:
    if cluster.command:
        return shlex.split(cluster.command)
    return ["python3", str(cluster.probe), "--python", "python3"]


def openssh_options(cluster: Cluster) -> str:
    return f"-F {cluster.config} -o KexAlgorithms={cluster.kex} -o ControlMaster=no"


def run_pdsh(cluster: Cluster, fanout: int) -> Sample:
    env = dict(os.environ, PDSH_SSH_ARGS_APPEND=openssh_options(cluster))
    argv = ["pdsh", "-R", "ssh", "-f", str(fanout), "-l", USER, "-w", cluster.hostlist,
            *remote_command(cluster)]
    wall, cpu, out, err, _ = measure(argv, env)
    return Sample("pdsh", fanout, wall, cpu, hosts_with_facts(out, cluster.marker), _tail(err))


def run_clush(cluster: Cluster, fanout: int) -> Sample:
    argv = ["clush", "-f", str(fanout), "-l", USER, "-o", openssh_options(cluster),
            "-w", cluster.hostlist, *remote_command(cluster)]
    wall, cpu, out, err, _ = measure(argv)
    return Sample("clush", fanout, wall, cpu, hosts_with_facts(out, cluster.marker), _tail(err))


def run_clusterkit(cluster: Cluster, fanout: int, prefix: tuple[str, ...] = (),
                   peer: str = "clusterkit", processes: str = "", batch: str = "") -> Sample:
    argv = [*prefix, sys.executable, str(Path(__file__).resolve().parent / "fanout_child.py"),
            str(cluster.config), str(fanout), str(len(cluster.names)), *remote_command(cluster)]
    record = cluster.directory / f"timeline-{fanout}.json"
    started = time.monotonic()
    env = dict(os.environ, **{TIMELINE_ENV: str(record)})
    if processes:
        env["CK_FANOUT_PROCESSES"] = processes
    if batch:
        env["CK_FANOUT_BATCH"] = batch
    wall, cpu, out, err, _ = measure(argv, env)
    ended = time.monotonic()
    sample = Sample(peer, fanout, wall, cpu, hosts_with_facts(out, cluster.marker), _tail(err))
    sample.timeline = timeline_report(record, fanout, started, ended)
    with suppress(OSError, ValueError, KeyError):
        sample.rss_mb = json.loads(record.read_text())["peak_rss_mb"]
    return sample


def timeline_report(record: Path, fanout: int, started: float, ended: float) -> list[str]:
    """The summary of the child's recorded timelines (monotonic clock, shared)."""
    try:
        raw = json.loads(record.read_text())
    except (OSError, ValueError) as exc:
        return [f"no timeline: {exc}"]
    raw.update(process_start=started, process_end=ended)
    record.write_text(json.dumps(raw))
    timelines = [Timeline(host, start, tuple((s, t) for s, t in marks))
                 for host, start, marks in raw["timelines"]]
    lines = summarise_timelines(timelines, fanout, started, ended).lines()
    marks = [("spawn", started), *sorted(raw["client"].items(), key=lambda kv: kv[1]), ("exit", ended)]
    lines.insert(1, "  client process: " + ", ".join(
        f"{a}->{b} {b_at - a_at:.3f} s" for (a, a_at), (b, b_at) in itertools.pairwise(marks)))
    return lines


def run_preflight(cluster: Cluster, fanout: int) -> Sample:
    profile = cluster.directory / f"bench-{fanout}.yaml"
    profile.write_text(json.dumps({
        "name": "fanout-bench", "nodes": cluster.hostlist,
        "ssh": {"config_file": str(cluster.config), "fanout": fanout,
                "connect_timeout": 60, "command_timeout": 600},
        "environment": {"python": "python3"},
        "network": {"fabric": "ethernet"},
    }))
    argv = [sys.executable, "-m", "cluster_kit", "preflight", "--profile", str(profile), "--json"]
    wall, cpu, out, err, _ = measure(argv, dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        report = json.loads(out)
        answered = sum(1 for node in report["nodes"]
                       if not any(c["id"] in ("ssh.reachable", "probe.run", "probe.python")
                                  for c in node["checks"]))
        note = json.dumps(report["summary"])
    except (ValueError, KeyError) as exc:
        answered, note = 0, f"no report: {exc}; {_tail(err)}"
    return Sample("preflight", fanout, wall, cpu, answered, note)


def run_clusterkit_threads(cluster: Cluster, fanout: int) -> Sample:
    """fan_out held to one process (threads only), as before worker processes."""
    return run_clusterkit(cluster, fanout, peer="ck-1proc", processes="1")


def run_clusterkit_by_200(cluster: Cluster, fanout: int) -> Sample:
    """The same hosts in fan_out calls of 200 one after the other, in one process: what a
    node costs at 200 nodes, measured beside the run over all of them."""
    return run_clusterkit(cluster, fanout, peer="ck-by-200", batch="200")


RUNNERS = {"clusterkit": run_clusterkit, "ck-1proc": run_clusterkit_threads, "ck-by-200": run_clusterkit_by_200,
           "preflight": run_preflight, "pdsh": run_pdsh, "clush": run_clush}


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


# ----------------------------------------------------------------------------
# Report


def versions() -> dict[str, str]:
    def first_line(argv: list[str]) -> str:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        except OSError:
            return "not installed"
        return (proc.stdout + proc.stderr).strip().splitlines()[0]

    import paramiko

    return {"python": platform.python_version(), "paramiko": paramiko.__version__,
            "openssh": first_line(["ssh", "-V"]), "pdsh": first_line(["pdsh", "-V"]),
            "clush": first_line(["clush", "--version"]) if shutil.which("clush") else "not installed",
            "cpus": str(os.cpu_count())}


def paired(samples: list[Sample], ours: str, peer: str, fanout: int) -> list[tuple[float, float]]:
    """(wall ratio, CPU ratio) of `ours` over `peer` within each repetition."""
    by_rep = {(s.peer, s.rep): s for s in samples if s.fanout == fanout}
    return [(by_rep[ours, rep].wall_s / by_rep[peer, rep].wall_s,
             by_rep[ours, rep].cpu_s / by_rep[peer, rep].cpu_s)
            for (name, rep) in by_rep if name == ours and (peer, rep) in by_rep]


def summarise(samples: list[Sample], fanouts: list[int], peers: list[str], nodes: int,
              scenario: str = "direct") -> None:
    print(f"\n{'peer':<11} {'fanout':>6} {'wall s (median, min-max)':>26} "
          f"{'CPU s (median, min-max)':>25} {'CPU ms/node':>11} {'answered':>9}")
    medians: dict[tuple[str, int], tuple[float, float]] = {}
    for fanout in fanouts:
        for peer in peers:
            mine = [s for s in samples if s.peer == peer and s.fanout == fanout]
            if not mine:
                continue
            walls, cpus = [s.wall_s for s in mine], [s.cpu_s for s in mine]
            wall, cpu = statistics.median(walls), statistics.median(cpus)
            medians[peer, fanout] = (wall, cpu)
            answered = min(s.answered for s in mine)
            print(f"{peer:<11} {fanout:>6} {wall:>9.2f} ({min(walls):6.2f}-{max(walls):6.2f}) "
                  f"{cpu:>9.2f} ({min(cpus):6.2f}-{max(cpus):6.2f}) {1000 * cpu / nodes:>11.1f} "
                  f"{answered:>5}/{nodes}")
    print("\nratios, median / median (in brackets: the ratios of each repetition's own pair, "
          "min-max); < 1 means clusterkit is faster or cheaper:")
    for fanout in fanouts:
        for ours in ("clusterkit", "ck-1proc", "preflight"):
            for peer in ("pdsh", "clush", "ck-by-200"):
                if (ours, fanout) in medians and (peer, fanout) in medians and ours != peer:
                    (w1, c1), (w2, c2) = medians[ours, fanout], medians[peer, fanout]
                    pairs = paired(samples, ours, peer, fanout)
                    print(f"  fanout {fanout:>3}  {ours:<10} / {peer:<5}  wall {w1 / w2:5.2f} "
                          f"({min(w for w, _ in pairs):.2f}-{max(w for w, _ in pairs):.2f})  "
                          f"CPU {c1 / c2:5.2f} ({min(c for _, c in pairs):.2f}-{max(c for _, c in pairs):.2f})")
    target = [(f, *medians[("clusterkit", f)], *medians[("pdsh", f)]) for f in fanouts
              if ("clusterkit", f) in medians and ("pdsh", f) in medians]
    wall_target = 0.65 if scenario == "jump" else 0.9
    for fanout, w1, c1, w2, c2 in target:
        verdict = "met" if w1 <= wall_target * w2 and c1 <= 0.5 * c2 else "MISSED"
        print(f"target (fan_out wall <= {wall_target}x pdsh's, CPU <= 0.5x), fanout {fanout}: {verdict} "
              f"({w1 / w2:.2f}, {c1 / c2:.2f})")
    for fanout in fanouts:
        if ("clusterkit", fanout) in medians and ("ck-by-200", fanout) in medians:
            ratio = medians["clusterkit", fanout][1] / medians["ck-by-200", fanout][1]
            print(f"target (CPU a node over all {nodes} nodes no higher than in fan-outs of 200), "
                  f"fanout {fanout}: {'met' if ratio <= 1 else 'MISSED'} ({ratio:.2f})")


def jump_overhead(samples: list[Sample], fanouts: list[int], peers: list[str]) -> None:
    """Each peer's jump wall over its own direct wall (medians), and clusterkit's
    jump wall over each peer's jump wall."""
    def median_wall(peer: str, scenario: str, fanout: int) -> float | None:
        walls = [s.wall_s for s in samples if (s.peer, s.scenario, s.fanout) == (peer, scenario, fanout)]
        return statistics.median(walls) if walls else None

    print("\njump host: wall through it over wall direct, each peer its own (median / median):")
    for fanout in fanouts:
        parts = []
        for peer in peers:
            jump, direct = median_wall(peer, "jump", fanout), median_wall(peer, "direct", fanout)
            if jump and direct:
                parts.append(f"{peer} {jump / direct:.2f} (+{100 * (jump / direct - 1):.0f}%)")
        print(f"  fanout {fanout:>3}: " + ", ".join(parts))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--servers", type=int, default=8, help="sshds on 127.0.7.1..N")
    parser.add_argument("--port", type=int, default=22)
    parser.add_argument("--fanouts", default="32,64")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--command", default="", metavar="CMD",
                        help="run CMD instead of the probe, to time SSH alone; it must print a line "
                             "starting with 'ok' (e.g. 'echo ok'); preflight is then left out")
    parser.add_argument("--json", metavar="FILE", help="also write every sample as JSON")
    parser.add_argument("--scenarios", default="direct", help="direct, jump or direct,jump (alternated)")
    parser.add_argument("--jump-delay-ms", type=float, default=10.0,
                        help="the relay's delay each way in front of the jump host")
    parser.add_argument("--timeline-dir", metavar="DIR",
                        help="keep each fan_out run's recorded timelines there as JSON")
    parser.add_argument("--clusterkit-prefix", default="", metavar="CMD",
                        help="run the fan_out peer under CMD (a profiler: "
                             "'py-spy record -f raw -o fanout.txt --'); its figures then include CMD")
    args = parser.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    peers = [p for p in args.peers.split(",") if p != "clush" or shutil.which("clush")]
    if "pdsh" in peers and not shutil.which("pdsh"):
        raise SystemExit("pdsh is not installed (apt-get install pdsh)")
    print(json.dumps(versions()))
    print(f"load average at start: {os.getloadavg()}")
    samples: list[Sample] = []
    if args.command:
        peers = [p for p in peers if p != "preflight"]
    scenarios = args.scenarios.split(",")
    with bench_cluster(args.nodes, args.servers, args.port,
                       args.jump_delay_ms if "jump" in scenarios else None) as base:
        base = dataclasses.replace(base, command=args.command)
        cluster = base
        print(f"{args.nodes} nodes over {args.servers} sshds; key exchange: paramiko negotiates "
              f"{cluster.kex} ({cluster.ciphers}) with these sshds, OpenSSH peers get "
              f"-o KexAlgorithms={cluster.kex}")
        print(f"OpenSSH peers negotiate: {openssh_choice(cluster.config, cluster.kex, cluster.names[0])}")
        print(f"remote command: {' '.join(remote_command(cluster))}")
        if base.jump_config is not None:
            print(f"jump host {JUMP_NAME}: sshd on {JUMP_SSHD}, reached through relay.py on "
                  f"{JUMP_RELAY} holding every chunk {args.jump_delay_ms:g} ms each way")
        for rep, scenario, fanout in itertools.product(range(args.repeat), scenarios, fanouts):
            cluster = base if scenario == "direct" else dataclasses.replace(
                base, config=base.jump_config, scenario=scenario)
            order = peers[rep % len(peers):] + peers[:rep % len(peers)]
            for peer in order:
                busy, idle = machine_cpu_s()
                if peer == "clusterkit" and args.clusterkit_prefix:
                    sample = run_clusterkit(cluster, fanout, tuple(shlex.split(args.clusterkit_prefix)))
                else:
                    sample = RUNNERS[peer](cluster, fanout)
                sample.rep, sample.scenario = rep, scenario
                busy_after, idle_after = machine_cpu_s()
                sample.machine_busy_s, sample.machine_idle_s = busy_after - busy, idle_after - idle
                samples.append(sample)
                print(f"  rep {rep + 1} {scenario:<6} {peer:<10} fanout {fanout:>3}: wall "
                      f"{sample.wall_s:6.2f} s  CPU {sample.cpu_s:6.2f} s  "
                      f"machine busy {sample.machine_busy_s:6.2f} CPU-s, idle {sample.machine_idle_s:5.2f} s  "
                      + (f"RSS {sample.rss_mb:5.0f} MB  " if sample.rss_mb else "")
                      + f"answered {sample.answered}/{args.nodes}"
                      + (f"  [{sample.note}]" if sample.note and sample.answered < args.nodes else ""),
                      flush=True)
                for line in sample.timeline:
                    print(f"    {line}", flush=True)
                if peer in ("clusterkit", "ck-1proc") and args.timeline_dir:
                    keep = Path(args.timeline_dir)
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(cluster.directory / f"timeline-{fanout}.json",
                                keep / f"timeline-{peer}-{args.nodes}-{scenario}-f{fanout}-r{rep + 1}.json")
    print(f"load average at end: {os.getloadavg()}")
    for scenario in scenarios:
        print(f"\n== {scenario}" + (f" (through {JUMP_NAME}, {2 * args.jump_delay_ms:g} ms round trip)"
                                    if scenario == "jump" else ""))
        summarise([s for s in samples if s.scenario == scenario], fanouts, peers, args.nodes, scenario)
    if len(scenarios) > 1:
        jump_overhead(samples, fanouts, peers)
    if args.json:
        Path(args.json).write_text(json.dumps([s.__dict__ for s in samples], indent=1))
    return 0 if all(s.answered == args.nodes for s in samples) else 1


if __name__ == "__main__":
    sys.exit(main())
