"""The real probe script, run as SSH runs it (`python3 - < probe.py`), on fake nodes.

Each fake node is a tree under tmp_path laid out as the kernel lays out sysfs:
/sys/class/infiniband/<hca> and /sys/class/net/<if> are relative symlinks into
/sys/devices/..., HCA ports carry gids/N and gid_attrs/{types,ndevs}/N, and a
stand-in nvidia-smi on PATH answers the probe's exact query with real CSV text.
The probe reads the tree through $CLUSTERKIT_PROBE_ROOT.

The facts each scenario produces are committed under tests/data/facts/ (the
check tests read them); `CLUSTERKIT_REGEN_FACTS=1 pytest tests/unit/test_probe.py`
rewrites them after a deliberate change of the probe.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.checks.system import check_memlock
from cluster_kit.node import probe

REPO = Path(__file__).resolve().parents[3]
PROBE = REPO / "cluster_kit" / "node" / "probe.py"
FACTS_DIR = REPO / "tests" / "data" / "facts"
REGEN = os.environ.get("CLUSTERKIT_REGEN_FACTS") == "1"

SMI_DRIVER_ERROR = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                    "Make sure that the latest NVIDIA driver is installed and running.")
SMI_BANNER = """Tue Mar 12 10:14:03 2024
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
| N/A   31C    P0             71W /  700W |       1MiB /  81559MiB |      0%      Default |
+-----------------------------------------+------------------------+----------------------+"""
H100_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
IB_NDR = "400 Gb/sec (4X NDR)"
# sysfs link attributes of a PCI function (drivers/pci/pci-sysfs.c prints "%s PCIe" for speeds).
PCIE_GEN5_X16 = {"current_link_speed": "32.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe",
                 "current_link_width": "16", "max_link_width": "16"}


# A healthy GPU's health fields, in the probe's query order, with the values and
# formats a real H200 printed (tests/data/nvidia_smi/query-event.txt).
HEALTHY = {
    "persistence_mode": "Enabled", "ecc.mode.current": "Enabled",
    "ecc.errors.corrected.volatile.total": "0", "ecc.errors.uncorrected.volatile.total": "0",
    "ecc.errors.uncorrected.aggregate.total": "0", "retired_pages.pending": "[N/A]",
    "pcie.link.gen.current": "5", "pcie.link.gen.max": "5", "pcie.link.width.current": "16",
    "pcie.link.width.max": "16", "temperature.gpu": "31", "clocks_event_reasons.active": "0x0000000000000001",
    "remapped_rows.correctable": "0", "remapped_rows.uncorrectable": "0", "remapped_rows.pending": "No",
    "remapped_rows.failure": "No",
    # GPU_MORE_FIELDS: a DGX H100's VBIOS and default application clocks; no recovery pending.
    "vbios_version": "96.00.89.00.01", "clocks.applications.graphics": "1980 MHz",
    "clocks.applications.memory": "2619 MHz", "gpu_recovery_action": "None",
}
# The start of a real ring buffer (tests/data/nvidia_smi/kernel.txt): no Xid.
DMESG_OK = """[    0.449435] nvidia: loading out-of-tree module taints kernel.
[    0.545009] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)
[    3.737519] NVRM: Persistence mode is deprecated and will be removed in a future release."""
DMESG_DENIED = "dmesg: read kernel buffer failed: Operation not permitted"
UPTIME = "28627.27 113000.10"
XID_79 = "NVRM: Xid (PCI:0000:2a:00): 79, pid=48213, name=python, GPU has fallen off the bus."
XID_13 = ("NVRM: Xid (PCI:0000:3a:00): 13, pid=48213, name=python, Graphics Exception: "
          "ESR 0x50df30=0x107000e 0x50df34=0x0 0x50df28=0x0 0x50df2c=0x0")
ZERO_COUNTERS = {name: "0" for name in probe.PORT_ERROR_COUNTERS} | {"port_xmit_data": "918273645"}


def gpu_rows(count: int, driver: str, health: dict[int, dict[str, str]]) -> list[dict[str, str]]:
    """Every field nvidia-smi can answer for `count` H100s, as a real DGX H100 prints them."""
    rows = []
    for i in range(count):
        row = {"index": str(i), "name": "NVIDIA H100 80GB HBM3",
               "uuid": f"GPU-{i:x}3c1d2e0-7b5a-4c1e-9f2d-0a1b2c3d4e{i:02x}", "driver_version": driver,
               "memory.total": "81559 MiB", "pci.bus_id": f"00000000:{H100_BUS_IDS[i]}:00.0"}
        row.update(HEALTHY)
        row.update(health.get(i, {}))
        row["clocks_throttle_reasons.active"] = row["clocks_event_reasons.active"]
        row["gpu_bus_id"], row["gpu_uuid"] = row["pci.bus_id"], row["uuid"]
        rows.append(row)
    return rows


def h100_csv(count: int = 8, driver: str = "550.54.15") -> str:
    """nvidia-smi's CSV (noheader) of the probe's basic fields for `count` H100s."""
    return "".join(", ".join(row[f] for f in probe.GPU_QUERY_FIELDS) + "\n"
                   for row in gpu_rows(count, driver, {}))


@dataclass
class Gid:
    """One populated GID table entry."""

    value: str
    type: str
    ndev: str | None = None


@dataclass
class Port:
    """One HCA port's sysfs attributes; `gids` beyond the populated ones are all-zero."""

    state: str = "4: ACTIVE"
    phys_state: str = "5: LinkUp"
    rate: str | None = IB_NDR  # None: unreadable (EINVAL)
    link_layer: str = "InfiniBand"
    gids: list[Gid] = field(default_factory=list)
    table_size: int = 4
    counters: dict[str, str] | None = field(default_factory=lambda: dict(ZERO_COUNTERS))


@dataclass
class Hca:
    """One RDMA device (a ConnectX function) on its PCI address."""

    name: str
    pci: str
    ports: dict[str, Port]
    netdevs: list[str] = field(default_factory=list)
    fw_ver: str = "28.39.1002"
    board_id: str = "MT_0000000838"
    hca_type: str = "MT4129"
    # The PCI function's link as a ConnectX-7 (PCIe Gen5 x16) shows it in sysfs, its NUMA
    # node, and the bridges above it (root port first).
    link: dict[str, str] = field(default_factory=lambda: dict(PCIE_GEN5_X16))
    numa_node: str = "0"
    upstream: tuple[str, ...] = ("0000:00:01.0",)


@dataclass
class Iface:
    """One /sys/class/net interface."""

    operstate: str = "up"
    mtu: str = "1500"
    address: str = "00:00:00:00:00:00"
    carrier: str | None = "1"
    speed: str | None = "100000"
    type: str = "1"
    pci: str | None = "0000:01:00.0"


# /proc/net/route of a node whose default route leaves through eth0 via 10.0.0.1.
DEFAULT_ROUTE = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    "eth0\t0000000A\t00000000\t0001\t0\t0\t100\t0000FFFF\t0\t0\t0\n"
)


@dataclass
class Node:
    """Everything a fake node shows the probe."""

    hcas: list[Hca] | None
    interfaces: dict[str, Iface]
    smi: str = "ok"                     # ok | fail | missing
    gpus: int = 8
    driver: str = "550.54.15"
    gpu_health: dict[int, dict[str, str]] = field(default_factory=dict)   # GPU index -> field -> value
    smi_knows: str = "event"            # event | norecovery | throttle (before 535) | none: fields it answers
    remapped_rows: bool = True          # whether --query-remapped-rows answers
    dmesg: str | None = DMESG_OK        # None: dmesg is denied (kernel.dmesg_restrict)
    journal: str | None = None          # `journalctl -k -o short-unix` output; None: no journalctl
    sys_modules: tuple[str, ...] = ("nvidia_peermem",)
    proc_modules: tuple[str, ...] = ("nvidia_peermem", "mlx5_ib", "nvidia")
    cmdline: str = "BOOT_IMAGE=/vmlinuz-5.15.0-105-generic root=/dev/nvme0n1p2 ro iommu=pt intel_iommu=on"
    iommu_groups: int = 12
    os_release: str = 'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\n'
    route: str | None = DEFAULT_ROUTE     # /proc/net/route; None: the file is missing
    nvlinks: int = 0                      # NVLinks per GPU (0: PCIe GPUs, nvlink -s lists none)
    nvlink_down: tuple[tuple[int, int], ...] = ()           # (gpu, link) pairs shown <inactive>
    nvlink_errors: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)


# ---------------------------------------------------------------- scenarios

def ib_guid(n: int) -> str:
    """A ConnectX-7 style port GUID, as node_guid shows it."""
    return f"b859:9f03:00d4:{0x8a00 + n:04x}"


def dgx_bridges(switch: int) -> tuple[str, ...]:
    """Root port, switch upstream port, switch downstream port of slot `switch` on a DGX H100-like
    board: PCIe switch k holds GPU k and mlx5_k (downstream ports .0 and .1 of the same bus)."""
    base = 0x04 + 0x10 * switch
    return (f"0000:{base:02x}:01.0", f"0000:{base + 1:02x}:00.0")


def hca_pci(n: int) -> str:
    """PCI address of the n-th ConnectX-7, one per PCIe switch as on a DGX H100."""
    return f"0000:{0x0c + 0x10 * n:02x}:00.0"


def ib_hca(n: int, **port: Any) -> Hca:
    """mlx5_<n>: one InfiniBand port, GID 0 is the port's link-local GID; on GPU n's PCIe switch."""
    gid = Gid(f"fe80:0000:0000:0000:{ib_guid(n)}", "IB/RoCE v1")
    return Hca(f"mlx5_{n}", hca_pci(n), {"1": Port(gids=[gid], **port)}, numa_node=str(n // 4),
               upstream=(*dgx_bridges(n), f"0000:{0x06 + 0x10 * n:02x}:01.0"))


def roce_hca(n: int, ipv4_hex: str, v2_at: tuple[int, int] = (1, 3)) -> Hca:
    """mlx5_<n>: one Ethernet port; link-local then IPv4-mapped GIDs, v1 and v2 each.

    `v2_at` are the indices (link-local, IPv4-mapped) holding the RoCE v2 entries;
    the others hold RoCE v1 (the kernel's "IB/RoCE v1").
    """
    netdev = f"ens{n + 1}np0"
    link_local = f"fe80:0000:0000:0000:0a5c:2eff:fe0{n}:4a10"
    mapped = f"0000:0000:0000:0000:0000:ffff:{ipv4_hex}"
    gids = []
    for index, value in enumerate((link_local, link_local, mapped, mapped)):
        gid_type = "RoCE v2" if index in v2_at else "IB/RoCE v1"
        gids.append(Gid(value, gid_type, netdev))
    port = Port(rate=IB_NDR, link_layer="Ethernet", gids=gids, table_size=8)
    return Hca(f"mlx5_{n}", hca_pci(n), {"1": port}, [netdev])


def mgmt_interfaces() -> dict[str, Iface]:
    """The management NIC, a docker bridge that is down, and lo."""
    return {"eth0": Iface(address="3c:ec:ef:10:20:30", speed="25000"),
            "docker0": Iface(operstate="down", carrier=None, speed=None, pci=None,
                             address="02:42:9c:01:02:03"),
            "lo": Iface(operstate="unknown", mtu="65536", speed=None, type="772", pci=None)}


def ib_ok() -> Node:
    """A healthy DGX H100: 8 GPUs, mlx5_0..mlx5_7 NDR InfiniBand, nvidia_peermem."""
    interfaces = mgmt_interfaces()
    interfaces["ib0"] = Iface(mtu="4092", type="32", speed="400000", pci=hca_pci(0),
                              address="00:00:10:29:fe:80:00:00:00:00:00:00:b8:59:9f:03:00:d4:8a:00")
    return Node(hcas=[ib_hca(n) for n in range(8)], interfaces=interfaces)


def roce_ok() -> Node:
    """A healthy RoCE node: mlx5_0/mlx5_1 on Ethernet, GID 3 = IPv4-mapped RoCE v2."""
    hcas = [roce_hca(0, "0a00:0001"), roce_hca(1, "0a00:0101")]
    interfaces = mgmt_interfaces()
    for hca in hcas:
        interfaces[hca.netdevs[0]] = Iface(mtu="9000", speed="400000", pci=hca.pci,
                                           address=f"0a:5c:2e:0{hca.name[-1]}:4a:10")
    return Node(hcas=hcas, interfaces=interfaces, sys_modules=("nv_peer_mem",),
                proc_modules=("nv_peer_mem", "mlx5_ib", "nvidia"))


def roce_v1() -> Node:
    """As roce_ok, but index 3 is RoCE v1 and the IPv4-mapped RoCE v2 GID sits at 2."""
    node = roce_ok()
    node.hcas = [roce_hca(0, "0a00:0001", v2_at=(1, 2)), roce_hca(1, "0a00:0101", v2_at=(1, 2))]
    return node


def ib_with(n: int, **port: Any) -> Node:
    """ib_ok with mlx5_<n> port 1 changed."""
    node = ib_ok()
    assert node.hcas is not None
    node.hcas[n] = ib_hca(n, **port)
    return node


def ib_link(n: int, **link: str) -> Node:
    """ib_ok with the PCIe link of mlx5_<n>'s function changed (sysfs attributes)."""
    node = ib_ok()
    assert node.hcas is not None
    node.hcas[n].link.update(link)
    return node


def ib_nohca() -> Node:
    """As ib_ok, but mlx5_3 is gone (dead card or driver did not bind)."""
    node = ib_ok()
    assert node.hcas is not None
    node.hcas = [hca for hca in node.hcas if hca.name != "mlx5_3"]
    return node


def ib_storage() -> Node:
    """ib_ok plus mlx5_8: a 200 Gb/s Ethernet (RoCE) port of the storage network."""
    node = ib_ok()
    assert node.hcas is not None
    storage = roce_hca(8, "0a08:0001")
    storage.ports["1"].rate = "200 Gb/sec (4X HDR)"
    node.hcas.append(storage)
    node.interfaces[storage.netdevs[0]] = Iface(mtu="9000", speed="200000", pci=storage.pci,
                                                address="0a:5c:2e:08:4a:10")
    return node


SCENARIOS = {
    "ib-ok": ib_ok,
    "ib-storage": ib_storage,
    "ib-portdown": lambda: ib_with(3, state="1: DOWN", phys_state="2: Polling", rate="10 Gb/sec (4X SDR)"),
    "ib-disabled": lambda: ib_with(3, state="1: DOWN", phys_state="3: Disabled", rate="10 Gb/sec (4X SDR)"),
    "ib-init": lambda: ib_with(2, state="2: INIT", phys_state="5: LinkUp"),
    "ib-slow": lambda: ib_with(5, rate="200 Gb/sec (4X HDR)"),
    "ib-nohca": ib_nohca,
    "ib-nopeermem": lambda: replace(ib_ok(), sys_modules=(), proc_modules=("mlx5_ib", "nvidia")),
    "roce-ok": roce_ok,
    "roce-v1": roce_v1,
    "no-rdma": lambda: Node(hcas=None, interfaces=mgmt_interfaces(), sys_modules=(),
                            proc_modules=("nvidia",), gpus=7, driver="535.104.05"),
    "smi-fail": lambda: replace(ib_ok(), smi="fail"),
    "smi-missing": lambda: replace(ib_ok(), smi="missing"),
    # Degraded but up: one planted fault each (the dev cluster's nodes of the same names).
    "gpu-ecc": lambda: replace(ib_ok(), gpu_health={2: {
        "ecc.errors.uncorrected.volatile.total": "2", "ecc.errors.uncorrected.aggregate.total": "2",
        "remapped_rows.uncorrectable": "1", "remapped_rows.pending": "Yes"}}),
    "gpu-x8": lambda: replace(ib_ok(), gpu_health={5: {"pcie.link.width.current": "8"}}),
    "gpu-throttle": lambda: replace(ib_ok(), gpu_health={3: {
        "clocks_event_reasons.active": "0x0000000000000048", "temperature.gpu": "91"}}),
    "gpu-xid": lambda: replace(ib_ok(), dmesg=DMESG_OK + f"\n[28027.270000] {XID_79}\n[28327.270000] {XID_13}"),
    "ib-flap": lambda: ib_with(1, counters=dict(ZERO_COUNTERS, link_downed="37", link_error_recovery="112",
                                                 symbol_error="4021")),
    "ib-x8": lambda: ib_link(2, current_link_width="8"),
    "ib-gen4": lambda: ib_link(6, current_link_speed="16.0 GT/s PCIe"),
    "nvlink-down": lambda: replace(ib_ok(), nvlinks=18, nvlink_down=((4, 7),),
                                   nvlink_errors={(2, 11): {"Replay": 3, "CRC": 12}}),
    "gpu-reboot": lambda: replace(ib_ok(), gpu_health={6: {"gpu_recovery_action": "Node Reboot"}}),
    "gpu-powercap": lambda: replace(ib_ok(), smi_knows="throttle", gpu_health={
        i: {"clocks_event_reasons.active": "0x0000000000000004"} for i in range(8)}),
}


# ---------------------------------------------------------------- tree builder

def write(path: Path, text: str) -> None:
    """A sysfs-like attribute file (the kernel ends values with a newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def link(path: Path, target: Path) -> None:
    """A relative symlink, as /sys/class entries point into /sys/devices."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath(target, path.parent))


def device_dir(root: Path, pci: str | None, upstream: tuple[str, ...] = ("0000:00:01.0",)) -> Path:
    """/sys/devices/... of a PCI function below its bridges, or the virtual device tree."""
    if pci is None:
        return root / "sys/devices/virtual"
    return root.joinpath("sys/devices", f"pci{upstream[0][:7]}", *upstream, pci)


def build_port(port_dir: Path, port: Port) -> None:
    """Port attributes and the GID table; unpopulated types/ndevs (and None attributes) are unreadable.

    The kernel answers EINVAL when reading the type or netdev of an empty GID
    entry; a directory in its place makes the read fail the same way (OSError).
    """
    for name in ("state", "phys_state", "rate", "link_layer"):
        if getattr(port, name) is None:
            (port_dir / name).mkdir(parents=True)
        else:
            write(port_dir / name, getattr(port, name))
    write(port_dir / "lid", "0x1a" if port.link_layer == "InfiniBand" else "0x0")
    for name, count in (port.counters or {}).items():
        write(port_dir / "counters" / name, count)
    for index in range(port.table_size):
        gid = port.gids[index] if index < len(port.gids) else None
        write(port_dir / "gids" / str(index), gid.value if gid else ZERO_GID)
        for sub, value in (("types", gid and gid.type), ("ndevs", gid and gid.ndev)):
            target = port_dir / "gid_attrs" / sub / str(index)
            if value:
                write(target, value)
            else:
                target.mkdir(parents=True)


def build_hca(root: Path, hca: Hca) -> None:
    """/sys/devices/.../infiniband/<hca> and its /sys/class/infiniband link."""
    pci_dir = device_dir(root, hca.pci, hca.upstream)
    for name, value in dict(hca.link, numa_node=hca.numa_node).items():
        write(pci_dir / name, value)
    hca_dir = pci_dir / "infiniband" / hca.name
    for name in ("fw_ver", "board_id", "hca_type"):
        write(hca_dir / name, getattr(hca, name))
    write(hca_dir / "node_guid", ib_guid(int(hca.name.split("_")[1])))
    write(hca_dir / "node_type", "1: CA")
    link(hca_dir / "device", pci_dir)
    for number, port in hca.ports.items():
        build_port(hca_dir / "ports" / number, port)
    link(root / "sys/class/infiniband" / hca.name, hca_dir)


def build_gpu_functions(root: Path, node: Node) -> None:
    """/sys/devices/... of each GPU's PCI function (GPU i on switch i, NUMA node i // 4) and
    its /sys/bus/pci/devices link, as nvidia-smi's pci.bus_id names it."""
    if node.smi != "ok":
        return
    for i in range(node.gpus):
        address = f"0000:{H100_BUS_IDS[i].lower()}:00.0"
        pci_dir = device_dir(root, address, (*dgx_bridges(i), f"0000:{0x06 + 0x10 * i:02x}:00.0"))
        for name, value in dict(PCIE_GEN5_X16, numa_node=str(i // 4)).items():
            write(pci_dir / name, value)
        link(root / "sys/bus/pci/devices" / address, pci_dir)


def build_iface(root: Path, name: str, iface: Iface) -> None:
    """/sys/devices/.../net/<if> and its /sys/class/net link; EINVAL attrs unreadable."""
    if_dir = device_dir(root, iface.pci) / "net" / name
    for attr in ("operstate", "mtu", "address", "carrier", "speed", "type"):
        value = getattr(iface, attr)
        if value is None:
            (if_dir / attr).mkdir(parents=True)
        else:
            write(if_dir / attr, value)
    link(root / "sys/class/net" / name, if_dir)


def printf_lines(text: str) -> str:
    """A shell builtin command printing `text` line by line (PATH has no cat here)."""
    return "printf '%s\\n' " + " ".join(shlex.quote(line) for line in text.splitlines()) if text else ":"


def answer(option: str, fields: tuple[str, ...], rows: list[dict[str, str]], refused: str | None) -> str:
    """One `case` arm of the stand-in: the CSV nvidia-smi prints, or its invalid-field error."""
    if refused:
        message = shlex.quote(f'Field "{refused}" is not a valid field to query.')
        reply = f"printf '%s\\n\\n' {message}; exit 2"
    else:
        reply = printf_lines("\n".join(", ".join(row[f] for f in fields) for row in rows))
    pattern = shlex.quote(f"{option}={','.join(fields)} --format=csv,noheader")
    return f"  {pattern}) {reply} ;;\n"


def refused_field(fields: tuple[str, ...], knows: str) -> str | None:
    """The first health field a driver that knows `knows` rejects, in the query's order."""
    extra = [f for f in fields if f not in probe.GPU_QUERY_FIELDS]
    if knows == "none":
        return extra[0] if extra else None
    unknown = {"event": (), "norecovery": ("gpu_recovery_action",),
               "throttle": ("gpu_recovery_action", probe.EVENT_PREFIX)}[knows]
    return next((f for f in extra if f.startswith(unknown)), None) if unknown else None


def build_smi(bindir: Path, node: Node) -> None:
    """A stand-in nvidia-smi answering the probe's exact queries with real CSV (shell builtins only)."""
    bindir.mkdir(parents=True, exist_ok=True)
    if node.smi == "missing":
        return
    if node.smi == "fail":
        body = f"printf '%s\\n' {shlex.quote(SMI_DRIVER_ERROR)}\nexit 9\n"
    else:
        rows = gpu_rows(node.gpus, node.driver, node.gpu_health)
        arms = "".join(answer("--query-gpu", fields, rows, refused_field(fields, node.smi_knows))
                       for fields in probe.health_queries())
        if node.remapped_rows:
            arms += answer("--query-remapped-rows", probe.REMAPPED_ROWS_FIELDS, rows, None)
        arms += f"  'nvlink -s') {printf_lines(nvlink_text(node, False))} ;;\n"
        arms += f"  'nvlink -e') {printf_lines(nvlink_text(node, True))} ;;\n"
        body = (f'[ $# -eq 0 ] && {{ {printf_lines(SMI_BANNER)}; exit 0; }}\n'
                f'case "$1 $2" in\n{arms}'
                "  *) printf '%s\\n' \"Invalid combination of input arguments.\"; exit 2 ;;\nesac\n")
    executable(bindir / "nvidia-smi", body)


def nvlink_text(node: Node, errors: bool) -> str:
    """`nvidia-smi nvlink -s` (or `-e`) as a driver prints it (tests/data/nvlink has real ones)."""
    lines = []
    for i, row in enumerate(gpu_rows(node.gpus, node.driver, {})):
        lines.append(f"GPU {i}: {row['name']} (UUID: {row['uuid']})")
        for link in range(node.nvlinks):
            if errors:
                counts = node.nvlink_errors.get((i, link), {})
                lines += [f"\t Link {link}: {kind} Errors: {counts.get(kind, 0)}" for kind in ("Replay", "Recovery", "CRC")]
            else:
                lines.append(f"\t Link {link}: {'<inactive>' if (i, link) in node.nvlink_down else '26.562 GB/s'}")
    return "\n".join(lines)


def executable(path: Path, body: str) -> None:
    """A /bin/sh script."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def build_kernel_log(root: Path, node: Node) -> None:
    """Stand-in dmesg (or its permission error), journalctl if the node has one, /proc/uptime."""
    write(root / "proc/uptime", UPTIME)
    if node.dmesg is None:
        executable(root / "bin/dmesg", f"printf '%s\\n' {shlex.quote(DMESG_DENIED)} >&2; exit 1\n")
    else:
        executable(root / "bin/dmesg", printf_lines(node.dmesg) + "\n")
    if node.journal is not None:
        executable(root / "bin/journalctl", printf_lines(node.journal) + "\n")


def build_node(root: Path, node: Node) -> None:
    """The whole fake node under `root`."""
    write(root / "etc/os-release", node.os_release.rstrip("\n"))
    write(root / "proc/cmdline", node.cmdline)
    if node.route is not None:
        write(root / "proc/net/route", node.route)
    write(root / "proc/modules", "\n".join(f"{m} 16384 0 - Live 0x0000000000000000" for m in node.proc_modules))
    for module in node.sys_modules:
        write(root / "sys/module" / module / "initstate", "live")
        write(root / "sys/module" / module / "refcnt", "0")
    for group in range(node.iommu_groups):
        (root / "sys/kernel/iommu_groups" / str(group) / "devices").mkdir(parents=True)
    if node.hcas is not None:
        (root / "sys/class/infiniband").mkdir(parents=True)
        for hca in node.hcas:
            build_hca(root, hca)
    for name, iface in node.interfaces.items():
        build_iface(root, name, iface)
    build_gpu_functions(root, node)
    build_smi(root / "bin", node)
    build_kernel_log(root, node)


# ---------------------------------------------------------------- running the probe

def set_memlock(kib: int | None) -> None:
    """preexec: lower RLIMIT_MEMLOCK to `kib` (None: keep this process's limit).

    Raising it needs CAP_SYS_RESOURCE, which test machines often lack, so
    tests only ever lower it.
    """
    if kib is not None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (kib * 1024, kib * 1024))


def run_probe(root: Path, args: tuple[str, ...] = (), python: str = sys.executable,
              memlock_kib: int | None = None) -> dict[str, Any]:
    """Feed probe.py to `python -` on stdin, as SSH does; return the parsed facts."""
    env = {"PATH": str(root / "bin"), probe.ROOT_ENV: str(root), "LANG": "C"}
    result = subprocess.run([python, "-", *args], input=PROBE.read_bytes(), capture_output=True,
                            env=env, timeout=120, check=True,
                            preexec_fn=lambda: set_memlock(memlock_kib))
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1, result.stdout
    return dict(json.loads(lines[0]))


def probe_scenario(tmp_path: Path, name: str, **kwargs: Any) -> dict[str, Any]:
    """Build scenario `name` under tmp_path and probe it."""
    root = tmp_path / name
    build_node(root, SCENARIOS[name]())
    return run_probe(root, **kwargs)


# ---------------------------------------------------------------- committed fixtures

VOLATILE_OS_KEYS = ("kernel", "arch", "python", "python_executable")


def stable_part(facts: dict[str, Any]) -> dict[str, Any]:
    """The facts without what depends on the machine running the tests."""
    facts = json.loads(json.dumps(facts))
    for key in ("hostname", "nccl", "slurm_node", "memlock"):
        facts.pop(key, None)
    for key in VOLATILE_OS_KEYS:
        facts["os"].pop(key, None)
    return facts


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_committed_facts_match_the_probe(tmp_path: Path, name: str) -> None:
    """tests/data/facts/<scenario>.json is what the probe says about that tree.

    The hostname is the scenario's name and RLIMIT_MEMLOCK that of a healthy
    node (unlimited): both come from the process running the tests, not the tree.
    """
    facts = probe_scenario(tmp_path, name)
    facts["hostname"] = name
    facts["memlock"] = {"status": "ok", "soft_kib": "unlimited", "hard_kib": "unlimited"}
    fixture = FACTS_DIR / f"{name}.json"
    if REGEN:
        FACTS_DIR.mkdir(parents=True, exist_ok=True)
        fixture.write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    assert stable_part(json.loads(fixture.read_text())) == stable_part(facts)


# ---------------------------------------------------------------- rdma

def test_healthy_infiniband_node_reports_every_hca_and_port(tmp_path: Path) -> None:
    facts = probe_scenario(tmp_path, "ib-ok")
    hcas = facts["rdma"]["hcas"]
    assert facts["rdma"]["status"] == "ok"
    assert list(hcas) == [f"mlx5_{n}" for n in range(8)]
    mlx5_0 = hcas["mlx5_0"]
    assert (mlx5_0["fw_ver"], mlx5_0["board_id"], mlx5_0["hca_type"]) == ("28.39.1002", "MT_0000000838", "MT4129")
    assert mlx5_0["node_guid"] == "b859:9f03:00d4:8a00"
    port = mlx5_0["ports"]["1"]
    assert (port["state"], port["phys_state"], port["rate"], port["link_layer"]) == (
        "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")


def test_all_zero_gids_are_reported_but_unreadable_types_are_not(tmp_path: Path) -> None:
    port = probe_scenario(tmp_path, "ib-ok")["rdma"]["hcas"]["mlx5_7"]["ports"]["1"]
    assert port["gids"] == {"0": "fe80:0000:0000:0000:b859:9f03:00d4:8a07",
                            "1": ZERO_GID, "2": ZERO_GID, "3": ZERO_GID}
    assert port["gid_types"] == {"0": "IB/RoCE v1"}
    assert port["gid_ndevs"] == {}


def test_roce_gid_table_has_v1_and_v2_with_their_netdev(tmp_path: Path) -> None:
    facts = probe_scenario(tmp_path, "roce-ok")
    hca = facts["rdma"]["hcas"]["mlx5_0"]
    port = hca["ports"]["1"]
    assert port["link_layer"] == "Ethernet"
    assert port["gid_types"] == {"0": "IB/RoCE v1", "1": "RoCE v2", "2": "IB/RoCE v1", "3": "RoCE v2"}
    assert port["gids"]["3"] == "0000:0000:0000:0000:0000:ffff:0a00:0001"
    assert port["gid_ndevs"] == {str(i): "ens1np0" for i in range(4)}
    assert len(port["gids"]) == 8
    assert hca["netdevs"] == ["ens1np0"]


def test_port_down_polling_is_reported_as_the_kernel_shows_it(tmp_path: Path) -> None:
    port = probe_scenario(tmp_path, "ib-portdown")["rdma"]["hcas"]["mlx5_3"]["ports"]["1"]
    assert (port["state"], port["phys_state"]) == ("1: DOWN", "2: Polling")


def test_an_hcas_pci_function_link_numa_node_and_bridges_are_reported(tmp_path: Path) -> None:
    hca = probe_scenario(tmp_path, "ib-x8")["rdma"]["hcas"]["mlx5_2"]
    assert hca["pci"] == {"current_link_speed": "32.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe",
                          "current_link_width": "8", "max_link_width": "16", "numa_node": "0",
                          "path": ["0000:24:01.0", "0000:25:00.0", "0000:26:01.0", "0000:2c:00.0"]}


def test_pci_path_is_empty_when_the_device_link_resolves_nowhere(tmp_path: Path) -> None:
    (tmp_path / "device").symlink_to("../../devices/pci0000:00/0000:00:01.0/0000:17:00.0")
    assert probe.pci_path(str(tmp_path / "device")) == []
    assert probe.read_pci_device(str(tmp_path / "device"))["current_link_width"] is None


def test_a_rate_the_kernel_cannot_name_is_unreadable_not_zero(tmp_path: Path) -> None:
    """The kernel's rate_show answers EINVAL when it cannot name the port's width
    (a link still training): the fact is None, which rdma.link_rate must not pass."""
    build_node(tmp_path, ib_with(4, rate=None))
    facts = run_probe(tmp_path, memlock_kib=64)
    port = facts["rdma"]["hcas"]["mlx5_4"]["ports"]["1"]
    assert (port["state"], port["rate"]) == ("4: ACTIVE", None)
    assert facts["rdma"]["hcas"]["mlx5_5"]["ports"]["1"]["rate"] == IB_NDR


def test_missing_hca_is_simply_absent_from_the_list(tmp_path: Path) -> None:
    hcas = probe_scenario(tmp_path, "ib-nohca")["rdma"]["hcas"]
    assert "mlx5_3" not in hcas and len(hcas) == 7


def test_no_infiniband_class_at_all_is_an_absent_fact(tmp_path: Path) -> None:
    facts = probe_scenario(tmp_path, "no-rdma")
    assert facts["rdma"]["status"] == "absent"
    assert "/sys/class/infiniband does not exist" in facts["rdma"]["error"]
    assert facts["peermem"] == {"status": "ok", "nvidia_peermem": False, "nv_peer_mem": False}


def test_peermem_is_seen_in_sys_module(tmp_path: Path) -> None:
    assert probe_scenario(tmp_path, "ib-ok")["peermem"]["nvidia_peermem"] is True
    assert probe_scenario(tmp_path, "roce-ok")["peermem"]["nv_peer_mem"] is True


def test_peermem_is_also_seen_in_proc_modules(tmp_path: Path) -> None:
    node = replace(ib_ok(), sys_modules=())
    build_node(tmp_path, node)
    assert run_probe(tmp_path, memlock_kib=64)["peermem"]["nvidia_peermem"] is True


# ---------------------------------------------------------------- gpu

def test_gpus_are_parsed_from_real_nvidia_smi_csv(tmp_path: Path) -> None:
    gpu = probe_scenario(tmp_path, "ib-ok")["gpu"]
    assert (gpu["status"], gpu["driver"], gpu["cuda"]) == ("ok", "550.54.15", "12.4")
    assert len(gpu["gpus"]) == 8
    assert gpu["gpus"][7] == {"index": "7", "name": "NVIDIA H100 80GB HBM3",
                              "uuid": "GPU-73c1d2e0-7b5a-4c1e-9f2d-0a1b2c3d4e07", "driver_version": "550.54.15",
                              "memory_total": "81559 MiB", "pci_bus_id": "00000000:DB:00.0",
                              "persistence_mode": "Enabled", "ecc_mode_current": "Enabled",
                              "ecc_errors_corrected_volatile_total": "0", "ecc_errors_uncorrected_volatile_total": "0",
                              "ecc_errors_uncorrected_aggregate_total": "0", "retired_pages_pending": "[N/A]",
                              "pcie_link_gen_current": "5", "pcie_link_gen_max": "5", "pcie_link_width_current": "16",
                              "pcie_link_width_max": "16", "temperature_gpu": "31",
                              "clocks_event_reasons_active": "0x0000000000000001",
                              "remapped_rows_correctable": "0", "remapped_rows_uncorrectable": "0",
                              "remapped_rows_pending": "No", "remapped_rows_failure": "No",
                              "vbios_version": "96.00.89.00.01", "clocks_applications_graphics": "1980 MHz",
                              "clocks_applications_memory": "2619 MHz", "gpu_recovery_action": "None"}
    assert gpu["clock_reasons_field"] == "clocks_event_reasons.active" and "health_error" not in gpu


def test_nvidia_smi_driver_failure_is_an_error_fact_with_its_text(tmp_path: Path) -> None:
    gpu = probe_scenario(tmp_path, "smi-fail")["gpu"]
    assert gpu == {"status": "error", "error": SMI_DRIVER_ERROR, "exit_code": 9}


def test_missing_nvidia_smi_is_an_absent_fact(tmp_path: Path) -> None:
    gpu = probe_scenario(tmp_path, "smi-missing")["gpu"]
    assert gpu == {"status": "absent", "error": "nvidia-smi not found on PATH"}


def test_gpu_csv_parser_keeps_commas_inside_quoted_names() -> None:
    text = '0, "NVIDIA A100-SXM4-80GB, custom", GPU-1, 535.104.05, 81920 MiB, 00000000:07:00.0\n\n'
    assert probe.parse_gpu_csv(text)[0]["name"] == "NVIDIA A100-SXM4-80GB, custom"


def test_cuda_version_from_banner() -> None:
    assert probe.parse_cuda_version(SMI_BANNER) == "12.4"
    assert probe.parse_cuda_version("garbage") is None


# ---------------------------------------------------------------- nccl

def test_real_pip_libnccl_is_found_and_its_version_read(tmp_path: Path) -> None:
    build_node(tmp_path, ib_ok())
    nccl = run_probe(tmp_path, memlock_kib=64)["nccl"]
    assert nccl["status"] == "ok"
    assert nccl["version"] == importlib.metadata.version("nvidia-nccl-cu12")
    assert nccl["source"] == "pip"
    assert nccl["path"].endswith("nvidia/nccl/lib/libnccl.so.2")
    assert nccl["path"] in nccl["candidates"]


def python36() -> str | None:
    """A real Python 3.6 interpreter (not a pyenv shim, which needs PATH), if there is one."""
    pyenv = sorted(Path("~/.pyenv/versions").expanduser().glob("3.6.*/bin/python3.6"))
    for candidate in [str(p) for p in pyenv] + [shutil.which("python3.6") or ""]:
        if candidate and "/shims/" not in candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.mark.skipif(python36() is None, reason="no Python 3.6 interpreter here")
def test_probe_runs_on_python36_and_finds_nccl_through_environment_python(tmp_path: Path) -> None:
    build_node(tmp_path, ib_ok())
    py36 = python36()
    assert py36 is not None
    facts = run_probe(tmp_path, ("--python", sys.executable), python=py36, memlock_kib=64)
    assert facts["os"]["python"].startswith("3.6.")
    assert facts["rdma"]["hcas"]["mlx5_0"]["ports"]["1"]["state"] == "4: ACTIVE"
    assert facts["nccl"]["version"] == importlib.metadata.version("nvidia-nccl-cu12")


def test_nccl_version_codes_old_and_new_encoding() -> None:
    assert probe.decode_nccl_version(22105) == "2.21.5"
    assert probe.decode_nccl_version(23203) == "2.32.3"
    assert probe.decode_nccl_version(2708) == "2.7.8"
    assert probe.decode_nccl_version(2804) == "2.8.4"


# ---------------------------------------------------------------- limits, iommu, os, deep

def test_memlock_is_reported_in_kib_as_ulimit_shows_it(tmp_path: Path) -> None:
    build_node(tmp_path, ib_ok())
    facts = run_probe(tmp_path, memlock_kib=64)
    assert facts["memlock"] == {"status": "ok", "soft_kib": "64", "hard_kib": "64"}


def test_memlock_is_this_machines_own_limit_as_ulimit_shows_it(tmp_path: Path) -> None:
    """Whatever the limit here is (unlimited on an RDMA node, often 8 MiB elsewhere):
    the probe reports what the shell's `ulimit -l` says, and sys.memlock judges it."""
    shell = subprocess.run(["sh", "-c", "ulimit -S -l; ulimit -H -l"], capture_output=True, text=True,
                           check=True).stdout.split()
    facts = probe_scenario(tmp_path, "ib-ok")
    assert facts["memlock"] == {"status": "ok", "soft_kib": shell[0], "hard_kib": shell[1]}
    unlimited = check_memlock(facts, "unlimited")
    assert unlimited.status == ("pass" if shell[0] == "unlimited" else "fail"), unlimited
    assert check_memlock(facts, shell[0]).status == "pass"
    if shell[0] != "unlimited":
        assert check_memlock(facts, str(int(shell[0]) + 1)).status == "fail"
        assert unlimited.message.startswith(f"RLIMIT_MEMLOCK is {shell[0]} KiB")


def test_iommu_os_and_net_facts(tmp_path: Path) -> None:
    build_node(tmp_path, ib_ok())
    facts = run_probe(tmp_path, memlock_kib=64)
    assert facts["iommu"] == {"status": "ok", "groups": "12", "cmdline": "iommu=pt intel_iommu=on"}
    assert facts["os"]["os_release"] == "Ubuntu 22.04.4 LTS"
    assert facts["net"]["interfaces"]["docker0"] == {
        "operstate": "down", "carrier": None, "mtu": "1500", "address": "02:42:9c:01:02:03",
        "speed": None, "type": "1"}
    assert facts["torch"] == {"status": "skipped"}
    assert facts["probe_version"] == probe.PROBE_VERSION


@pytest.mark.slow
def test_deep_reports_torch_as_environment_python_sees_it(tmp_path: Path) -> None:
    import torch

    build_node(tmp_path, ib_ok())
    facts = run_probe(tmp_path, ("--deep", sys.executable), memlock_kib=64)
    assert facts["torch"]["status"] == "ok"
    assert facts["torch"]["version"] == torch.__version__
    assert facts["torch"]["cuda"] == torch.version.cuda
    assert facts["torch"]["cuda_available"] == torch.cuda.is_available()


def test_deep_with_a_missing_interpreter_is_an_error_fact(tmp_path: Path) -> None:
    build_node(tmp_path, ib_ok())
    torch_facts = run_probe(tmp_path, ("--deep", "/nonexistent/python"), memlock_kib=64)["torch"]
    assert torch_facts["status"] == "error"
    assert "cannot run /nonexistent/python" in torch_facts["error"]


def test_a_broken_section_becomes_an_error_not_a_crash() -> None:
    def boom() -> dict[str, Any]:
        raise ValueError("bad sysfs")

    assert probe.guarded(boom) == {"status": "error", "error": "ValueError: bad sysfs"}


def test_collect_in_process_has_every_section() -> None:
    facts = probe.collect()
    for key in ("os", "gpu", "nccl", "rdma", "net", "peermem", "memlock", "iommu", "torch"):
        assert facts[key]["status"] in ("ok", "absent", "error", "skipped")


def test_hung_command_is_killed_after_its_timeout() -> None:
    with pytest.raises(probe.CommandTimeout):
        probe.run_command(["sleep", "30"], timeout=0.2)


# ---------------------------------------------------------------- python 3.6 syntax

def test_probe_is_python36_compatible_per_vermin() -> None:
    vermin = Path(sys.executable).parent / "vermin"
    result = subprocess.run([str(vermin), "-q", "-t=3.6-", "--no-tips", "--violations", str(PROBE)],
                            check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_default_route_comes_from_proc_net_route(tmp_path: Path) -> None:
    assert probe_scenario(tmp_path, "ib-ok")["route"] == {
        "status": "ok", "default_interface": "eth0", "default_gateway": "10.0.0.1"}


def test_no_proc_net_route_is_absent(tmp_path: Path) -> None:
    node = SCENARIOS["ib-ok"]()
    node.route = None
    build_node(tmp_path / "node", node)
    assert run_probe(tmp_path / "node")["route"] == {"status": "absent", "error": "/proc/net/route is not readable"}


# ---------------------------------------------------------------- gpu health, xid, port counters

def test_health_fields_come_from_the_one_widened_query(tmp_path: Path) -> None:
    gpu = probe_scenario(tmp_path, "gpu-x8")["gpu"]
    assert (gpu["gpus"][5]["pcie_link_width_current"], gpu["gpus"][5]["pcie_link_width_max"]) == ("8", "16")
    assert gpu["gpus"][4]["pcie_link_width_current"] == "16"
    assert "refused_fields" not in gpu


def test_a_driver_before_535_is_asked_again_with_the_throttle_names(tmp_path: Path) -> None:
    gpu = probe_scenario(tmp_path, "gpu-powercap")["gpu"]
    assert gpu["refused_fields"] == ["gpu_recovery_action", "clocks_event_reasons.active"]
    assert gpu["clock_reasons_field"] == "clocks_throttle_reasons.active"
    assert "gpu_recovery_action" not in gpu["gpus"][0]
    assert {g["clocks_event_reasons_active"] for g in gpu["gpus"]} == {"0x0000000000000004"}


def test_a_driver_without_recovery_actions_keeps_every_other_health_field(tmp_path: Path) -> None:
    build_node(tmp_path, replace(ib_ok(), smi_knows="norecovery"))
    gpu = run_probe(tmp_path, memlock_kib=64)["gpu"]
    assert gpu["refused_fields"] == ["gpu_recovery_action"]
    assert gpu["clock_reasons_field"] == "clocks_event_reasons.active" and "health_error" not in gpu
    assert gpu["gpus"][0]["pcie_link_width_max"] == "16" and "gpu_recovery_action" not in gpu["gpus"][0]


def test_a_driver_refusing_every_health_field_still_lists_its_gpus(tmp_path: Path) -> None:
    build_node(tmp_path, replace(ib_ok(), smi_knows="none"))
    gpu = run_probe(tmp_path, memlock_kib=64)["gpu"]
    assert gpu["status"] == "ok" and len(gpu["gpus"]) == 8
    assert set(gpu["gpus"][0]) == {"index", "name", "uuid", "driver_version", "memory_total", "pci_bus_id"}
    assert gpu["health_error"] == "nvidia-smi refused the health fields: persistence_mode"
    assert gpu["clock_reasons_field"] is None


def test_remapped_rows_are_merged_by_bus_id_and_a_refusal_is_a_fact(tmp_path: Path) -> None:
    gpu = probe_scenario(tmp_path, "gpu-ecc")["gpu"]
    assert (gpu["gpus"][2]["remapped_rows_pending"], gpu["gpus"][2]["remapped_rows_uncorrectable"]) == ("Yes", "1")
    assert gpu["gpus"][1]["remapped_rows_pending"] == "No"
    build_node(tmp_path / "old", replace(ib_ok(), remapped_rows=False))
    old = run_probe(tmp_path / "old", memlock_kib=64)["gpu"]
    assert old["status"] == "ok"
    assert old["remapped_rows_error"] == "Invalid combination of input arguments."
    assert "remapped_rows_pending" not in old["gpus"][0]


def test_xid_events_from_dmesg_carry_their_age_and_bus(tmp_path: Path) -> None:
    xid = probe_scenario(tmp_path, "gpu-xid")["xid"]
    assert (xid["status"], xid["source"], xid["total"]) == ("ok", "dmesg", 2)
    assert xid["events"] == [
        {"xid": 13, "pci": "0000:3a:00", "age_s": 300.0, "text": XID_13.split("13, ", 1)[1]},
        {"xid": 79, "pci": "0000:2a:00", "age_s": 600.0,
         "text": "pid=48213, name=python, GPU has fallen off the bus."}]


def test_denied_dmesg_falls_back_to_the_journal(tmp_path: Path) -> None:
    now = int(time.time())
    journal = f"{now - 120}.000000 gpu001 kernel: {XID_79}\n{now - 60}.500000 gpu001 kernel: eth0: link up"
    build_node(tmp_path, replace(ib_ok(), dmesg=None, journal=journal))
    xid = run_probe(tmp_path, memlock_kib=64)["xid"]
    assert (xid["status"], xid["source"], xid["lookback_s"]) == ("ok", "journal", 7 * 86400)
    assert [(e["xid"], e["pci"]) for e in xid["events"]] == [(79, "0000:2a:00")]
    assert 110 <= xid["events"][0]["age_s"] <= 180


def test_an_unreadable_kernel_log_is_an_error_fact_naming_both_sources(tmp_path: Path) -> None:
    build_node(tmp_path, replace(ib_ok(), dmesg=None))
    xid = run_probe(tmp_path, memlock_kib=64)["xid"]
    assert xid == {"status": "error", "error": f"kernel log unreadable: {DMESG_DENIED}; "
                   "journalctl not found on PATH"}


def test_journal_without_permission_counts_as_unreadable(tmp_path: Path) -> None:
    build_node(tmp_path, replace(ib_ok(), dmesg=None, journal=""))
    hint = ("Hint: You are currently not seeing messages from other users and the system.\n"
            "      Users in groups 'adm', 'systemd-journal' can see all messages.")
    executable(tmp_path / "bin/journalctl", f"printf '%s\\n' {shlex.quote(hint)} >&2\n")
    xid = run_probe(tmp_path, memlock_kib=64)["xid"]
    assert xid["status"] == "error" and "journalctl: Hint: You are currently not seeing" in xid["error"]


def test_port_error_counters_are_read_and_others_left_out(tmp_path: Path) -> None:
    hcas = probe_scenario(tmp_path, "ib-flap")["rdma"]["hcas"]
    assert hcas["mlx5_1"]["ports"]["1"]["counters"] == dict(
        {name: "0" for name in probe.PORT_ERROR_COUNTERS}, link_downed="37", link_error_recovery="112",
        symbol_error="4021")
    build_node(tmp_path / "bare", ib_with(0, counters=None))
    assert run_probe(tmp_path / "bare", memlock_kib=64)["rdma"]["hcas"]["mlx5_0"]["ports"]["1"]["counters"] == {}


@pytest.mark.skipif(python36() is None, reason="no Python 3.6 interpreter here")
@pytest.mark.parametrize("name", ["gpu-powercap", "gpu-xid", "ib-flap"])
def test_health_facts_are_the_same_on_python36(tmp_path: Path, name: str) -> None:
    py36 = python36()
    assert py36 is not None
    build_node(tmp_path, SCENARIOS[name]())
    on36, current = run_probe(tmp_path, python=py36), run_probe(tmp_path)
    for section in ("gpu", "xid"):
        assert on36[section] == current[section]
    assert on36["rdma"]["hcas"]["mlx5_1"]["ports"]["1"]["counters"] == (
        current["rdma"]["hcas"]["mlx5_1"]["ports"]["1"]["counters"])


def test_the_running_interpreter_is_not_started_again_for_its_site_dirs(tmp_path: Path) -> None:
    """--python naming the probe's own interpreter costs no second start-up; a venv-like
    link to it (site-packages of its own) is still asked."""
    link = tmp_path / "venv-python"
    link.symlink_to(sys.executable)
    assert probe.is_running_interpreter(sys.executable)
    assert not probe.is_running_interpreter(str(link))
    assert not probe.is_running_interpreter(str(tmp_path / "missing-python"))
    assert probe.python_site_dirs(sys.executable) == []
    asked = probe.python_site_dirs(str(link))
    assert asked and all(d.endswith(("site-packages", "dist-packages")) for d in asked)


@pytest.mark.parametrize("argv", [
    [], ["--python", "python3"], ["--python=/opt/venv/bin/python"], ["--deep", "py", "--python", "py3"],
    ["--python", "a", "--python", "b"],
])
def test_the_quick_argument_parser_agrees_with_argparse(argv: list[str]) -> None:
    assert probe.parse_args(argv) == probe.full_parse_args(argv)


@pytest.mark.parametrize("argv", [["--help"], ["--bogus"], ["--python"], ["python3"], ["-p", "x"],
                                  ["--python", "--deep"]])
def test_anything_else_goes_to_argparse_for_its_help_and_errors(argv: list[str], capsys: Any) -> None:
    with pytest.raises(SystemExit) as ended:
        probe.parse_args(argv)
    said = capsys.readouterr()
    assert "usage: clusterkit-probe" in said.out + said.err
    assert ended.value.code == (0 if argv == ["--help"] else 2)


def test_which_answers_as_shutil_which(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = tmp_path / "bin" / "tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "bin" / "plain").write_text("not executable")
    (tmp_path / "bin" / "adir").mkdir()
    monkeypatch.setenv("PATH", f"{tmp_path / 'missing'}:{tool.parent}:/usr/bin:/bin")
    for name in ("tool", "plain", "adir", "sh", "no-such-tool", str(tool), str(tmp_path / "bin" / "plain")):
        assert probe.which(name) == shutil.which(name), name


def test_the_probe_starts_ldconfig_once_and_imports_no_more_than_it_needs(tmp_path: Path) -> None:
    """ldconfig -p answers both the libnccl and the libibverbs lookup; argparse, csv,
    platform, shutil and socket stay unimported on a node without GPUs, and ctypes
    unless a libnccl was found (this interpreter's torch may bring one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "ldconfig-runs"
    real = shutil.which("ldconfig") or "/sbin/ldconfig"
    (bin_dir / "ldconfig").write_text(f"#!/bin/sh\necho run >> {shlex.quote(str(count))}\nexec {real} \"$@\"\n")
    (bin_dir / "ldconfig").chmod(0o755)
    script = (f"import json, runpy, sys\n"
              f"sys.argv = ['probe', '--python', sys.executable]\n"
              f"try:\n    runpy.run_path({str(PROBE)!r}, run_name='__main__')\n"
              f"except SystemExit:\n    pass\n"
              f"print(json.dumps(sorted(m for m in ('argparse', 'csv', 'ctypes', 'platform', 'shutil', 'socket')"
              f" if m in sys.modules)))\n")
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", CLUSTERKIT_PROBE_ROOT=str(tmp_path / "root"))
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, env=env,
                          check=True, timeout=60)
    facts_line, imported_line = done.stdout.strip().splitlines()[-2:]
    facts = json.loads(facts_line)
    assert facts["probe_version"] == probe.PROBE_VERSION
    assert json.loads(imported_line) == (["ctypes"] if facts["nccl"].get("libraries") else [])
    assert count.read_text().split() == ["run"]
