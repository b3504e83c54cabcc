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
import argparse
import csv
import ctypes
import glob
import io
import json
import os
import platform
import re
import resource
import shutil
import signal
import site
import socket
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

PROBE_VERSION = 1
ROOT_ENV = "CLUSTERKIT_PROBE_ROOT"
COMMAND_TIMEOUT_S = 15
DEEP_TIMEOUT_S = 60
GPU_QUERY_FIELDS = ("index", "name", "uuid", "driver_version", "memory.total", "pci.bus_id")
NCCL_SYSTEM_DIRS = (
    "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
    "/usr/local/lib", "/usr/local/lib64", "/usr/local/cuda/lib64", "/usr/local/nccl/lib",
    "/opt/nccl/lib",
)
PORT_ATTRS = ("state", "phys_state", "rate", "link_layer", "lid", "sm_lid")
HCA_ATTRS = ("fw_ver", "node_guid", "sys_image_guid", "board_id", "hca_type", "node_type")
NET_ATTRS = ("operstate", "carrier", "mtu", "address", "speed", "type")
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
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
    return {"status": "ok", "kernel": platform.release(), "arch": platform.machine(),
            "os_release": release.get("PRETTY_NAME") or release.get("NAME"),
            "os_id": release.get("ID"), "os_version_id": release.get("VERSION_ID"),
            "python": platform.python_version(), "python_executable": sys.executable}


# ---------------------------------------------------------------- gpu

def parse_gpu_csv(text: str) -> List[Dict[str, str]]:
    """GPUs from `nvidia-smi --query-gpu=<GPU_QUERY_FIELDS> --format=csv,noheader`."""
    keys = [field.replace(".", "_") for field in GPU_QUERY_FIELDS]
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
    """GPUs, driver and CUDA version as nvidia-smi reports them."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"status": "absent", "error": "nvidia-smi not found on PATH"}
    query = ["--query-gpu=" + ",".join(GPU_QUERY_FIELDS), "--format=csv,noheader"]
    try:
        code, out, err = run_command([exe] + query)
    except CommandTimeout as exc:
        return {"status": "error", "error": f"nvidia-smi hangs: {exc}"}
    if code != 0:
        return nvidia_smi_error(code, out, err)
    gpus = parse_gpu_csv(out)
    return {"status": "ok", "driver": gpus[0]["driver_version"] if gpus else None,
            "cuda": probe_cuda_version(exe), "gpus": gpus}


def probe_cuda_version(exe: str) -> Optional[str]:
    """CUDA version from the plain `nvidia-smi` banner; None when it has none."""
    try:
        code, out, _ = run_command([exe])
    except (OSError, CommandTimeout):
        return None
    return parse_cuda_version(out) if code == 0 else None


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


def python_site_dirs(python: str) -> List[str]:
    """site-packages directories of another interpreter (environment.python)."""
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
    for ldconfig in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        exe = shutil.which(ldconfig) or (ldconfig if os.path.isfile(ldconfig) else None)
        if exe is None:
            continue
        try:
            _code, out, _ = run_command([exe, "-p"])
        except (OSError, CommandTimeout):
            continue
        return [line.split("=>", 1)[1].strip() for line in out.splitlines()
                if library in line and "=>" in line]
    return []


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
    return port


def read_hca(hca_dir: str) -> Facts:
    """One HCA: firmware, GUIDs, board, its netdevs and its ports."""
    hca = read_attrs(hca_dir, HCA_ATTRS)  # type: Facts
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


# ---------------------------------------------------------------- net, limits, iommu

def probe_net() -> Facts:
    """Network interfaces from /sys/class/net: operstate, carrier, mtu, MAC, speed."""
    base = host_path("/sys/class/net")
    if not os.path.isdir(base):
        return {"status": "absent", "error": "/sys/class/net does not exist", "interfaces": {}}
    return {"status": "ok", "interfaces": {name: read_attrs(os.path.join(base, name), NET_ATTRS)
                                           for name in list_dir(base)
                                           if os.path.isdir(os.path.join(base, name))}}


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


# ---------------------------------------------------------------- entry points

def collect(deep_python: Optional[str] = None, env_python: Optional[str] = None) -> Facts:
    """All facts of this machine (docs/architecture.md, "Probe facts").

    `env_python` (or `deep_python`) adds that interpreter's site-packages to
    the libnccl search; `deep_python` also imports torch with it.
    """
    site_python = env_python or deep_python
    return {
        "probe_version": PROBE_VERSION,
        "hostname": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "os": guarded(probe_os),
        "gpu": guarded(probe_gpu),
        "nccl": guarded(probe_nccl, site_python),
        "rdma": guarded(probe_rdma),
        "net": guarded(probe_net),
        "peermem": guarded(probe_peermem),
        "memlock": guarded(probe_memlock),
        "verbs": guarded(probe_verbs),
        "iommu": guarded(probe_iommu),
        "torch": guarded(probe_torch, deep_python),
    }


def main(argv: Optional[List[str]] = None) -> int:
    """`python3 - [--python PYTHON] [--deep PYTHON]`: print the facts as one JSON line."""
    parser = argparse.ArgumentParser(prog="clusterkit-probe", description="clusterkit node probe: prints this node's facts as JSON")
    parser.add_argument("--deep", metavar="PYTHON", help="also import torch with this interpreter")
    parser.add_argument("--python", metavar="PYTHON", help="also search this interpreter's site-packages for libnccl")
    args = parser.parse_args(argv)
    sys.stdout.write(json.dumps(collect(args.deep, args.python), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
