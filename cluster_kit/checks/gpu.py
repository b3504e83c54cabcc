"""gpu.count, gpu.model, gpu.driver: what nvidia-smi reports against `expect`."""
from __future__ import annotations

from typing import Any

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    dotted,
    failed,
    passed,
    plural,
    section,
    section_problem,
    settings,
    warned,
)

DRIVER_DOWN_FIX = ("the NVIDIA driver is not loaded or does not match the running kernel: "
                   "check `dmesg | grep -i nvrm`, reload the nvidia modules or reboot; drain the node meanwhile")


def nvidia_smi_problem(facts: Facts, check_id: str) -> Finding | None:
    """A failing finding when nvidia-smi is missing or failed, else None."""
    problem = section_problem(facts, "gpu")
    if problem is None:
        return None
    if section(facts, "gpu").get("status") == "absent":
        return failed(check_id, problem, "install the NVIDIA driver (it ships nvidia-smi) or put "
                      "nvidia-smi on the PATH of non-interactive SSH sessions")
    fix = DRIVER_DOWN_FIX
    if "No devices were found" in problem:
        fix = "the driver sees no GPU: check `lspci | grep -i nvidia` and dmesg for Xid / fallen-off-the-bus errors"
    return failed(check_id, f"nvidia-smi failed: {problem}", fix)


def gpus(facts: Facts) -> list[dict[str, Any]]:
    """The GPUs nvidia-smi listed."""
    return [dict(gpu) for gpu in section(facts, "gpu").get("gpus") or []]


def check_count(facts: Facts, expected: Any) -> Finding:
    """gpu.count: GPUs seen by nvidia-smi == expect.gpus_per_node."""
    problem = nvidia_smi_problem(facts, "gpu.count")
    if problem:
        return problem
    seen = len(gpus(facts))
    if seen == int(expected):
        return passed("gpu.count", f"nvidia-smi sees {plural(seen, 'GPU')}")
    message = f"nvidia-smi sees {plural(seen, 'GPU')}, expected {expected} (expect.gpus_per_node)"
    if seen > int(expected):
        return failed("gpu.count", message,
                      f"the node has more GPUs than expect.gpus_per_node: if it is meant to have {seen}, "
                      f"set expect.gpus_per_node: {seen} in the profile; if it is meant to have {expected}, "
                      "this is another kind of node: keep it out of the profile's nodes (or slurm.constraint)")
    return failed("gpu.count", message,
                  "a GPU is missing or hidden: compare `nvidia-smi -L` with `lspci | grep -i nvidia`, look for "
                  "Xid / fallen-off-the-bus errors in dmesg; drain the node until it is fixed")


def check_model(facts: Facts, expected: str) -> Finding:
    """gpu.model: every GPU name contains expect.gpu_model (case-insensitive)."""
    problem = nvidia_smi_problem(facts, "gpu.model")
    if problem:
        return problem
    names = sorted({gpu.get("name", "") for gpu in gpus(facts)})
    wrong = [name for name in names if expected.lower() not in name.lower()]
    if not names:
        return failed("gpu.model", f"nvidia-smi lists no GPU, expected {expected}", DRIVER_DOWN_FIX)
    if not wrong:
        return passed("gpu.model", f"GPUs are {', '.join(names)}")
    return failed("gpu.model", f"GPUs are {', '.join(wrong)}, expected a name containing {expected!r} "
                  "(expect.gpu_model)", "this node has other GPUs: select the right nodes (slurm.constraint, "
                  "partition or nodes) or change expect.gpu_model")


def check_driver(facts: Facts, minimum: Any) -> Finding:
    """gpu.driver: driver >= expect.min_driver, compared as dotted numbers."""
    problem = nvidia_smi_problem(facts, "gpu.driver")
    if problem:
        return problem
    driver = section(facts, "gpu").get("driver")
    try:
        too_old = dotted(driver) < dotted(minimum)
    except ValueError:
        return warned("gpu.driver", f"cannot compare driver {driver!r} with expect.min_driver {minimum}",
                      "run `nvidia-smi --query-gpu=driver_version --format=csv` on the node")
    if too_old:
        return failed("gpu.driver", f"driver {driver} is older than expect.min_driver {minimum}",
                      f"upgrade the NVIDIA driver on this node to >= {minimum} (or lower expect.min_driver)")
    return passed("gpu.driver", f"driver {driver} >= {minimum}")


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """The gpu.* checks whose `expect` key is set."""
    expect = settings(profile, "expect")
    findings = []
    if expect.get("gpus_per_node") is not None:
        findings.append(check_count(facts, expect["gpus_per_node"]))
    if expect.get("gpu_model"):
        findings.append(check_model(facts, str(expect["gpu_model"])))
    if expect.get("min_driver") is not None:
        findings.append(check_driver(facts, expect["min_driver"]))
    return findings
