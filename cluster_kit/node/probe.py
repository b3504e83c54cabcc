"""clusterkit node probe: what silently breaks PyTorch DDP, as one JSON document.

Runs on a compute node with whatever python3 it has (3.6 and newer, stdlib only)
as `python3 - [--python PYTHON] [--deep PYTHON] < probe.py`, one SSH round trip,
and prints the facts of docs/architecture.md ("Probe facts") on stdout.

Every section is always present. A missing tool or file is a fact
(`{"status": "absent", ...}`), a failure is `{"status": "error", "error": ...}`;
nothing here may crash the whole probe, because a node that cannot be probed is
exactly the node the user needs to hear about.

Tests point the file reads at a fake tree with $CLUSTERKIT_PROBE_ROOT (a prefix
for /sys, /proc and /etc); external tools come from PATH.
"""
# ruff: noqa: UP006, UP035, UP045 - typing.List/Optional: this file must run on Python 3.6
import glob
import io
import json
import os
import re
import resource
import signal
import site
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

# Imported where used, not here: argparse, csv and ctypes (only for --help, nvidia-smi's
# output and a found libnccl), and no platform, shutil or socket at all. Every node
# starts this file afresh, and those imports were a third of its CPU on a node
# without GPUs (docs/benchmarks.md, "A leaner probe").

PROBE_VERSION = 1
ROOT_ENV = "CLUSTERKIT_PROBE_ROOT"
COMMAND_TIMEOUT_S = 15
DEEP_TIMEOUT_S = 60
DCGM_TIMEOUT_S = 120      # `dcgmi diag -r 1` takes seconds; a busy host engine longer
DCGM_OUTPUT_TAIL = 2000
GPU_QUERY_FIELDS = ("index", "name", "uuid", "driver_version", "memory.total", "pci.bus_id")
NCCL_SYSTEM_DIRS = (
    "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
    "/usr/local/lib", "/usr/local/lib64", "/usr/local/cuda/lib64", "/usr/local/nccl/lib",
    "/opt/nccl/lib",
)
# Hardware health, asked in the same nvidia-smi call (docs/architecture.md, "gpu").
GPU_HEALTH_FIELDS = (
    "persistence_mode", "ecc.mode.current", "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending", "pcie.link.gen.current", "pcie.link.gen.max",
    "pcie.link.width.current", "pcie.link.width.max", "temperature.gpu",
)
# Asked first where the driver knows them: the driver's own verdict (gpu_recovery_action,
# newer drivers only), and what audit compares across nodes. A driver refusing one is
# asked again without these.
GPU_MORE_FIELDS = ("vbios_version", "clocks.applications.graphics", "clocks.applications.memory",
                   "gpu_recovery_action")
EVENT_PREFIX = "clocks_event_reasons."
THROTTLE_PREFIX = "clocks_throttle_reasons."  # the same fields' names before driver 535
CLOCK_REASON_FIELDS = ("active",)
REMAPPED_ROWS_FIELDS = ("gpu_bus_id", "gpu_uuid", "remapped_rows.correctable", "remapped_rows.uncorrectable",
                        "remapped_rows.pending", "remapped_rows.failure")
INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
PORT_ATTRS = ("state", "phys_state", "rate", "link_layer", "lid", "sm_lid")
HCA_ATTRS = ("fw_ver", "node_guid", "sys_image_guid", "board_id", "hca_type", "node_type")
NET_ATTRS = ("operstate", "carrier", "mtu", "address", "speed", "type")
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
# A PCI function's link and place (Documentation/ABI/testing/sysfs-bus-pci):
# "32.0 GT/s PCIe", "16"; numa_node -1 when the platform does not say.
PCI_DEVICE_ATTRS = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width", "numa_node")
PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
# Error counters of an HCA port (Documentation/ABI/stable/sysfs-class-infiniband).
PORT_ERROR_COUNTERS = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
    "local_link_integrity_errors", "excessive_buffer_overrun_errors", "port_rcv_remote_physical_errors",
)
# "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)")
DMESG_STAMP = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]")
XID_LOOKBACK_S = 7 * 24 * 3600   # how far back the journal is read (expect.xid_window may not exceed it)
XID_MAX_EVENTS = 50              # newest first; a GPU in an XID storm must not bloat the facts
# `nvidia-smi nvlink -s` / `-e`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)", then
# "\t Link 3: 26.562 GB/s" or "Link 3: <inactive>", "\t Link 0: Replay Errors: 0".
NVLINK_GPU = re.compile(r"^GPU (\d+): ")
NVLINK_LINK = re.compile(r"^\s*Link (\d+): (.*?)\s*$")
NVLINK_ERROR = re.compile(r"^(.+?) Errors?: (\d+)$")
NVLINK_ALL_INACTIVE = "all links are inactive"
IOMMU_FLAG = re.compile(r"^(iommu|intel_iommu|amd_iommu)(=|$)")

Facts = Dict[str, Any]


class CommandTimeout(Exception):
    """An external command did not finish within its timeout (it was killed)."""


# ---------------------------------------------------------------- small helpers

def host_path(path: str) -> str:
    """`path` under $CLUSTERKIT_PROBE_ROOT when set (tests), else `path` itself."""
    root = os.environ.get(ROOT_ENV, "")
    return root.rstrip("/") + path if root else path


def read_text(path: str) -> Optional[str]:
    """A small file's stripped text, or None when it is missing or unreadable.

    sysfs raises EINVAL for attributes that exist but have no value (an
    unpopulated GID's type, the carrier of a down link): that is None too.
    """
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return None


def natural_key(name: str) -> Tuple[Any, ...]:
    """Sort key putting "2" before "10" and "mlx5_2" before "mlx5_10"."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def list_dir(path: str) -> List[str]:
    """Entries of a directory in natural order; [] when it is missing."""
    try:
        return sorted(os.listdir(path), key=natural_key)
    except OSError:
        return []


def read_attrs(path: str, names: Tuple[str, ...]) -> Dict[str, Optional[str]]:
    """{name: text or None} for sysfs attribute files under `path`."""
    return {name: read_text(os.path.join(path, name)) for name in names}


def which(name: str) -> Optional[str]:
    """The executable `name` would run: itself when it names a path, else the first
    match on $PATH (shutil.which's answer, without importing shutil and the
    compression modules it brings)."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) and not os.path.isdir(name) else None
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory, name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def run_command(argv: List[str], timeout: float = COMMAND_TIMEOUT_S) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr) of a command; raises OSError or CommandTimeout.

    Output is decoded as UTF-8 by hand: Python 3.6 under a C locale (plain SSH
    sessions) would otherwise decode as ASCII and fail on any other byte.
    """
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.communicate()
        raise CommandTimeout(f"{argv[0]} did not finish within {timeout:g} s")
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def kill_group(proc: "subprocess.Popen[bytes]") -> None:
    """Kill a timed-out command and whatever it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()


def guarded(section: Callable[..., Facts], *args: Any) -> Facts:
    """Run one probe section; an unexpected exception becomes that section's error."""
    try:
        return section(*args)
    except Exception as exc:  # noqa: BLE001 - one broken section must not hide the others
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}


# ---------------------------------------------------------------- os

def parse_os_release(text: str) -> Dict[str, str]:
    """KEY=value pairs of /etc/os-release, quotes removed."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            values[key.strip()] = value.strip().strip("\"'")
    return values


def probe_os() -> Facts:
    """Kernel, distribution and this Python."""
    release = parse_os_release(read_text(host_path("/etc/os-release")) or "")
    uname = os.uname()
    return {"status": "ok", "kernel": uname.release, "arch": uname.machine,
            "os_release": release.get("PRETTY_NAME") or release.get("NAME"),
            "os_id": release.get("ID"), "os_version_id": release.get("VERSION_ID"),
            "python": sys.version.split()[0], "python_executable": sys.executable}


# ---------------------------------------------------------------- gpu

def field_key(field: str) -> str:
    """A query field as a fact key: "pci.bus_id" -> "pci_bus_id".

    Both spellings of the clock reasons land on the `clocks_event_reasons_*` key.
    """
    return field.replace(THROTTLE_PREFIX, EVENT_PREFIX).replace(".", "_")


def parse_gpu_csv(text: str, fields: Tuple[str, ...] = GPU_QUERY_FIELDS) -> List[Dict[str, str]]:
    """GPUs from `nvidia-smi --query-gpu=<fields> --format=csv,noheader`."""
    import csv

    keys = [field_key(field) for field in fields]
    gpus = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if len(row) == len(keys):
            gpus.append(dict(zip(keys, (value.strip() for value in row))))
    return gpus


def parse_cuda_version(banner: str) -> Optional[str]:
    """The "CUDA Version: 12.4" of nvidia-smi's banner (the driver's CUDA API)."""
    match = re.search(r"CUDA Version:\s*([0-9][0-9.]*)", banner)
    return match.group(1) if match else None


def nvidia_smi_error(code: int, out: str, err: str) -> Facts:
    """An error fact carrying what nvidia-smi said (e.g. it cannot reach the driver)."""
    text = (out.strip() + "\n" + err.strip()).strip() or "no output"
    return {"status": "error", "error": text, "exit_code": code}


def probe_gpu() -> Facts:
    """GPUs, driver and CUDA version as nvidia-smi reports them, with their health."""
    exe = which("nvidia-smi")
    if exe is None:
        return {"status": "absent", "error": "nvidia-smi not found on PATH"}
    try:
        code, out, err, fields, refused = query_gpus(exe)
    except CommandTimeout as exc:
        return {"status": "error", "error": f"nvidia-smi hangs: {exc}"}
    if code != 0:
        return nvidia_smi_error(code, out, err)
    gpus = parse_gpu_csv(out, fields)
    facts = {"status": "ok", "driver": gpus[0]["driver_version"] if gpus else None,
             "cuda": probe_cuda_version(exe), "gpus": gpus}  # type: Facts
    facts.update(health_query_facts(fields, refused))
    if gpus and len(fields) > len(GPU_QUERY_FIELDS):
        facts.update(probe_remapped_rows(exe, gpus))
    return facts


def probe_cuda_version(exe: str) -> Optional[str]:
    """CUDA version from the plain `nvidia-smi` banner; None when it has none."""
    try:
        code, out, _ = run_command([exe])
    except (OSError, CommandTimeout):
        return None
    return parse_cuda_version(out) if code == 0 else None


# ---------------------------------------------------------------- gpu health

def health_queries() -> List[Tuple[str, ...]]:
    """The --query-gpu field lists to try, widest first.

    Drivers before 535 know the clock reasons only as clocks_throttle_reasons.*;
    drivers before gpu_recovery_action are asked again without GPU_MORE_FIELDS;
    a driver refusing every health field still answers the basic query.
    """
    clocks = [tuple(prefix + f for f in CLOCK_REASON_FIELDS) for prefix in (EVENT_PREFIX, THROTTLE_PREFIX)]
    return ([GPU_QUERY_FIELDS + GPU_HEALTH_FIELDS + GPU_MORE_FIELDS + clock for clock in clocks]
            + [GPU_QUERY_FIELDS + GPU_HEALTH_FIELDS + clock for clock in clocks] + [GPU_QUERY_FIELDS])


def query_gpus(exe: str) -> Tuple[int, str, str, Tuple[str, ...], List[str]]:
    """(code, stdout, stderr, fields asked, fields refused on the way) of the widest query the driver takes.

    Only an invalid-field answer moves on, to the next query without the refused
    field, so a healthy node costs one call and a broken driver's error is
    reported as is.
    """
    refused = []  # type: List[str]
    for fields in health_queries():
        if fields != GPU_QUERY_FIELDS and any(field in refused for field in fields):
            continue
        code, out, err = run_command([exe, "--query-gpu=" + ",".join(fields), "--format=csv,noheader"])
        bad = INVALID_FIELD.search(out + err)
        if code == 0 or bad is None or fields == GPU_QUERY_FIELDS:
            return code, out, err, fields, refused
        refused.append(bad.group(1))
    raise AssertionError("unreachable: the basic query always returns")


def health_query_facts(fields: Tuple[str, ...], refused: List[str]) -> Facts:
    """Which clock-reason spelling answered, and the fields the driver refused."""
    facts = {"clock_reasons_field": None}  # type: Facts
    for field in fields:
        if field.startswith((EVENT_PREFIX, THROTTLE_PREFIX)):
            facts["clock_reasons_field"] = field
    if refused:
        facts["refused_fields"] = refused
    if fields == GPU_QUERY_FIELDS:
        facts["health_error"] = "nvidia-smi refused the health fields: " + ", ".join(sorted(set(refused)))
    return facts


def parse_remapped_rows(text: str) -> Dict[str, Dict[str, str]]:
    """{pci bus id: {remapped_rows_*: value}} from `--query-remapped-rows=<REMAPPED_ROWS_FIELDS>`."""
    import csv

    keys = [field.replace(".", "_") for field in REMAPPED_ROWS_FIELDS[2:]]
    rows = {}
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if len(row) == len(REMAPPED_ROWS_FIELDS):
            rows[row[0].strip()] = dict(zip(keys, (value.strip() for value in row[2:])))
    return rows


def probe_remapped_rows(exe: str, gpus: List[Dict[str, str]]) -> Facts:
    """Row-remapper state merged into each GPU (Ampere and newer); a refusal is a fact."""
    argv = [exe, "--query-remapped-rows=" + ",".join(REMAPPED_ROWS_FIELDS), "--format=csv,noheader"]
    try:
        code, out, err = run_command(argv)
    except (OSError, CommandTimeout) as exc:
        return {"remapped_rows_error": str(exc)}
    if code != 0:
        return {"remapped_rows_error": (out.strip() + " " + err.strip()).strip() or f"exit code {code}"}
    rows = parse_remapped_rows(out)
    for gpu in gpus:
        gpu.update(rows.get(gpu.get("pci_bus_id", ""), {}))
    return {}


# ---------------------------------------------------------------- topology

def sysfs_pci_address(bus_id: str) -> str:
    """nvidia-smi's "00000000:18:00.0" as sysfs names the function: "0000:18:00.0"."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return domain[-4:].rjust(4, "0") + ":" + rest


def probe_topo(gpu_facts: Facts) -> Facts:
    """Each listed GPU's PCI function (/sys/bus/pci/devices/<bus id>): NUMA node, link, path."""
    gpus = gpu_facts.get("gpus") if gpu_facts.get("status") == "ok" else None
    if not gpus:
        return {"status": "absent", "error": "nvidia-smi listed no GPU"}
    devices = {}
    for gpu in gpus:
        address = sysfs_pci_address(gpu.get("pci_bus_id") or "")
        devices[gpu.get("index", address)] = read_pci_device(host_path("/sys/bus/pci/devices/" + address))
    return {"status": "ok", "gpus": devices}


# ---------------------------------------------------------------- nvlink

def parse_nvlink_status(text: str) -> Dict[str, Facts]:
    """{gpu index: {"links": {link: "26.562 GB/s" | "inactive"}, "all_inactive": bool}}
    from `nvidia-smi nvlink -s`; a GPU without NVLink has no link lines."""
    gpus = {}  # type: Dict[str, Facts]
    current = None  # type: Optional[Facts]
    for line in text.splitlines():
        gpu, link = NVLINK_GPU.match(line), NVLINK_LINK.match(line)
        if gpu:
            current = gpus.setdefault(gpu.group(1), {"links": {}, "all_inactive": False})
        elif current is not None and link:
            state = link.group(2)
            current["links"][link.group(1)] = "inactive" if state.strip("<>").lower() == "inactive" else state
        elif current is not None and NVLINK_ALL_INACTIVE in line.lower():
            current["all_inactive"] = True
    return gpus


def parse_nvlink_errors(text: str) -> Dict[str, Dict[str, Dict[str, str]]]:
    """{gpu index: {link: {"replay": "0", "recovery": "0", "crc": "0"}}} from `nvidia-smi nvlink -e`."""
    gpus = {}  # type: Dict[str, Dict[str, Dict[str, str]]]
    current = None  # type: Optional[Dict[str, Dict[str, str]]]
    for line in text.splitlines():
        gpu, link = NVLINK_GPU.match(line), NVLINK_LINK.match(line)
        if gpu:
            current = gpus.setdefault(gpu.group(1), {})
        elif current is not None and link:
            error = NVLINK_ERROR.match(link.group(2))
            if error:
                kind = error.group(1).strip().lower().replace(" ", "_")
                current.setdefault(link.group(1), {})[kind] = error.group(2)
    return gpus


def run_nvlink(exe: str, flag: str) -> Tuple[Optional[str], str]:
    """(stdout, "") of `nvidia-smi nvlink FLAG`, or (None, what went wrong)."""
    try:
        code, out, err = run_command([exe, "nvlink", flag])
    except (OSError, CommandTimeout) as exc:
        return None, str(exc)
    if code != 0 and NVLINK_ALL_INACTIVE not in (out + err).lower():
        return None, (out.strip() + " " + err.strip()).strip() or f"exit code {code}"
    return out + err, ""


def probe_nvlink() -> Facts:
    """NVLink state per GPU and link (`nvidia-smi nvlink -s`) and, where a GPU has links,
    their error counters (`nvidia-smi nvlink -e`)."""
    exe = which("nvidia-smi")
    if exe is None:
        return {"status": "absent", "error": "nvidia-smi not found on PATH"}
    status, why = run_nvlink(exe, "-s")
    if status is None:
        return {"status": "error", "error": "nvidia-smi nvlink -s: " + why}
    gpus = parse_nvlink_status(status)
    if any(gpu["links"] for gpu in gpus.values()):
        errors, why = run_nvlink(exe, "-e")
        if errors is None:
            return {"status": "ok", "gpus": gpus, "errors_error": "nvidia-smi nvlink -e: " + why}
        for index, links in parse_nvlink_errors(errors).items():
            gpus.setdefault(index, {"links": {}, "all_inactive": False})["errors"] = links
    return {"status": "ok", "gpus": gpus}


# ---------------------------------------------------------------- nccl

def decode_nccl_version(code: int) -> str:
    """ncclGetVersion's integer as "major.minor.patch".

    NCCL >= 2.9 encodes major*10000 + minor*100 + patch (22105 = 2.21.5); older
    releases major*1000 + minor*100 + patch (2708 = 2.7.8).
    """
    major_unit = 10000 if code >= 10000 else 1000
    return f"{code // major_unit}.{code % major_unit // 100}.{code % 100}"


def nccl_library_version(path: str) -> str:
    """Load one libnccl with ctypes and ask it for its version (no GPU needed)."""
    import ctypes

    lib = ctypes.CDLL(path)
    get_version = lib.ncclGetVersion
    get_version.argtypes = [ctypes.POINTER(ctypes.c_int)]
    get_version.restype = ctypes.c_int
    value = ctypes.c_int(0)
    result = get_version(ctypes.byref(value))
    if result != 0:
        raise RuntimeError(f"ncclGetVersion returned error {result}")
    return decode_nccl_version(value.value)


def own_site_dirs() -> List[str]:
    """site-packages directories of the Python running the probe."""
    dirs = list(getattr(site, "getsitepackages", list)())
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    if user_site:
        dirs.append(user_site)
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return dirs


SITE_DIRS_SNIPPET = (
    "import json, site, sys\n"
    "d = list(getattr(site, 'getsitepackages', lambda: [])())\n"
    "d += [p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]\n"
    "print(json.dumps(d))\n"
)


def is_running_interpreter(python: str) -> bool:
    """Whether `python` names the interpreter running the probe, with its own settings.

    The path is compared unresolved: a virtualenv's python links to the system
    one but has site-packages of its own.
    """
    found = which(python)
    return (found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)
            and not (sys.flags.no_site or sys.flags.no_user_site or sys.flags.isolated))


def python_site_dirs(python: str) -> List[str]:
    """site-packages directories of another interpreter (environment.python).

    Asking the interpreter running the probe would cost a second start-up (the
    larger part of the probe's CPU) to learn what own_site_dirs already knows.
    """
    if is_running_interpreter(python):
        return []
    try:
        code, out, _ = run_command([python, "-c", SITE_DIRS_SNIPPET])
    except (OSError, CommandTimeout):
        return []
    if code != 0 or not out.strip():
        return []
    try:
        return [str(d) for d in json.loads(out.strip().splitlines()[-1])]
    except ValueError:
        return []


def ldconfig_nccl_paths() -> List[str]:
    """libnccl paths of the dynamic linker's cache (`ldconfig -p`)."""
    return ldconfig_paths("libnccl.so")


def ldconfig_paths(library: str) -> List[str]:
    """Paths of the dynamic linker's cache (`ldconfig -p`) whose name holds `library`."""
    return [line.split("=>", 1)[1].strip() for line in ldconfig_listing(os.environ.get("PATH", "")).splitlines()
            if library in line and "=>" in line]


_LDCONFIG_LISTINGS = {}  # type: Dict[str, str]


def ldconfig_listing(path_env: str) -> str:
    """`ldconfig -p`'s output ("" where no ldconfig answers), read once per $PATH:
    libnccl and libibverbs are both looked up in it."""
    if path_env not in _LDCONFIG_LISTINGS:
        _LDCONFIG_LISTINGS[path_env] = ""
        for ldconfig in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
            exe = which(ldconfig) or (ldconfig if os.path.isfile(ldconfig) else None)
            if exe is None:
                continue
            try:
                _code, out, _ = run_command([exe, "-p"])
            except (OSError, CommandTimeout):
                continue
            _LDCONFIG_LISTINGS[path_env] = out
            break
    return _LDCONFIG_LISTINGS[path_env]


def nccl_search_paths(site_dirs: List[str]) -> List[Tuple[str, str]]:
    """(path, source) of every libnccl where torch, pip, the loader or packages put it.

    Earlier entries win: torch's bundled copy and the pip wheels are what a
    PyTorch job loads; LD_LIBRARY_PATH, ldconfig and the system dirs come after.
    """
    found = []  # type: List[Tuple[str, str]]
    for base in site_dirs:
        found += [(p, "torch") for p in sorted(glob.glob(os.path.join(base, "torch", "lib", "libnccl.so*")))]
    for base in site_dirs:
        for sub in (("nvidia", "nccl", "lib"), ("nvidia", "cu13", "lib")):
            found += [(p, "pip") for p in sorted(glob.glob(os.path.join(base, *(sub + ("libnccl.so*",)))))]
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if directory:
            found += [(os.path.join(directory, "libnccl.so.2"), "LD_LIBRARY_PATH")]
    found += [(p, "ldconfig") for p in ldconfig_nccl_paths()]
    found += [(os.path.join(d, "libnccl.so.2"), "system") for d in NCCL_SYSTEM_DIRS]
    return dedupe_existing(found)


def dedupe_existing(paths: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """Existing files only, each real file once (symlinks and repeated dirs collapse)."""
    seen = set()
    unique = []
    for path, source in paths:
        real = os.path.realpath(path)
        if os.path.isfile(real) and real not in seen:
            seen.add(real)
            unique.append((path, source))
    return unique


def probe_nccl(env_python: Optional[str] = None) -> Facts:
    """Every libnccl a job could load, with its version from ncclGetVersion.

    `version`/`path` are the first loadable one in search order (see
    nccl_search_paths); `libraries` lists them all, with load errors.
    """
    site_dirs = own_site_dirs() + (python_site_dirs(env_python) if env_python else [])
    libraries = []
    for path, source in nccl_search_paths(site_dirs):
        entry = {"path": path, "source": source}  # type: Dict[str, Any]
        try:
            entry["version"] = nccl_library_version(path)
        except Exception as exc:  # noqa: BLE001 - OSError, missing symbol, ...
            entry["error"] = f"{type(exc).__name__}: {exc}"
        libraries.append(entry)
    candidates = [entry["path"] for entry in libraries]
    if not libraries:
        return {"status": "absent", "error": "no libnccl.so found (torch, pip nvidia-nccl-cu*, "
                f"LD_LIBRARY_PATH, ldconfig, {', '.join(NCCL_SYSTEM_DIRS[:3])})",
                "candidates": [], "libraries": []}
    loadable = [entry for entry in libraries if "version" in entry]
    if not loadable:
        return {"status": "error", "error": f"no libnccl could be loaded: {libraries[0]['error']}",
                "candidates": candidates, "libraries": libraries}
    best = loadable[0]
    return {"status": "ok", "version": best["version"], "path": best["path"],
            "source": best["source"], "candidates": candidates, "libraries": libraries}


# ---------------------------------------------------------------- rdma

def read_gid_table(port_dir: str) -> Facts:
    """gids/N, gid_attrs/types/N and gid_attrs/ndevs/N of one port.

    Every readable GID is reported, all-zero ones too (the checks decide);
    the kernel refuses to read the type/ndev of an unpopulated entry, so
    those are simply left out.
    """
    table = {"gids": {}, "gid_types": {}, "gid_ndevs": {}}  # type: Facts
    attrs = os.path.join(port_dir, "gid_attrs")
    for index in list_dir(os.path.join(port_dir, "gids")):
        gid = read_text(os.path.join(port_dir, "gids", index))
        if gid is None:
            continue
        table["gids"][index] = gid
        for key, sub in (("gid_types", "types"), ("gid_ndevs", "ndevs")):
            value = read_text(os.path.join(attrs, sub, index))
            if value:
                table[key][index] = value
    return table


def read_port(port_dir: str) -> Facts:
    """One HCA port: state, phys_state, rate, link_layer, ... and its GID table."""
    port = read_attrs(port_dir, PORT_ATTRS)  # type: Facts
    port.update(read_gid_table(port_dir))
    port["counters"] = read_port_counters(port_dir)
    return port


def read_port_counters(port_dir: str) -> Dict[str, str]:
    """The port's error counters that the kernel exposes ({} without a counters/ dir)."""
    counters = read_attrs(os.path.join(port_dir, "counters"), PORT_ERROR_COUNTERS)
    return {name: value for name, value in counters.items() if value is not None}


def pci_path(device_dir: str) -> List[str]:
    """The PCI functions from the root port down to this device ("0000:17:00.0", ...),
    read off the sysfs path the device's link resolves to; [] when it resolves nowhere."""
    real = os.path.realpath(device_dir)
    if not os.path.isdir(real):
        return []
    return [part.lower() for part in real.split(os.sep) if PCI_ADDRESS.match(part)]


def read_pci_device(device_dir: str) -> Facts:
    """A PCI function's link speed/width (current and max), NUMA node and path."""
    device = read_attrs(device_dir, PCI_DEVICE_ATTRS)  # type: Facts
    device["path"] = pci_path(device_dir)
    return device


def read_hca(hca_dir: str) -> Facts:
    """One HCA: firmware, GUIDs, board, its PCI function, its netdevs and its ports."""
    hca = read_attrs(hca_dir, HCA_ATTRS)  # type: Facts
    hca["pci"] = read_pci_device(os.path.join(hca_dir, "device"))
    hca["netdevs"] = list_dir(os.path.join(hca_dir, "device", "net"))
    ports_dir = os.path.join(hca_dir, "ports")
    hca["ports"] = {port: read_port(os.path.join(ports_dir, port)) for port in list_dir(ports_dir)}
    return hca


def probe_rdma() -> Facts:
    """HCAs and ports from /sys/class/infiniband, as the kernel lays them out."""
    base = host_path("/sys/class/infiniband")
    if not os.path.isdir(base):
        return {"status": "absent", "error": "/sys/class/infiniband does not exist "
                "(no RDMA device or the ib_core/mlx5_ib driver is not loaded)", "hcas": {}}
    return {"status": "ok", "hcas": {name: read_hca(os.path.join(base, name)) for name in list_dir(base)}}


def probe_peermem() -> Facts:
    """Whether a GPUDirect RDMA peer-memory module is loaded."""
    modules = read_text(host_path("/proc/modules")) or ""
    loaded = {line.split(" ", 1)[0] for line in modules.splitlines()}
    facts = {"status": "ok"}  # type: Facts
    for name in PEERMEM_MODULES:
        facts[name] = os.path.isdir(host_path("/sys/module/" + name)) or name in loaded
    return facts


# ---------------------------------------------------------------- xid (kernel log)

def parse_xid_line(message: str) -> Optional[Facts]:
    """{"xid": 79, "pci": "0000:18:00", "text": ...} of one NVRM Xid line, else None."""
    match = XID_LINE.search(message)
    if match is None:
        return None
    return {"xid": int(match.group(2)), "pci": match.group(1), "text": match.group(3).strip()}


def parse_dmesg_xids(text: str, uptime_s: float) -> List[Facts]:
    """Xid events of plain `dmesg` output ("[  123.456] NVRM: Xid ..."), each with its age."""
    events = []
    for line in text.splitlines():
        stamp, event = DMESG_STAMP.match(line), parse_xid_line(line)
        if event is not None:
            event["age_s"] = round(max(0.0, uptime_s - float(stamp.group(1))), 1) if stamp else None
            events.append(event)
    return events


def parse_journal_xids(text: str, now_s: float) -> List[Facts]:
    """Xid events of `journalctl -o short-unix` output ("1733212345.123 host kernel: NVRM: Xid ...")."""
    events = []
    for line in text.splitlines():
        stamp, event = line.split(" ", 1)[0], parse_xid_line(line)
        if event is not None:
            try:
                event["age_s"] = round(max(0.0, now_s - float(stamp)), 1)
            except ValueError:
                event["age_s"] = None
            events.append(event)
    return events


def read_uptime() -> Optional[float]:
    """Seconds since boot (/proc/uptime), the clock of dmesg's timestamps."""
    text = read_text(host_path("/proc/uptime")) or ""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def dmesg_xids() -> Tuple[Optional[List[Facts]], str]:
    """(events, "") from the kernel ring buffer, or (None, why it cannot be read)."""
    exe = which("dmesg")
    if exe is None:
        return None, "dmesg not found on PATH"
    code, out, err = run_command([exe])
    uptime = read_uptime()
    if code != 0 or uptime is None:
        said = (err.strip() or out.strip() or f"exit code {code}") if code else "no /proc/uptime"
        return None, said if said.startswith("dmesg") else "dmesg: " + said
    return parse_dmesg_xids(out, uptime), ""


def journal_xids(now_s: float) -> Tuple[Optional[List[Facts]], str]:
    """(events, "") from the journal's kernel messages, or (None, why not).

    Without the adm/systemd-journal group journalctl exits 0 showing only the
    user's own journal: its "not seeing messages" hint makes that unreadable.
    """
    exe = which("journalctl")
    if exe is None:
        return None, "journalctl not found on PATH"
    argv = [exe, "-k", "--no-pager", "-q", "-o", "short-unix", "--since", f"@{int(now_s - XID_LOOKBACK_S)}"]
    code, out, err = run_command(argv)
    if code != 0 or "not seeing messages" in err or "No journal files" in err:
        return None, "journalctl: " + (err.strip().splitlines() or [f"exit code {code}"])[0]
    return parse_journal_xids(out, now_s), ""


def probe_xid() -> Facts:
    """NVIDIA Xid errors in the kernel log: dmesg, else the journal (read-only, bounded)."""
    reasons = []
    for source, read in (("dmesg", dmesg_xids), ("journal", lambda: journal_xids(time.time()))):
        try:
            events, why = read()
        except (OSError, CommandTimeout) as exc:
            events, why = None, f"{source}: {exc}"
        if events is not None:
            events.sort(key=lambda event: event["age_s"] if event["age_s"] is not None else 0)
            return {"status": "ok", "source": source, "lookback_s": None if source == "dmesg" else XID_LOOKBACK_S,
                    "events": events[:XID_MAX_EVENTS], "total": len(events)}
        reasons.append(why)
    return {"status": "error", "error": "kernel log unreadable: " + "; ".join(reasons)}


# ---------------------------------------------------------------- net, limits, iommu

def probe_net() -> Facts:
    """Network interfaces from /sys/class/net: operstate, carrier, mtu, MAC, speed."""
    base = host_path("/sys/class/net")
    if not os.path.isdir(base):
        return {"status": "absent", "error": "/sys/class/net does not exist", "interfaces": {}}
    return {"status": "ok", "interfaces": {name: read_attrs(os.path.join(base, name), NET_ATTRS)
                                           for name in list_dir(base)
                                           if os.path.isdir(os.path.join(base, name))}}


def parse_default_route(text: str) -> Facts:
    """The default route of /proc/net/route: its interface and gateway (lowest metric wins).

    NCCL and Gloo bootstrap over the interface that reaches the other nodes; on a
    typical node that is the one the default route leaves through.
    """
    best = None  # type: Optional[Tuple[int, str, str]]
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8 or cols[1] != "00000000" or cols[7] != "00000000":
            continue
        try:
            flags, metric, gateway = int(cols[3], 16), int(cols[6]), int(cols[2], 16)
        except ValueError:
            continue
        if flags & 0x1 and (best is None or metric < best[0]):
            address = ".".join(str(byte) for byte in gateway.to_bytes(4, "little"))
            best = (metric, cols[0], address)
    if best is None:
        return {"status": "ok", "default_interface": None, "default_gateway": None}
    return {"status": "ok", "default_interface": best[1], "default_gateway": best[2]}


def probe_route() -> Facts:
    """The IPv4 default route from /proc/net/route."""
    text = read_text(host_path("/proc/net/route"))
    if text is None:
        return {"status": "absent", "error": "/proc/net/route is not readable"}
    return parse_default_route(text)


def limit_kib(value: int) -> str:
    """An RLIMIT_MEMLOCK value as `ulimit -l` shows it: KiB or "unlimited"."""
    return "unlimited" if value == resource.RLIM_INFINITY else str(value // 1024)


def probe_verbs() -> Facts:
    """What NCCL's IB/RoCE transport needs in this (possibly container's) view.

    libibverbs (the loader's cache, then the system dirs) and the /dev/infiniband
    device files; without either NCCL quietly falls back to sockets.
    """
    found = [(p, "ldconfig") for p in ldconfig_paths("libibverbs.so")]
    found += [(os.path.join(d, "libibverbs.so.1"), "system") for d in NCCL_SYSTEM_DIRS]
    devices = host_path("/dev/infiniband")
    return {
        "libibverbs": [path for path, _source in dedupe_existing(found)],
        "dev_infiniband": list_dir(devices) if os.path.isdir(devices) else None,
    }


def probe_memlock() -> Facts:
    """RLIMIT_MEMLOCK of this session (what RDMA can pin), soft and hard."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return {"status": "ok", "soft_kib": limit_kib(soft), "hard_kib": limit_kib(hard)}


def probe_iommu() -> Facts:
    """IOMMU groups and the kernel command line's iommu flags (they slow GPUDirect)."""
    groups_dir = host_path("/sys/kernel/iommu_groups")
    groups = str(len(list_dir(groups_dir))) if os.path.isdir(groups_dir) else None
    cmdline = (read_text(host_path("/proc/cmdline")) or "").split()
    return {"status": "ok", "groups": groups,
            "cmdline": " ".join(flag for flag in cmdline if IOMMU_FLAG.match(flag))}


# ---------------------------------------------------------------- torch (--deep)

TORCH_SNIPPET = r"""
import json
out = {"status": "ok"}
try:
    import torch
except Exception as exc:
    print(json.dumps({"status": "error", "error": "import torch failed: %s: %s" % (type(exc).__name__, exc)}))
    raise SystemExit(0)
out["version"] = torch.__version__
out["cuda"] = getattr(torch.version, "cuda", None)
def attempt(key, fn):
    try:
        out[key] = fn()
    except Exception as exc:
        out[key] = None
        out[key + "_error"] = "%s: %s" % (type(exc).__name__, exc)
def nccl_version():
    v = torch.cuda.nccl.version()
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
attempt("cuda_available", lambda: bool(torch.cuda.is_available()))
attempt("device_count", lambda: int(torch.cuda.device_count()))
attempt("nccl", nccl_version)
attempt("distributed_nccl", lambda: bool(torch.distributed.is_nccl_available()))
print(json.dumps(out))
"""


def probe_torch(python: Optional[str]) -> Facts:
    """torch as environment.python sees it (slow: imports torch); skipped without --deep."""
    if not python:
        return {"status": "skipped"}
    try:
        code, out, err = run_command([python, "-c", TORCH_SNIPPET], timeout=DEEP_TIMEOUT_S)
    except OSError as exc:
        return {"status": "error", "error": f"cannot run {python}: {exc}", "python": python}
    except CommandTimeout as exc:
        return {"status": "error", "error": str(exc), "python": python}
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            facts = json.loads(line)
            facts["python"] = python
            return dict(facts)
    detail = (err.strip().splitlines() or [f"exit code {code}"])[-1]
    return {"status": "error", "error": f"{python} printed no facts: {detail}", "python": python}


# ---------------------------------------------------------------- dcgm (--dcgm)

DCGM_ROW = re.compile(r"^\|\s*(.*?)\s*\|\s*(.*?)\s*\|\s*$")
DCGM_RESULTS = ("Pass", "Fail", "Skip", "Warn")


def parse_dcgm_diag(text: str) -> List[Facts]:
    """[{"test": "PCIe", "result": "Fail - All", "details": ["GPU 0's NvLink ..."]}] of the
    table `dcgmi diag -r N` prints; "Warning"/"Error"/"Info" rows (and a wrapped text's
    nameless rows) belong to the test above them."""
    tests = []  # type: List[Facts]
    for line in text.splitlines():
        row = DCGM_ROW.match(line.strip())
        if row is None or line.strip().startswith("|-----"):
            continue
        name, value = row.group(1), row.group(2)
        if value.startswith(DCGM_RESULTS) and name not in ("", "Warning", "Error", "Info"):
            tests.append({"test": name, "result": value, "details": []})
        elif tests and name in ("", "Warning", "Error", "Info") and value:
            details = tests[-1]["details"]
            if name or not details:
                details.append(value)
            else:
                details[-1] = details[-1] + " " + value
    return tests


def probe_dcgm(run: bool) -> Facts:
    """DCGM's quick diagnostic (`dcgmi diag -r 1`) where dcgmi is installed; only with --dcgm."""
    if not run:
        return {"status": "skipped"}
    exe = which("dcgmi")
    if exe is None:
        return {"status": "absent", "error": "dcgmi not found on PATH (DCGM is not installed)"}
    try:
        code, out, err = run_command([exe, "diag", "-r", "1"], timeout=DCGM_TIMEOUT_S)
    except (OSError, CommandTimeout) as exc:
        return {"status": "error", "error": f"dcgmi diag -r 1: {exc}"}
    tests = parse_dcgm_diag(out)
    if not tests:
        said = (out.strip() + "\n" + err.strip()).strip() or f"exit code {code}"
        return {"status": "error", "error": "dcgmi diag -r 1: " + said[-DCGM_OUTPUT_TAIL:], "exit_code": code}
    return {"status": "ok", "exit_code": code, "tests": tests}


# ---------------------------------------------------------------- entry points

def collect(deep_python: Optional[str] = None, env_python: Optional[str] = None, dcgm: bool = False) -> Facts:
    """All facts of this machine (docs/architecture.md, "Probe facts").

    `env_python` (or `deep_python`) adds that interpreter's site-packages to
    the libnccl search; `deep_python` also imports torch with it; `dcgm` runs
    DCGM's quick diagnostic.
    """
    site_python = env_python or deep_python
    gpu = guarded(probe_gpu)
    return {
        "probe_version": PROBE_VERSION,
        "hostname": os.uname().nodename,
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "os": guarded(probe_os),
        "gpu": gpu,
        "topo": guarded(probe_topo, gpu),
        "nvlink": guarded(probe_nvlink),
        "xid": guarded(probe_xid),
        "nccl": guarded(probe_nccl, site_python),
        "rdma": guarded(probe_rdma),
        "net": guarded(probe_net),
        "route": guarded(probe_route),
        "peermem": guarded(probe_peermem),
        "memlock": guarded(probe_memlock),
        "verbs": guarded(probe_verbs),
        "iommu": guarded(probe_iommu),
        "torch": guarded(probe_torch, deep_python),
        "dcgm": guarded(probe_dcgm, dcgm),
    }


def parse_args(argv: List[str]) -> Dict[str, Optional[str]]:
    """{"deep": ..., "python": ..., "dcgm": "1" or None} of `--deep PYTHON --python PYTHON
    --dcgm` (the values also spelled `--opt=VALUE`); anything else (--help, a typo) goes
    to argparse, for its help text and its errors, which only then is imported."""
    options = {"deep": None, "python": None, "dcgm": None}  # type: Dict[str, Optional[str]]
    rest = list(argv)
    while rest:
        if rest[0] == "--dcgm":
            options["dcgm"] = "1"
            rest.pop(0)
            continue
        name, sep, value = rest.pop(0).partition("=")
        key = name[2:] if name.startswith("--") else ""
        if not sep:
            value = rest.pop(0) if rest else "-"
        if key not in ("deep", "python") or value.startswith("-"):
            return full_parse_args(argv)
        options[key] = value
    return options


def full_parse_args(argv: List[str]) -> Dict[str, Optional[str]]:
    import argparse

    parser = argparse.ArgumentParser(prog="clusterkit-probe", description="clusterkit node probe: prints this node's facts as JSON")
    parser.add_argument("--deep", metavar="PYTHON", help="also import torch with this interpreter")
    parser.add_argument("--python", metavar="PYTHON", help="also search this interpreter's site-packages for libnccl")
    parser.add_argument("--dcgm", action="store_const", const="1", help="also run `dcgmi diag -r 1` where DCGM is installed")
    return vars(parser.parse_args(argv))


def main(argv: Optional[List[str]] = None) -> int:
    """`python3 - [--python PYTHON] [--deep PYTHON]`: print the facts as one JSON line."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(json.dumps(collect(args["deep"], args["python"], bool(args.get("dcgm"))), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
