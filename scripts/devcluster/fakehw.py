#!/usr/bin/env python3
"""Build the fake hardware view of the dev cluster's namespaced nodes.

Each node gets `$DIR/nodes/<node>/` with:
  class/         bind-mounted over /sys/class in the node's namespace
                 (infiniband/<hca>/... and net/<if>/... as the kernel lays them out)
  module/        bind-mounted over /sys/module (nvidia, nvidia_peermem, mlx5_*, ib_*)
  proc_modules   bind-mounted over /proc/modules (what lsmod reads)
  gpus.csv       what the stand-in nvidia-smi reports (real `--format=csv` output)
  cuda_version   the CUDA version in nvidia-smi's banner
  bin/nvidia-smi the stand-in itself (sshd puts bin/ first on PATH)
  bin/dmesg      the stand-in kernel log, from dmesg.txt ("AGE_SECONDS<TAB>message" lines)
  pci_devices/   bind-mounted over /sys/bus/pci/devices: an address -> device link per GPU
                 and HCA, into pci_tree/ (root port / PCIe switch / device, with link, NUMA,
                 class, vendor and device attributes); class/infiniband/<hca>/device
                 links there too
  nvlink_status.txt, nvlink_errors.txt  what the stand-in `nvidia-smi nvlink -s` / `-e` print

The directories and proc_modules are rewritten in place, never replaced, because
the node's namespace holds bind mounts on them: a test edits these files from
outside and the node sees the change at once.

Usage: fakehw.py --dir DIR build NODE...   |   fakehw.py list
"""

import argparse
import hashlib
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# The kernel's gid tables have 128 (IB) or 255 (RoCE) entries; a short table keeps
# the tree small while still showing zero (unpopulated) entries after the real ones.
GID_TABLE_LEN = 16
ZERO_GID = ":".join(["0000"] * 8)

DRIVER = "550.54.15"
CUDA = "12.4"
H100 = ("NVIDIA H100 80GB HBM3", "81559 MiB")
PCI_BUS_IDS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]

PORT_ACTIVE_NDR = {"state": "4: ACTIVE", "phys_state": "5: LinkUp",
                   "rate": "400 Gb/sec (4X NDR)"}
# What an mlx5 port without a link reports: the rate falls back to the lowest speed.
PORT_DOWN = {"state": "1: DOWN", "phys_state": "2: Polling",
             "rate": "10 Gb/sec (4X SDR)"}


def ib_node(hcas, gpus, peermem=True, down=()):
    """A node with `hcas` InfiniBand HCAs (mlx5_0..), port 1 of those in `down` DOWN."""
    ports = []
    for i in range(hcas):
        port = dict(PORT_DOWN if f"mlx5_{i}" in down else PORT_ACTIVE_NDR)
        port["link_layer"] = "InfiniBand"
        ports.append(port)
    return {"fabric": "ib", "ports": ports, "gpus": gpus, "peermem": peermem}


def roce_node(gid3_is_v2=True):
    """A RoCE node: mlx5_0/mlx5_1 on eth0/eth1; GID 3 is RoCE v2 unless told otherwise."""
    ports = []
    for _ in range(2):
        port = dict(PORT_ACTIVE_NDR)
        port["link_layer"] = "Ethernet"
        ports.append(port)
    # Index -> type of the four populated entries (link-local and IPv4-mapped, v1 and v2).
    if gid3_is_v2:
        types = ["IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"]
    else:
        types = ["IB/RoCE v1", "RoCE v2", "RoCE v2", "IB/RoCE v1"]
    return {"fabric": "roce", "ports": ports, "gpus": 8, "peermem": True,
            "gid_types": types}


# The health columns of gpus.csv, in `nvidia-smi --query-gpu` spelling, with a
# healthy H100 SXM's values (PCIe Gen5 x16, idle: clocks_event_reasons.active 0x1).
GPU_HEALTH = [
    ("persistence_mode", "Enabled"), ("ecc.mode.current", "Enabled"),
    ("ecc.errors.corrected.volatile.total", "0"), ("ecc.errors.uncorrected.volatile.total", "0"),
    ("ecc.errors.uncorrected.aggregate.total", "0"), ("retired_pages.pending", "[N/A]"),
    ("pcie.link.gen.current", "5"), ("pcie.link.gen.max", "5"),
    ("pcie.link.width.current", "16"), ("pcie.link.width.max", "16"),
    ("temperature.gpu", "34"), ("clocks_event_reasons.active", "0x0000000000000001"),
    ("remapped_rows.correctable", "0"), ("remapped_rows.uncorrectable", "0"),
    ("remapped_rows.pending", "No"), ("remapped_rows.failure", "No"),
    ("vbios_version", "96.00.89.00.01"), ("clocks.applications.graphics", "1980 MHz"),
    ("clocks.applications.memory", "2619 MHz"), ("gpu_recovery_action", "None"),
]
# Fields a driver before 535 does not know either (with throttle_names: not answered).
NEWER_FIELDS = ("gpu_recovery_action",)
PORT_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                 "local_link_integrity_errors", "excessive_buffer_overrun_errors",
                 "port_rcv_remote_physical_errors", "port_xmit_discards", "port_xmit_data",
                 "port_rcv_data")
XID_79 = ("NVRM: Xid (PCI:0000:2a:00): 79, pid=48213, name=python, "
          "GPU has fallen off the bus.")
XID_13 = ("NVRM: Xid (PCI:0000:3a:00): 13, pid=48213, name=python, Graphics Exception: "
          "ESR 0x50df30=0x107000e 0x50df34=0x0 0x50df28=0x0 0x50df2c=0x0")


def degraded(spec, gpu=None, counters=None, dmesg=(), throttle_names=False, hca_link=None,
             nvlink_down=(), nvlink_errors=None):
    """`spec` with planted faults: {gpu index: {column: value}}, {hca index: {counter: value}},
    kernel-log lines [(age in seconds, message)], pre-535 clock-reason names, {hca index:
    {sysfs link attribute: value}}, inactive NVLinks [(gpu, link)] and NVLink error
    counters {(gpu, link): {"Replay": n, "Recovery": n, "CRC": n}}."""
    spec = dict(spec)
    spec.update(gpu_faults=gpu or {}, counters=counters or {}, dmesg=list(dmesg),
                throttle_names=throttle_names, hca_link=hca_link or {}, nvlink_down=list(nvlink_down),
                nvlink_errors=nvlink_errors or {})
    return spec


# Order matters: a node's position makes its GUIDs, MACs and LIDs unique.
SPECS = {
    "n1": ib_node(2, 4),
    "n2": ib_node(2, 4),
    "ib-ok": ib_node(4, 8),
    "roce-ok": roce_node(),
    "ib-portdown": ib_node(4, 8, down=("mlx5_3",)),
    "ib-nohca": ib_node(3, 8),
    "roce-v1": roce_node(gid3_is_v2=False),
    "ib-nopeermem": ib_node(4, 8, peermem=False),
    "gpu-ecc": degraded(ib_node(4, 8), gpu={2: {"ecc.errors.uncorrected.volatile.total": "2",
                                                "ecc.errors.uncorrected.aggregate.total": "2",
                                                "remapped_rows.uncorrectable": "1",
                                                "remapped_rows.pending": "Yes"}}),
    "gpu-x8": degraded(ib_node(4, 8), gpu={5: {"pcie.link.width.current": "8"}}),
    # HW slowdown (0x8) together with HW thermal slowdown (0x40), at 91 C.
    "gpu-throttle": degraded(ib_node(4, 8), gpu={3: {"clocks_event_reasons.active": "0x0000000000000048",
                                                     "temperature.gpu": "91"}}),
    "gpu-xid": degraded(ib_node(4, 8), dmesg=[(600, XID_79), (300, XID_13)]),
    "ib-flap": degraded(ib_node(4, 8), counters={1: {"link_downed": "37", "link_error_recovery": "112",
                                                     "symbol_error": "4021"}}),
    # SW power cap (0x4) on every GPU, answered like a driver before 535; an old
    # application-error Xid 13 in the log. Healthy: must pass.
    "gpu-powercap": degraded(ib_node(4, 8), gpu={i: {"clocks_event_reasons.active": "0x0000000000000004"}
                                                 for i in range(8)},
                             dmesg=[(900, XID_13)], throttle_names=True),
    # Last, so that the nodes above keep their GUIDs: a third Slurm node, where a
    # 2-node job goes when a restart leaves its culprit out.
    "n3": ib_node(2, 4),
    # More hardware checks (after n3, so that every node above keeps its GUIDs).
    "gpu-reboot": degraded(ib_node(4, 8), gpu={6: {"gpu_recovery_action": "Node Reboot"}}),
    "nic-x8": degraded(ib_node(4, 8), hca_link={2: {"current_link_width": "8"}}),
    "nic-gen4": degraded(ib_node(4, 8), hca_link={1: {"current_link_speed": "16.0 GT/s PCIe"}}),
    "nvlink-down": degraded(ib_node(4, 8), nvlink_down=[(4, 7)]),
    # mlx5_3 sits on a PCIe switch of its own and mlx5_4, which ib_hca does not list,
    # shares the switch of GPUs 6 and 7.
    "topo-far": dict(ib_node(5, 8), hca_switch=[0, 1, 2, 4, 3]),
    # Last: a fourth Slurm node (a hot spare, or where a job goes without two others)
    # whose host name is not its Slurm name; its hardware is n1's.
    "n4": ib_node(2, 4),
    # After n4, so that every node above keeps its GUIDs: the Slurm nodes of partition
    # side, where some tests run beside those on debug; n1's hardware.
    "s1": ib_node(2, 4),
    "s2": ib_node(2, 4),
}


# ---------------------------------------------------------------- PCI topology

# An HGX-like board: PCIe switch k holds GPUs 2k and 2k+1 and HCA mlx5_k below root port
# k; switches 0-1 hang off NUMA node 0, the others off node 1. A switch is (root bus, NUMA).
SWITCHES = [(0x15, 0), (0x35, 0), (0x95, 1), (0xb5, 1), (0xd5, 1)]
PCIE_GEN5_X16 = {"current_link_speed": "32.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe",
                 "current_link_width": "16", "max_link_width": "16"}
# What lspci, gloo and NCCL read of a function besides its link: class, vendor, device
# (a 3D controller by NVIDIA, an InfiniBand controller by Mellanox: ConnectX-7).
GPU_IDS = {"class": "0x030200", "vendor": "0x10de", "device": "0x2330"}
HCA_IDS = {"class": "0x020700", "vendor": "0x15b3", "device": "0x1021"}


def switch_path(switch, slot):
    """[root port, switch upstream port, switch downstream port] above device `slot`."""
    bus, _ = SWITCHES[switch]
    return [f"0000:{bus:02x}:01.0", f"0000:{bus + 1:02x}:00.0", f"0000:{bus + 2:02x}:{slot:02x}.0"]


def pci_devices(spec):
    """[(address, bridges above it, NUMA node, link attributes)] of the node's GPUs and HCAs."""
    devices = []
    for i in range(spec["gpus"]):
        switch = i // 2
        devices.append((f"0000:{PCI_BUS_IDS[i].lower()}:00.0", switch_path(switch, i % 2), SWITCHES[switch][1],
                        dict(PCIE_GEN5_X16)))
    switches = spec.get("hca_switch") or list(range(len(spec["ports"])))
    for j, switch in enumerate(switches):
        link = dict(PCIE_GEN5_X16, **spec.get("hca_link", {}).get(j, {}))
        devices.append((hca_address(spec, j), switch_path(switch, 8), SWITCHES[switch][1], link))
    return devices


def hca_address(spec, index):
    """The PCI address of HCA mlx5_<index>: below its switch, bus root + 4."""
    switches = spec.get("hca_switch") or list(range(len(spec["ports"])))
    return f"0000:{SWITCHES[switches[index]][0] + 4:02x}:{index:02x}.0"


def tree_path(bridges, address):
    """ "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:08.0/0000:19:03.0": a device below pci_tree/."""
    return os.path.join(f"pci0000:{bridges[0][5:7]}", *bridges, address)


def build_pci(pci_dir, tree_dir, spec):
    """pci_devices/<address> links into pci_tree/pci0000:<bus>/<bridges>/<address>/ (the
    tree outside the folder mounted over /sys/bus/pci/devices, which lists functions only)."""
    hcas = {hca_address(spec, j) for j in range(len(spec.get("hca_switch") or spec["ports"]))}
    for address, bridges, numa, link in pci_devices(spec):
        relative = tree_path(bridges, address)
        ids = HCA_IDS if address in hcas else GPU_IDS
        for name, value in dict(link, numa_node=str(numa), **ids).items():
            write(os.path.join(tree_dir, relative, name), value)
        os.symlink(os.path.join(tree_dir, relative), os.path.join(pci_dir, address))


# ---------------------------------------------------------------- NVLink

NVLINKS = 18                     # per H100 SXM
NVLINK_SPEED = "26.562 GB/s"     # what `nvidia-smi nvlink -s` prints per active NVLink4 link


def nvlink_status(node, spec):
    """`nvidia-smi nvlink -s` of the node's H100s (tab and space indent as the driver prints)."""
    lines = []
    for i in range(spec["gpus"]):
        lines.append(f"GPU {i}: {H100[0]} (UUID: {gpu_uuid(node, i)})")
        for link in range(NVLINKS):
            state = "<inactive>" if (i, link) in spec.get("nvlink_down", []) else NVLINK_SPEED
            lines.append(f"\t Link {link}: {state}")
    return "\n".join(lines)


def nvlink_errors(node, spec):
    """`nvidia-smi nvlink -e`: Replay, Recovery and CRC errors per link."""
    lines = []
    planted = spec.get("nvlink_errors", {})
    for i in range(spec["gpus"]):
        lines.append(f"GPU {i}: {H100[0]} (UUID: {gpu_uuid(node, i)})")
        for link in range(NVLINKS):
            counts = planted.get((i, link), {})
            for kind in ("Replay", "Recovery", "CRC"):
                lines.append(f"\t Link {link}: {kind} Errors: {counts.get(kind, 0)}")
    return "\n".join(lines)


def write(path, text):
    """Write one sysfs-style file (a value and a newline), creating parents."""
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent)
    with open(path, "w") as handle:
        handle.write(text + "\n")


def clear_dir(path):
    """Empty `path` but keep the directory itself: a bind mount may sit on it."""
    if not os.path.isdir(path):
        os.makedirs(path)
        return
    for name in os.listdir(path):
        child = os.path.join(path, name)
        if os.path.isdir(child) and not os.path.islink(child):
            shutil.rmtree(child)
        else:
            os.unlink(child)


def guid(node_index, hca_index):
    """A node GUID in the kernel's format: four colon-separated 16-bit groups."""
    return f"b83f:d203:00{node_index:02x}:{0xa000 + hca_index:04x}"


def mac(node_index, if_index):
    return f"b8:3f:d2:{node_index:02x}:{if_index:02x}:10"


def eui64_from_mac(address):
    """The interface id part of a link-local GID, derived from a MAC (RFC 4291)."""
    octets = [int(part, 16) for part in address.split(":")]
    octets = [octets[0] ^ 0x02] + octets[1:3] + [0xff, 0xfe] + octets[3:]
    return [f"{octets[i]:02x}{octets[i + 1]:02x}" for i in range(0, 8, 2)]


def ipv4_mapped_gid(node_index, if_index):
    """The GID RoCE derives from the netdev's IPv4 address 10.<if+1>.0.<node+1>."""
    return f"0000:0000:0000:0000:0000:ffff:0a{if_index + 1:02x}:00{node_index + 1:02x}"


def gid_table(spec, node_index, hca_index):
    """Return (gids, types, ndevs) for port 1 of one HCA; unpopulated entries are zero."""
    gids = [ZERO_GID] * GID_TABLE_LEN
    if spec["fabric"] == "ib":
        gids[0] = "fe80:0000:0000:0000:" + guid(node_index, hca_index)
        return gids, {0: "IB/RoCE v1"}, {}
    link_local = ":".join(["fe80", "0000", "0000", "0000"]
                          + eui64_from_mac(mac(node_index, hca_index)))
    mapped = ipv4_mapped_gid(node_index, hca_index)
    netdev = f"eth{hca_index}"
    for index, value in enumerate([link_local, link_local, mapped, mapped]):
        gids[index] = value
    types = dict(enumerate(spec["gid_types"]))
    return gids, types, {index: netdev for index in types}


def build_infiniband(root, spec, node, node_index, tree_dir):
    """Lay out /sys/class/infiniband/<hca>/... for every HCA of the node."""
    for hca_index, port in enumerate(spec["ports"]):
        hca = os.path.join(root, f"mlx5_{hca_index}")
        write(os.path.join(hca, "fw_ver"), "28.39.1002")
        write(os.path.join(hca, "node_guid"), guid(node_index, hca_index))
        write(os.path.join(hca, "sys_image_guid"), guid(node_index, 0))
        write(os.path.join(hca, "board_id"), "MT_0000000838")
        write(os.path.join(hca, "hca_type"), "MT4129")
        write(os.path.join(hca, "hw_rev"), "0x0")
        write(os.path.join(hca, "node_type"), "1: CA")
        write(os.path.join(hca, "node_desc"), f"{node} mlx5_{hca_index}")
        os.symlink(os.path.join(tree_dir, device_target(spec, hca_index)), os.path.join(hca, "device"))
        build_port(os.path.join(hca, "ports", "1"), spec, port, node_index, hca_index)


def device_target(spec, hca_index):
    """The path (below pci_tree) of an HCA's PCI function."""
    address = hca_address(spec, hca_index)
    bridges = next(b for a, b, _, _ in pci_devices(spec) if a == address)
    return tree_path(bridges, address)


def build_port(root, spec, port, node_index, hca_index):
    is_ib = spec["fabric"] == "ib"
    for name in ("state", "phys_state", "rate", "link_layer"):
        write(os.path.join(root, name), port[name])
    write(os.path.join(root, "lid"), "0x%x" % (node_index * 16 + hca_index + 1) if is_ib else "0x0")
    write(os.path.join(root, "sm_lid"), "0x1" if is_ib else "0x0")
    write(os.path.join(root, "lid_mask_count"), "0")
    write(os.path.join(root, "sm_sl"), "0")
    write(os.path.join(root, "cap_mask"), "0xa751e848" if is_ib else "0x04010000")
    write(os.path.join(root, "pkeys", "0"), "0xffff")
    gids, types, ndevs = gid_table(spec, node_index, hca_index)
    for index, value in enumerate(gids):
        write(os.path.join(root, "gids", str(index)), value)
    # The kernel answers EINVAL when reading types/ndevs of an unpopulated entry;
    # here such files do not exist. A probe must treat both the same way.
    for index, value in types.items():
        write(os.path.join(root, "gid_attrs", "types", str(index)), value)
    for index, value in ndevs.items():
        write(os.path.join(root, "gid_attrs", "ndevs", str(index)), value)
    if not ndevs:
        os.makedirs(os.path.join(root, "gid_attrs", "ndevs"))


def build_net(root, spec, node_index):
    """Lay out /sys/class/net/<if>/... : lo, eth0 and the fabric's interfaces."""
    ifaces = [("lo", {"operstate": "unknown", "mtu": "65536", "carrier": "1", "type": "772",
                      "flags": "0x9", "address": "00:00:00:00:00:00"})]
    eth_mtu = "9000" if spec["fabric"] == "roce" else "1500"
    eth_count = 2 if spec["fabric"] == "roce" else 1
    for i in range(eth_count):
        ifaces.append((f"eth{i}", {"operstate": "up", "mtu": eth_mtu, "carrier": "1",
                                     "type": "1", "flags": "0x1003",
                                     "address": mac(node_index, i)}))
    if spec["fabric"] == "ib":
        for i, port in enumerate(spec["ports"]):
            up = port["state"].endswith("ACTIVE")
            address = "00:00:10:87:fe:80:00:00:00:00:00:00:" + ":".join(
                group[j:j + 2] for group in guid(node_index, i).split(":") for j in (0, 2))
            ifaces.append((f"ib{i}", {"operstate": "up" if up else "down", "mtu": "4092",
                                        "carrier": "1" if up else "0", "type": "32",
                                        "flags": "0x1003", "address": address}))
    for ifindex, (name, attrs) in enumerate(ifaces, start=1):
        attrs["ifindex"] = str(ifindex)
        for key, value in attrs.items():
            write(os.path.join(root, name, key), value)


# name, size, dependants (modules using it); shown only when the node loads it.
MODULES = [
    ("nvidia_peermem", 16384, []),
    ("nvidia_uvm", 1536000, []),
    ("nvidia", 54013952, ["nvidia_peermem", "nvidia_uvm"]),
    ("mlx5_ib", 466944, []),
    ("ib_uverbs", 163840, ["nvidia_peermem", "mlx5_ib"]),
    ("ib_core", 430080, ["ib_uverbs", "mlx5_ib"]),
    ("mlx5_core", 2039808, ["mlx5_ib"]),
]


def build_modules(root, proc_modules, spec):
    """/sys/module/<name>/ entries and the matching /proc/modules lines."""
    loaded = [m for m in MODULES if spec["peermem"] or m[0] != "nvidia_peermem"]
    names = {m[0] for m in loaded}
    lines = []
    for name, size, users in loaded:
        users = [u for u in users if u in names]
        write(os.path.join(root, name, "initstate"), "live")
        write(os.path.join(root, name, "refcnt"), str(len(users)))
        deps = "".join(u + "," for u in users) or "-"
        taint = " (OE)" if name.startswith("nvidia") else ""
        lines.append(f"{name} {size} {len(users)} {deps} Live 0x0000000000000000{taint}")
    write(os.path.join(root, "nvidia", "version"), DRIVER)
    with open(proc_modules, "w") as handle:
        handle.write("\n".join(lines) + "\n")


def gpu_uuid(node, index):
    digest = hashlib.sha1(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def gpus_csv(node, spec):
    """What `nvidia-smi --query-gpu=... --format=csv` prints for the node's GPUs."""
    columns = [(name, value) for name, value in GPU_HEALTH
               if not (spec.get("throttle_names") and name in NEWER_FIELDS)]
    names = [name for name, _ in columns]
    if spec.get("throttle_names"):
        names = [name.replace("clocks_event_reasons.", "clocks_throttle_reasons.") for name in names]
    rows = ["index, name, uuid, driver_version, memory.total [MiB], pci.bus_id, " + ", ".join(names)]
    for i in range(spec["gpus"]):
        faults = spec.get("gpu_faults", {}).get(i, {})
        health = [faults.get(name, value) for name, value in columns]
        rows.append(f"{i}, {H100[0]}, {gpu_uuid(node, i)}, {DRIVER}, {H100[1]}, "
                    f"00000000:{PCI_BUS_IDS[i]}:00.0, " + ", ".join(health))
    return "\n".join(rows)


def build_counters(root, spec):
    """ports/1/counters/ of every HCA: zeros, or the planted values."""
    for hca_index in range(len(spec["ports"])):
        planted = spec.get("counters", {}).get(hca_index, {})
        for name in PORT_COUNTERS:
            write(os.path.join(root, f"mlx5_{hca_index}", "ports", "1", "counters", name),
                  planted.get(name, "0"))


def install_tools(node_dir, spec):
    """bin/nvidia-smi and bin/dmesg (the stand-ins) and the kernel log dmesg reads."""
    bin_dir = os.path.join(node_dir, "bin")
    if not os.path.isdir(bin_dir):
        os.makedirs(bin_dir)
    for tool, source in (("nvidia-smi", "nvidia_smi.py"), ("dmesg", "dmesg.py")):
        target = os.path.join(bin_dir, tool)
        shutil.copyfile(os.path.join(HERE, source), target)
        os.chmod(target, 0o755)
    with open(os.path.join(node_dir, "dmesg.txt"), "w") as handle:
        handle.write("".join(f"{age}\t{message}\n" for age, message in spec.get("dmesg", [])))


def build_node(base, node):
    """(Re)build one node's directory in place; returns the node directory."""
    spec = SPECS[node]
    node_index = list(SPECS).index(node)
    node_dir = os.path.join(base, "nodes", node)
    class_dir = os.path.join(node_dir, "class")
    module_dir = os.path.join(node_dir, "module")
    pci_dir = os.path.join(node_dir, "pci_devices")
    tree_dir = os.path.join(node_dir, "pci_tree")
    clear_dir(class_dir)
    clear_dir(module_dir)
    clear_dir(pci_dir)
    clear_dir(tree_dir)
    build_pci(pci_dir, tree_dir, spec)
    build_infiniband(os.path.join(class_dir, "infiniband"), spec, node, node_index, tree_dir)
    build_net(os.path.join(class_dir, "net"), spec, node_index)
    build_modules(module_dir, os.path.join(node_dir, "proc_modules"), spec)
    build_counters(os.path.join(class_dir, "infiniband"), spec)
    write(os.path.join(node_dir, "gpus.csv"), gpus_csv(node, spec))
    write(os.path.join(node_dir, "cuda_version"), CUDA)
    write(os.path.join(node_dir, "nvlink_status.txt"), nvlink_status(node, spec))
    write(os.path.join(node_dir, "nvlink_errors.txt"), nvlink_errors(node, spec))
    install_tools(node_dir, spec)
    return node_dir


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="the dev cluster's state directory")
    sub = parser.add_subparsers(dest="command")
    build = sub.add_parser("build", help="(re)build nodes' fake hardware in place")
    build.add_argument("nodes", nargs="+", choices=sorted(SPECS))
    sub.add_parser("list", help="print the nodes that have a hardware spec")
    args = parser.parse_args(argv)
    os.umask(0o022)
    if args.command == "list":
        print("\n".join(SPECS))
    elif args.command == "build":
        if not args.dir:
            parser.error("build needs --dir")
        for node in args.nodes:
            build_node(os.path.abspath(args.dir), node)
    else:
        parser.error("give a command: build or list")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
