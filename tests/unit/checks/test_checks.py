"""Every check id, pass and fail, on facts the real probe printed for fake nodes.

The facts come from tests/data/facts/ (written by tests/unit/test_probe.py from
sysfs trees laid out as the kernel does); a few variations (an old NCCL, a
CPU-only torch, a low memlock) are edits of those facts.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.checks import Finding, evaluate, node_status
from cluster_kit.checks.net import parse_ifname
from cluster_kit.checks.rdma import gid_address, rate_gbps
from cluster_kit.checks.system import parse_kib

FACTS_DIR = Path(__file__).resolve().parents[2] / "data" / "facts"
IB_HCAS = [f"mlx5_{n}:1" for n in range(8)]

IB_PROFILE: dict[str, Any] = {
    "name": "ib-ndr",
    "network": {"fabric": "infiniband", "ib_hca": IB_HCAS, "socket_ifname": "eth0"},
    "environment": {"python": "/opt/venvs/train/bin/python"},
    "expect": {"gpus_per_node": 8, "gpu_model": "H100", "min_driver": "535.104", "nccl": ">=2.18",
               "ib_rate_gbps": 400, "peermem": True, "memlock": "unlimited"},
}
ROCE_PROFILE: dict[str, Any] = {
    "name": "roce-v2",
    "network": {"fabric": "roce", "ib_hca": ["mlx5_0:1", "mlx5_1:1"], "gid_index": 3, "socket_ifname": "eth0"},
    "expect": {"gpus_per_node": 8, "gpu_model": "H100", "nccl": ">=2.18", "ib_rate_gbps": 400,
               "peermem": True, "memlock": "unlimited"},
}


def load(name: str) -> dict[str, Any]:
    """The committed probe facts of one fake node."""
    return dict(json.loads((FACTS_DIR / f"{name}.json").read_text()))


def with_settings(profile: dict[str, Any], **changes: dict[str, Any]) -> dict[str, Any]:
    """A copy of `profile` with some network/expect keys replaced (None deletes)."""
    result = copy.deepcopy(profile)
    for key, values in changes.items():
        for name, value in values.items():
            if value is None:
                result[key].pop(name, None)
            else:
                result[key][name] = value
    return result


def finding(facts: dict[str, Any], profile: dict[str, Any], check_id: str, deep: bool = False) -> Finding:
    """The one finding with `check_id`."""
    found = [f for f in evaluate(facts, profile, deep=deep) if f.id == check_id]
    assert len(found) == 1, [f.id for f in evaluate(facts, profile, deep=deep)]
    return found[0]


# ---------------------------------------------------------------- whole nodes

@pytest.mark.parametrize(("name", "profile"), [("ib-ok", IB_PROFILE), ("roce-ok", ROCE_PROFILE)])
def test_healthy_nodes_pass_every_configured_check(name: str, profile: dict[str, Any]) -> None:
    findings = evaluate(load(name), profile)
    assert [f for f in findings if f.status != "pass"] == []
    assert node_status(findings) == "pass"
    assert {f.id for f in findings} >= {"gpu.count", "gpu.model", "nccl.library", "rdma.hca_present",
                                        "rdma.port_state", "rdma.link_rate", "rdma.link_layer",
                                        "rdma.peermem", "net.socket_ifname", "sys.memlock"}


def test_every_failure_carries_a_fix() -> None:
    for name in ("ib-portdown", "ib-nohca", "ib-nopeermem", "no-rdma", "smi-fail", "smi-missing", "ib-slow"):
        for f in evaluate(load(name), IB_PROFILE):
            assert f.status in ("pass", "warn", "fail")
            assert (f.status == "pass") == (f.fix == ""), f


def test_only_configured_checks_run() -> None:
    assert evaluate(load("ib-portdown"), {"name": "empty"}) == []
    bare = {"network": {"fabric": "infiniband"}}
    assert [f.id for f in evaluate(load("ib-ok"), bare)] == ["rdma.hca_present", "rdma.port_state",
                                                            "rdma.link_layer", "rdma.port_errors",
                                                            "rdma.nic_pcie", "topo.gpu_nic"]


def test_fabric_ethernet_skips_every_rdma_check() -> None:
    profile = with_settings(IB_PROFILE, network={"fabric": "ethernet"})
    ids = [f.id for f in evaluate(load("no-rdma"), profile)]
    assert not [i for i in ids if i.startswith("rdma.")]
    assert "net.socket_ifname" in ids


def test_node_status_is_the_worst() -> None:
    assert node_status([]) == "pass"
    assert node_status([Finding("a", "pass", ""), Finding("b", "warn", "", "x")]) == "warn"
    assert node_status([Finding("a", "fail", "", "x"), Finding("b", "warn", "", "x")]) == "fail"


# ---------------------------------------------------------------- gpu

def test_gpu_count_fails_with_the_number_seen() -> None:
    f = finding(load("no-rdma"), IB_PROFILE, "gpu.count")
    assert (f.status, f.message) == ("fail", "nvidia-smi sees 7 GPUs, expected 8 (expect.gpus_per_node)")
    assert "nvidia-smi -L" in f.fix
    assert finding(load("ib-ok"), IB_PROFILE, "gpu.count").message == "nvidia-smi sees 8 GPUs"


def test_more_gpus_than_expected_points_at_the_profile_not_a_lost_gpu() -> None:
    profile = with_settings(IB_PROFILE, expect={"gpus_per_node": 4})
    f = finding(load("ib-ok"), profile, "gpu.count")
    assert (f.status, f.message) == ("fail", "nvidia-smi sees 8 GPUs, expected 4 (expect.gpus_per_node)")
    assert "missing or hidden" not in f.fix
    assert f.fix.startswith("the node has more GPUs than expect.gpus_per_node: ")
    assert "set expect.gpus_per_node: 8 in the profile" in f.fix


def test_gpu_model_substring() -> None:
    assert finding(load("ib-ok"), IB_PROFILE, "gpu.model").status == "pass"
    f = finding(load("ib-ok"), with_settings(IB_PROFILE, expect={"gpu_model": "A100"}), "gpu.model")
    assert f.status == "fail"
    assert f.message == "GPUs are NVIDIA H100 80GB HBM3, expected a name containing 'A100' (expect.gpu_model)"
    assert "slurm.constraint" in f.fix


def test_gpu_driver_compares_numerically() -> None:
    old = load("no-rdma")  # driver 535.104.05
    assert finding(old, IB_PROFILE, "gpu.driver").status == "pass"       # 104 > 9, not "104" < "9"
    strict = with_settings(IB_PROFILE, expect={"min_driver": "535.129"})
    f = finding(old, strict, "gpu.driver")
    assert (f.status, f.message) == ("fail", "driver 535.104.05 is older than expect.min_driver 535.129")
    assert f.fix.startswith("upgrade the NVIDIA driver on this node to >= 535.129")
    newer = with_settings(IB_PROFILE, expect={"min_driver": "535.9"})
    assert finding(old, newer, "gpu.driver").status == "pass"


def test_nvidia_smi_failing_is_a_failure_with_its_text() -> None:
    f = finding(load("smi-fail"), IB_PROFILE, "gpu.count")
    assert f.status == "fail"
    assert f.message.startswith("nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate")
    assert "dmesg | grep -i nvrm" in f.fix


def test_nvidia_smi_missing_is_a_failure_not_a_crash() -> None:
    for check_id in ("gpu.count", "gpu.model", "gpu.driver"):
        f = finding(load("smi-missing"), IB_PROFILE, check_id)
        assert (f.status, f.message) == ("fail", "nvidia-smi not found on PATH")


def test_gpu_count_fixes_written_out() -> None:
    few = finding(load("no-rdma"), IB_PROFILE, "gpu.count")
    assert few.fix == ("a GPU is missing or hidden: compare `nvidia-smi -L` with `lspci | grep -i nvidia`, look for "
                       "Xid / fallen-off-the-bus errors in dmesg; drain the node until it is fixed")
    many = finding(load("ib-ok"), with_settings(IB_PROFILE, expect={"gpus_per_node": 4}), "gpu.count")
    assert many.fix == ("the node has more GPUs than expect.gpus_per_node: if it is meant to have 8, set "
                        "expect.gpus_per_node: 8 in the profile; if it is meant to have 4, this is another kind "
                        "of node: keep it out of the profile's nodes (or slurm.constraint)")


def test_gpu_model_names_every_distinct_model_and_an_empty_list_fails() -> None:
    mixed = load("ib-ok")
    mixed["gpu"]["gpus"][7]["name"] = "NVIDIA H100 PCIe"
    assert finding(mixed, IB_PROFILE, "gpu.model").message == "GPUs are NVIDIA H100 80GB HBM3, NVIDIA H100 PCIe"
    f = finding(mixed, with_settings(IB_PROFILE, expect={"gpu_model": "A100"}), "gpu.model")
    assert (f.message, f.fix) == (
        "GPUs are NVIDIA H100 80GB HBM3, NVIDIA H100 PCIe, expected a name containing 'A100' (expect.gpu_model)",
        ("this node has other GPUs: select the right nodes (slurm.constraint, partition or nodes) or change "
        "expect.gpu_model"))
    empty = load("ib-ok")
    empty["gpu"]["gpus"] = []
    f = finding(empty, IB_PROFILE, "gpu.model")
    assert (f.status, f.message, f.fix) == (
        "fail", "nvidia-smi lists no GPU, expected H100",
        ("the NVIDIA driver is not loaded or does not match the running kernel: check `dmesg | grep -i nvrm`, "
        "reload the nvidia modules or reboot; drain the node meanwhile"))


def test_gpu_driver_equal_to_the_minimum_passes_and_an_odd_version_warns() -> None:
    exact = with_settings(IB_PROFILE, expect={"min_driver": "535.104.05"})
    f = finding(load("no-rdma"), exact, "gpu.driver")
    assert (f.status, f.message) == ("pass", "driver 535.104.05 >= 535.104.05")
    odd = load("no-rdma")
    odd["gpu"]["driver"] = "[N/A]"
    f = finding(odd, IB_PROFILE, "gpu.driver")
    assert (f.id, f.status, f.message, f.fix) == (
        "gpu.driver", "warn", "cannot compare driver '[N/A]' with expect.min_driver 535.104",
        "run `nvidia-smi --query-gpu=driver_version --format=csv` on the node")


def test_nvidia_smi_missing_and_no_devices_fixes_written_out() -> None:
    assert finding(load("smi-missing"), IB_PROFILE, "gpu.count").fix == (
        "install the NVIDIA driver (it ships nvidia-smi) or put nvidia-smi on the PATH of non-interactive SSH "
        "sessions")
    none = load("smi-fail")
    none["gpu"] = {"status": "error", "exit_code": 6, "error": "No devices were found"}
    f = finding(none, IB_PROFILE, "gpu.count")
    assert (f.message, f.fix) == (
        "nvidia-smi failed: No devices were found",
        "the driver sees no GPU: check `lspci | grep -i nvidia` and dmesg for Xid / fallen-off-the-bus errors")


# ---------------------------------------------------------------- nccl

def test_nccl_library_satisfies_the_specifier() -> None:
    facts = load("ib-ok")
    f = finding(facts, IB_PROFILE, "nccl.library")
    assert f.status == "pass"
    assert f.message.startswith(f"libnccl {facts['nccl']['version']} (")


def test_nccl_library_too_old() -> None:
    facts = load("ib-ok")
    facts["nccl"].update(version="2.17.1", path="/usr/lib/x86_64-linux-gnu/libnccl.so.2")
    f = finding(facts, IB_PROFILE, "nccl.library")
    assert f.status == "fail"
    assert f.message == "libnccl 2.17.1 (/usr/lib/x86_64-linux-gnu/libnccl.so.2) does not satisfy expect.nccl >=2.18"
    assert "pip install 'nvidia-nccl-cu12>=2.18'" in f.fix


def test_nccl_library_missing() -> None:
    facts = load("ib-ok")
    facts["nccl"] = {"status": "absent", "error": "no libnccl.so found (torch, pip nvidia-nccl-cu*, ...)",
                     "candidates": [], "libraries": []}
    f = finding(facts, IB_PROFILE, "nccl.library")
    assert (f.status, f.message) == ("fail", "no libnccl.so found (torch, pip nvidia-nccl-cu*, ...)")
    assert "pip install nvidia-nccl-cu12" in f.fix


def test_nccl_library_bad_specifier_says_so() -> None:
    f = finding(load("ib-ok"), with_settings(IB_PROFILE, expect={"nccl": "2.18"}), "nccl.library")
    assert (f.status, f.message) == ("fail", "expect.nccl '2.18' is not a PEP 440 specifier (write e.g. '>=2.18')")


TORCH_OK = {"status": "ok", "version": "2.3.0+cu121", "cuda": "12.1", "cuda_available": True, "device_count": 8,
            "nccl": "2.20.5", "distributed_nccl": True, "python": "/opt/venvs/train/bin/python"}


def test_nccl_torch_runs_only_when_deep() -> None:
    facts = load("ib-ok")
    facts["torch"] = dict(TORCH_OK)
    assert "nccl.torch" not in {f.id for f in evaluate(facts, IB_PROFILE)}
    f = finding(facts, IB_PROFILE, "nccl.torch", deep=True)
    assert (f.status, f.message) == ("pass", "torch 2.3.0+cu121 (CUDA 12.1, NCCL 2.20.5) sees 8 GPUs")


def test_nccl_torch_cpu_build_fails() -> None:
    facts = load("ib-ok")
    facts["torch"] = dict(TORCH_OK, version="2.13.0+cpu", cuda=None, cuda_available=False, device_count=0,
                          nccl=None, distributed_nccl=False)
    f = finding(facts, IB_PROFILE, "nccl.torch", deep=True)
    assert f.status == "fail"
    assert f.message == ("torch 2.13.0+cpu is a CPU-only build (torch.version.cuda is None); "
                         "torch.distributed has no NCCL backend")
    assert "CUDA build of torch" in f.fix


def test_nccl_torch_import_error_fails() -> None:
    facts = load("ib-ok")
    facts["torch"] = {"status": "error", "error": "import torch failed: ModuleNotFoundError: No module named 'torch'"}
    f = finding(facts, IB_PROFILE, "nccl.torch", deep=True)
    assert f.status == "fail"
    assert f.message == ("environment.python (/opt/venvs/train/bin/python) cannot import torch: "
                         "import torch failed: ModuleNotFoundError: No module named 'torch'")


NO_TORCH = {"status": "error", "error": "import torch failed: ModuleNotFoundError: No module named 'torch'",
            "python": "python3"}
SETUP_PROFILE = with_settings(IB_PROFILE, environment={"python": "python3",
                                                      "setup": [". /opt/venvs/train/bin/activate"]})


def test_nccl_torch_in_a_job_names_the_python_and_the_setup_lines_it_ran() -> None:
    facts = load("ib-ok")
    facts.update(torch=dict(NO_TORCH), slurm_node="n1")  # the job's own probe (SLURMD_NODENAME)
    f = finding(facts, SETUP_PROFILE, "nccl.torch", deep=True)
    assert f.status == "fail" and f.message.startswith("environment.python (python3) cannot import torch: ")
    assert f.fix.startswith("the job ran python3 after its environment.setup lines "
                            "(`. /opt/venvs/train/bin/activate`): set environment.python to the interpreter")
    assert "install torch for python3" in f.fix and "environment:" in f.fix
    without = finding(facts, with_settings(SETUP_PROFILE, environment={"setup": None}), "nccl.torch", deep=True)
    assert without.fix.startswith("the job ran python3 with no environment.setup lines: ")


def test_nccl_torch_over_ssh_says_the_setup_lines_did_not_run() -> None:
    facts = load("ib-ok")
    facts["torch"] = dict(NO_TORCH)
    f = finding(facts, SETUP_PROFILE, "nccl.torch", deep=True)
    assert f.fix.startswith("preflight runs python3 over SSH without environment.setup "
                            "(`. /opt/venvs/train/bin/activate`): set environment.python to the full path")


def test_nccl_torch_without_cuda_passes_when_the_profile_says_so() -> None:
    facts = load("ib-ok")
    facts["torch"] = dict(TORCH_OK, version="2.13.0+cpu", cuda=None, cuda_available=False, device_count=0,
                          nccl=None, distributed_nccl=False)
    cpu = with_settings(IB_PROFILE, expect={"torch_cuda": False})
    f = finding(facts, cpu, "nccl.torch", deep=True)
    assert (f.status, f.message) == ("pass", ("torch 2.13.0+cpu imports with /opt/venvs/train/bin/python "
                                             "(expect.torch_cuda: false, so CUDA and NCCL are not required)"))
    facts["torch"] = dict(NO_TORCH)
    assert finding(facts, cpu, "nccl.torch", deep=True).status == "fail"  # it must still import


def test_nccl_torch_old_bundled_nccl_fails() -> None:
    facts = load("ib-ok")
    facts["torch"] = dict(TORCH_OK, nccl="2.14.3")
    f = finding(facts, IB_PROFILE, "nccl.torch", deep=True)
    assert (f.status, f.message) == ("fail", "torch's NCCL 2.14.3 does not satisfy expect.nccl >=2.18")


def test_nccl_torch_without_deep_facts_warns() -> None:
    f = finding(load("ib-ok"), IB_PROFILE, "nccl.torch", deep=True)
    assert (f.status, f.fix) == ("warn", "run preflight with --deep")


# ---------------------------------------------------------------- rdma

def test_port_down_polling() -> None:
    f = finding(load("ib-portdown"), IB_PROFILE, "rdma.port_state")
    assert (f.status, f.message) == ("fail", "mlx5_3 port 1 is DOWN (phys_state 2: Polling)")
    assert f.fix == ("mlx5_3:1 has no link partner: check the cable and the switch port "
                     "(`ibstat mlx5_3 1`, `mlxlink -d mlx5_3 -p 1`); or drop mlx5_3:1 from network.ib_hca, leaving network.ib_hca: "
                     "[mlx5_0:1, mlx5_1:1, mlx5_2:1, mlx5_4:1, mlx5_5:1, mlx5_6:1, mlx5_7:1] (the job then gets "
                     'NCCL_IB_HCA="=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1")')


def test_port_disabled_and_init_get_their_own_fix() -> None:
    disabled = finding(load("ib-disabled"), IB_PROFILE, "rdma.port_state")
    assert disabled.message == "mlx5_3 port 1 is DOWN (phys_state 3: Disabled)"
    assert disabled.fix.startswith("mlx5_3:1 is disabled: enable the port")
    init = finding(load("ib-init"), IB_PROFILE, "rdma.port_state")
    assert init.message == "mlx5_2 port 1 is INIT (phys_state 5: LinkUp)"
    assert "no subnet manager activated it" in init.fix


def test_port_state_passes_on_healthy_ports() -> None:
    f = finding(load("ib-ok"), IB_PROFILE, "rdma.port_state")
    assert (f.status, f.message) == ("pass", "8 ports ACTIVE / LinkUp: " + ", ".join(IB_HCAS))


def test_down_port_outside_ib_hca_is_ignored() -> None:
    profile = with_settings(IB_PROFILE, network={"ib_hca": ["mlx5_0:1", "mlx5_1:1"]})
    assert finding(load("ib-portdown"), profile, "rdma.port_state").status == "pass"


def test_without_ib_hca_a_down_port_only_warns_and_names_the_working_list() -> None:
    profile = with_settings(IB_PROFILE, network={"ib_hca": None})
    f = finding(load("ib-portdown"), profile, "rdma.port_state")
    assert f.status == "warn"
    assert f.fix.endswith("; or list only the working ports: network.ib_hca: "
                          "[mlx5_0:1, mlx5_1:1, mlx5_2:1, mlx5_4:1, mlx5_5:1, mlx5_6:1, mlx5_7:1]")
    assert finding(load("ib-ok"), profile, "rdma.hca_present").message.startswith("8 HCAs present: mlx5_0, ")


def test_missing_hca_lists_what_is_present_and_a_working_nccl_ib_hca() -> None:
    f = finding(load("ib-nohca"), IB_PROFILE, "rdma.hca_present")
    assert f.status == "fail"
    assert f.message == ("mlx5_3 of network.ib_hca is missing "
                         "(present: mlx5_0, mlx5_1, mlx5_2, mlx5_4, mlx5_5, mlx5_6, mlx5_7)")
    assert f.fix.endswith("; or use what is present: network.ib_hca: "
                          "[mlx5_0:1, mlx5_1:1, mlx5_2:1, mlx5_4:1, mlx5_5:1, mlx5_6:1, mlx5_7:1] (the job "
                          'then gets NCCL_IB_HCA="=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1")')
    assert "==" not in f.fix


def test_missing_port_of_a_present_hca() -> None:
    profile = with_settings(IB_PROFILE, network={"ib_hca": ["mlx5_0:1", "mlx5_0:2"]})
    f = finding(load("ib-ok"), profile, "rdma.hca_present")
    assert (f.status, f.message.split(" (")[0]) == ("fail", "mlx5_0:2 of network.ib_hca is missing")


def test_bare_hca_name_means_all_its_ports() -> None:
    profile = with_settings(IB_PROFILE, network={"ib_hca": ["mlx5_3"]})
    f = finding(load("ib-portdown"), profile, "rdma.port_state")
    assert (f.status, f.message) == ("fail", "mlx5_3 port 1 is DOWN (phys_state 2: Polling)")
    assert "drop" not in f.fix  # nothing left to use instead


def test_no_infiniband_at_all() -> None:
    facts = load("no-rdma")
    f = finding(facts, IB_PROFILE, "rdma.hca_present")
    assert f.status == "fail"
    assert f.message.startswith("no RDMA devices: /sys/class/infiniband does not exist")
    assert "network.fabric: ethernet" in f.fix
    ids = {x.id for x in evaluate(facts, IB_PROFILE)}
    assert "rdma.port_state" not in ids  # one root cause, one failure


def test_link_rate() -> None:
    assert finding(load("ib-ok"), IB_PROFILE, "rdma.link_rate").message == "8 ports at >= 400 Gb/sec"
    f = finding(load("ib-slow"), IB_PROFILE, "rdma.link_rate")
    assert (f.status, f.message) == ("fail", "mlx5_5 port 1 runs at 200 Gb/sec (4X HDR), below expect.ib_rate_gbps 400")
    assert "`mlxlink -d mlx5_5 -p 1`" in f.fix
    assert "drop mlx5_5:1 from network.ib_hca" in f.fix
    lower = with_settings(IB_PROFILE, expect={"ib_rate_gbps": 200})
    assert finding(load("ib-slow"), lower, "rdma.link_rate").status == "pass"


def with_rate(facts: dict[str, Any], hca: str, rate: str | None) -> dict[str, Any]:
    """A copy of `facts` where port 1 of `hca` reads `rate` (None: sysfs answered EINVAL)."""
    result = copy.deepcopy(facts)
    result["rdma"]["hcas"][hca]["ports"]["1"]["rate"] = rate
    return result


def test_an_unreadable_rate_is_not_taken_for_a_fast_one() -> None:
    """rate_show answers EINVAL for a width it cannot name; the probe records None."""
    facts = with_rate(load("ib-ok"), "mlx5_4", None)
    f = finding(facts, IB_PROFILE, "rdma.link_rate")
    assert (f.status, f.message) == ("fail", "mlx5_4 port 1 runs at an unreadable rate, below expect.ib_rate_gbps 400")
    assert "`mlxlink -d mlx5_4 -p 1`" in f.fix
    unlisted = finding(facts, with_settings(IB_PROFILE, network={"ib_hca": None}), "rdma.link_rate")
    assert (unlisted.status, unlisted.message.split(",")[0]) == ("warn", "mlx5_4 port 1 runs at an unreadable rate")


@pytest.mark.parametrize(("rate", "minimum", "status"), [
    ("2.5 Gb/sec (1X SDR)", 2.5, "pass"),     # the kernel's text for an unknown speed
    ("2.5 Gb/sec (1X SDR)", 10, "fail"),
    ("56 Gb/sec (4X FDR)", 56, "pass"),
    ("56 Gb/sec (4X FDR)", 100, "fail"),
    ("100 Gb/sec (4X EDR)", 200, "fail"),
    ("400 Gb/sec (4X NDR)", 400, "pass"),
    ("800 Gb/sec (4X XDR)", 400, "pass"),
])
def test_link_rate_compares_the_kernel_rate_text(rate: str, minimum: float, status: str) -> None:
    facts = with_rate(load("ib-ok"), "mlx5_2", rate)
    profile = with_settings(IB_PROFILE, expect={"ib_rate_gbps": minimum})
    assert finding(facts, profile, "rdma.link_rate").status == status


def test_link_rate_leaves_down_ports_to_port_state() -> None:
    assert finding(load("ib-portdown"), IB_PROFILE, "rdma.link_rate").message == "7 ports at >= 400 Gb/sec"


def test_link_layer_matches_fabric() -> None:
    assert finding(load("roce-ok"), ROCE_PROFILE, "rdma.link_layer").message == "2 ports on Ethernet"
    f = finding(load("roce-ok"), with_settings(ROCE_PROFILE, network={"fabric": "infiniband", "gid_index": None}),
                "rdma.link_layer")
    assert f.status == "fail"
    assert f.message.startswith("mlx5_0 port 1 link layer is Ethernet, but network.fabric is infiniband")
    assert f.fix.startswith("set network.fabric: roce")
    g = finding(load("ib-ok"), with_settings(IB_PROFILE, network={"fabric": "roce"}), "rdma.link_layer")
    assert g.message.startswith("mlx5_0 port 1 link layer is InfiniBand, but network.fabric is roce")


def test_gid_index_roce_v2_passes() -> None:
    f = finding(load("roce-ok"), ROCE_PROFILE, "rdma.gid_index")
    assert (f.status, f.message) == ("pass", "GID 3 is RoCE v2 on mlx5_0:1, mlx5_1:1")


def test_gid_index_v1_names_the_v2_index_with_an_ipv4_address() -> None:
    f = finding(load("roce-v1"), ROCE_PROFILE, "rdma.gid_index")
    assert f.status == "fail"
    assert f.message == ("mlx5_0 port 1 GID 3 is IB/RoCE v1, not RoCE v2; "
                         "mlx5_1 port 1 GID 3 is IB/RoCE v1, not RoCE v2")
    assert f.fix == "set network.gid_index: 2 (RoCE v2, IPv4 10.0.0.1 on ens1np0) / export NCCL_IB_GID_INDEX=2"


def test_gid_index_link_local_v2_is_not_recommended() -> None:
    profile = with_settings(ROCE_PROFILE, network={"gid_index": 2})
    f = finding(load("roce-ok"), profile, "rdma.gid_index")  # 2 is v1; 1 is v2 but link-local
    assert f.fix == "set network.gid_index: 3 (RoCE v2, IPv4 10.0.0.1 on ens1np0) / export NCCL_IB_GID_INDEX=3"


def test_gid_index_all_zero_and_missing() -> None:
    zero = finding(load("roce-ok"), with_settings(ROCE_PROFILE, network={"gid_index": 5}), "rdma.gid_index")
    assert zero.message.startswith("mlx5_0 port 1 GID 5 is all zero (no address)")
    missing = finding(load("roce-ok"), with_settings(ROCE_PROFILE, network={"gid_index": 42}), "rdma.gid_index")
    assert missing.message.startswith("mlx5_0 port 1 has no GID index 42")
    assert missing.fix.startswith("set network.gid_index: 3 (RoCE v2")


def test_gid_index_without_any_usable_v2_gid_says_to_add_an_address() -> None:
    facts = load("roce-v1")
    for hca in facts["rdma"]["hcas"].values():
        hca["ports"]["1"]["gid_types"] = {"0": "IB/RoCE v1", "1": "RoCE v2", "2": "IB/RoCE v1", "3": "IB/RoCE v1"}
    f = finding(facts, ROCE_PROFILE, "rdma.gid_index")
    assert "mlx5_0:1 has no RoCE v2 GID with an IPv4 or global address" in f.fix


def test_peermem() -> None:
    assert finding(load("ib-ok"), IB_PROFILE, "rdma.peermem").message == "nvidia_peermem is loaded"
    assert finding(load("roce-ok"), ROCE_PROFILE, "rdma.peermem").message == "nv_peer_mem is loaded"
    f = finding(load("ib-nopeermem"), IB_PROFILE, "rdma.peermem")
    assert f.status == "fail"
    assert f.message == "neither nvidia_peermem nor nv_peer_mem is loaded (no GPUDirect RDMA)"
    assert f.fix.startswith("sudo modprobe nvidia_peermem")


# ---------------------------------------------------------------- net

@pytest.mark.parametrize(("value", "status"), [
    ("eth0", "pass"), ("=eth0", "pass"), ("eth", "pass"), ("^docker,lo", "pass"), ("ib", "pass"),
    ("=eth", "fail"), ("eth9", "fail"), ("docker", "fail"), ("=docker0", "fail"), ("lo", "warn"),
    ("^eth,ib,docker", "warn"),
])
def test_socket_ifname_nccl_syntax(value: str, status: str) -> None:
    profile = with_settings(IB_PROFILE, network={"socket_ifname": value})
    assert finding(load("ib-ok"), profile, "net.socket_ifname").status == status


def test_socket_ifname_messages() -> None:
    missing = finding(load("ib-ok"), with_settings(IB_PROFILE, network={"socket_ifname": "bond0"}), "net.socket_ifname")
    assert missing.message == "network.socket_ifname 'bond0' matches no interface (interfaces: docker0, eth0, ib0, lo)"
    assert missing.fix == "set network.socket_ifname to an interface that is up: eth0, ib0"
    down = finding(load("ib-ok"), with_settings(IB_PROFILE, network={"socket_ifname": "docker0"}), "net.socket_ifname")
    assert down.message == ("network.socket_ifname 'docker0' matches only interfaces that are down: "
                            "docker0 (operstate down)")


def test_socket_ifname_prefix_that_also_matches_a_down_interface_warns() -> None:
    facts = load("ib-ok")
    facts["net"]["interfaces"]["eth1"] = {"operstate": "down", "carrier": None, "mtu": "1500",
                                          "address": "3c:ec:ef:10:20:31", "speed": None, "type": "1"}
    f = finding(facts, with_settings(IB_PROFILE, network={"socket_ifname": "eth"}), "net.socket_ifname")
    assert f.status == "warn"
    assert f.fix == "name the interface exactly: network.socket_ifname: =eth0"


def test_parse_ifname() -> None:
    spec = parse_ifname("^=docker0,lo")
    assert (spec.exclude, spec.exact, spec.names) == (True, True, ("docker0", "lo"))
    assert spec.matches("eth0") and not spec.matches("docker0") and spec.matches("docker01")


# ---------------------------------------------------------------- system

def test_memlock_unlimited_and_sizes() -> None:
    facts = load("ib-ok")
    assert finding(facts, IB_PROFILE, "sys.memlock").message == "RLIMIT_MEMLOCK is unlimited"
    facts["memlock"] = {"status": "ok", "soft_kib": "65536", "hard_kib": "65536"}
    f = finding(facts, IB_PROFILE, "sys.memlock")
    assert (f.status, f.message) == ("fail", "RLIMIT_MEMLOCK is 65536 KiB (64 MiB), expected unlimited (expect.memlock)")
    assert "LimitMEMLOCK=infinity" in f.fix
    for expected, status in (("64M", "pass"), ("65536", "pass"), (65536, "pass"), ("65537", "fail"), ("1G", "fail")):
        assert finding(facts, with_settings(IB_PROFILE, expect={"memlock": expected}), "sys.memlock").status == status


def test_parse_kib() -> None:
    assert parse_kib("8M") == 8192
    assert parse_kib("64G") == 64 * 1024 * 1024
    assert parse_kib("1024K") == 1024
    assert parse_kib("unlimited") == float("inf")
    with pytest.raises(ValueError):
        parse_kib("lots")


# ---------------------------------------------------------------- parsers

def test_rate_and_gid_parsers() -> None:
    assert rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    assert rate_gbps("") is None
    assert gid_address("0000:0000:0000:0000:0000:ffff:0a00:0001") == ("ipv4", "10.0.0.1")
    assert gid_address("fe80:0000:0000:0000:0a5c:2eff:fe00:4a10") == ("link-local", "fe80::a5c:2eff:fe00:4a10")
    assert gid_address("fd00:0000:0000:0000:0000:0000:0000:0001") == ("global", "fd00::1")
    assert gid_address("0000:0000:0000:0000:0000:0000:0000:0000") == ("zero", "")


def test_checks_never_crash_on_an_empty_document() -> None:
    findings = evaluate({}, IB_PROFILE, deep=True)
    assert {f.status for f in findings} == {"fail"}
    assert all(f.fix for f in findings)


def test_real_h200_machine_facts() -> None:
    """Facts the probe printed (with --deep) on a real H200 machine without InfiniBand."""
    facts = load("real-h200")
    profile = with_settings(IB_PROFILE, expect={"gpus_per_node": 1, "gpu_model": "H200"})
    assert finding(facts, profile, "gpu.count").message == "nvidia-smi sees 1 GPU"
    assert finding(facts, profile, "gpu.model").status == "pass"
    library = finding(facts, profile, "nccl.library")
    assert library.status == "pass" and "/site-packages/nvidia/nccl/lib/libnccl.so.2" in library.message
    assert finding(facts, profile, "nccl.torch", deep=True).message == (
        "torch 2.11.0+cu130 (CUDA 13.0, NCCL 2.28.9) sees 1 GPU")
    no_ib = finding(facts, profile, "rdma.hca_present")
    assert (no_ib.status, no_ib.message) == ("fail", "no RDMA device under /sys/class/infiniband")


# ---------------------------------------------------------------- whole findings, written out
# (survivors of scripts/mutation: docs/mutation.md)


def test_two_slow_ports_whole_finding() -> None:
    facts = with_rate(with_rate(load("ib-ok"), "mlx5_1", "200 Gb/sec (4X HDR)"), "mlx5_6", None)
    f = finding(facts, IB_PROFILE, "rdma.link_rate")
    assert f.status == "fail"
    assert f.message == ("mlx5_1 port 1 runs at 200 Gb/sec (4X HDR), below expect.ib_rate_gbps 400; "
                         "mlx5_6 port 1 runs at an unreadable rate, below expect.ib_rate_gbps 400")
    assert f.fix == (
        "a link that trained to a lower speed or width points to the cable, transceiver or switch port: "
        "`mlxlink -d mlx5_1 -p 1`, `mlxlink -d mlx5_6 -p 1`; reseat or replace the cable; or drop mlx5_1:1, "
        "mlx5_6:1 from network.ib_hca, leaving network.ib_hca: [mlx5_0:1, mlx5_2:1, mlx5_3:1, mlx5_4:1, mlx5_5:1, "
        'mlx5_7:1] (the job then gets NCCL_IB_HCA="=mlx5_0:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_7:1")')
    low = with_settings(IB_PROFILE, expect={"ib_rate_gbps": 1})  # unreadable is below any minimum
    assert finding(with_rate(load("ib-ok"), "mlx5_1", None), low, "rdma.link_rate").status == "fail"


def test_missing_listed_hcas_whole_finding() -> None:
    present = "mlx5_0, mlx5_1, mlx5_2, mlx5_4, mlx5_5, mlx5_6, mlx5_7"
    use = ("network.ib_hca: [mlx5_0:1, mlx5_1:1, mlx5_2:1, mlx5_4:1, mlx5_5:1, mlx5_6:1, mlx5_7:1] (the job then "
           'gets NCCL_IB_HCA="=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1")')
    fix = f"check the card and its driver (`lspci | grep -i mellanox`, `dmesg | grep mlx5`); or use what is present: {use}"
    one = finding(load("ib-nohca"), IB_PROFILE, "rdma.hca_present")
    assert (one.status, one.message, one.fix) == (
        "fail", f"mlx5_3 of network.ib_hca is missing (present: {present})", fix)
    # only missing HCAs listed: what works is taken from every HCA present
    two = finding(load("ib-nohca"), with_settings(IB_PROFILE, network={"ib_hca": ["mlx5_3", "mlx5_9"]}),
                  "rdma.hca_present")
    assert (two.message, two.fix) == (f"mlx5_3, mlx5_9 of network.ib_hca are missing (present: {present})", fix)
    none_up = copy.deepcopy(load("ib-nohca"))
    for hca in none_up["rdma"]["hcas"].values():
        hca["ports"]["1"]["state"] = "1: DOWN"
    down = finding(none_up, IB_PROFILE, "rdma.hca_present")
    assert down.fix == "check the card and its driver (`lspci | grep -i mellanox`, `dmesg | grep mlx5`)"


def without_counters(facts: dict[str, Any]) -> dict[str, Any]:
    """As an older kernel shows the ports: no counters/ folder."""
    result = copy.deepcopy(facts)
    for hca in result["rdma"]["hcas"].values():
        hca["ports"]["1"]["counters"] = {}
    return result


def test_port_errors_with_no_counters_at_the_threshold_and_unlisted() -> None:
    none = finding(without_counters(load("ib-ok")), IB_PROFILE, "rdma.port_errors")
    assert (none.status, none.message) == ("pass", "the kernel exposes no error counters for these ports")
    flap = load("ib-flap")  # mlx5_1: link_downed 37, link_error_recovery 112, symbol_error 4021
    at_limit = with_settings(IB_PROFILE, expect={"ib_error_thresholds": {
        "link_downed": 37, "link_error_recovery": 112, "symbol_error": 4021, "port_rcv_errors": None}})
    assert finding(flap, at_limit, "rdma.port_errors").status == "pass"  # equal is not over
    unlisted = finding(flap, with_settings(IB_PROFILE, network={"ib_hca": None}), "rdma.port_errors")
    assert (unlisted.status, unlisted.message) == (
        "warn", "mlx5_1 port 1: symbol_error 4021 (> 100), link_error_recovery 112 (> 10), link_downed 37 (> 5)")
    assert unlisted.fix.startswith("confirm on the node with `perfquery -x` (the port's LID) or "
                                   "`mlxlink -d mlx5_1 -p 1 -c`")


def test_ib_hca_as_nccls_string_and_bare_hca_names() -> None:
    as_string = with_settings(IB_PROFILE, network={"ib_hca": "=mlx5_0:1,mlx5_1"})
    assert finding(load("ib-ok"), as_string, "rdma.port_state").message == (
        "2 ports ACTIVE / LinkUp: mlx5_0:1, mlx5_1:1")
    bare = with_settings(IB_PROFILE, network={"ib_hca": ["mlx5_0", "mlx5_1"]})
    assert finding(load("ib-ok"), bare, "rdma.port_state").message == "2 ports ACTIVE / LinkUp: mlx5_0:1, mlx5_1:1"


def test_gid_addresses_at_their_edges() -> None:
    assert gid_address("fe80:0000:0000:0000:0000:ffff:0a00:0001")[0] == "link-local"  # not IPv4-mapped
    assert gid_address("fe81:0000:0000:0000:0000:0000:0000:0001")[0] == "link-local"  # fe80::/10
    assert gid_address("fe80:0000")[0] == "bad"


def test_peermem_that_cannot_be_read_is_named() -> None:
    facts = copy.deepcopy(load("ib-ok"))
    facts["peermem"] = {"status": "error", "error": "/proc/modules: Permission denied"}
    f = finding(facts, IB_PROFILE, "rdma.peermem")
    assert (f.id, f.status) == ("rdma.peermem", "fail")
    assert f.message.startswith("cannot tell whether nvidia_peermem is loaded: ")


def test_wrong_link_layer_for_roce_whole_finding() -> None:
    f = finding(load("ib-ok"), with_settings(IB_PROFILE, network={"fabric": "roce", "ib_hca": None}), "rdma.link_layer")
    assert f.status == "fail"
    assert f.fix == "set network.fabric: infiniband if that is this cluster's fabric"


def test_missing_listed_hca_offers_the_working_listed_ports_only() -> None:
    listed = with_settings(IB_PROFILE, network={"ib_hca": ["mlx5_0:1", "mlx5_1:1", "mlx5_3:1"]})
    f = finding(load("ib-nohca"), listed, "rdma.hca_present")
    assert f.fix.endswith('or use what is present: network.ib_hca: [mlx5_0:1, mlx5_1:1] '
                          '(the job then gets NCCL_IB_HCA="=mlx5_0:1,mlx5_1:1")')
