"""nccl.library and nccl.torch, whole findings (message and fix) for each way they fail."""
from __future__ import annotations

from typing import Any

from cluster_kit.checks import Finding, evaluate, nccl
from cluster_kit.checks.nccl import INSTALL_FIX

LDD_FIX = "check the library's dependencies with `ldd` and that it matches the CPU architecture"
CUDA_BUILD_FIX = ("install a CUDA build of torch in environment.python's environment "
                  "(pip install torch --index-url https://download.pytorch.org/whl/cu124)")
DRIVER_FIX = ("the driver is older than torch's CUDA needs, or no GPU is visible: compare the "
              "driver's CUDA version (nvidia-smi) with torch.version.cuda")
TORCH = {"status": "ok", "version": "2.3.0", "cuda": "12.1", "cuda_available": True,
         "distributed_nccl": True, "nccl": "2.20.5", "device_count": 8}


def library(nccl_facts: dict[str, Any] | None, spec: str = ">=2.18") -> Finding:
    return nccl.check_library({} if nccl_facts is None else {"nccl": nccl_facts}, spec)


def test_library_absent_error_and_missing() -> None:
    assert library({"status": "absent", "error": "no libnccl.so.2 on the loader's path"}) == Finding(
        "nccl.library", "fail", "no libnccl.so.2 on the loader's path", INSTALL_FIX)
    assert library({"status": "error", "error": "libnccl.so.2: wrong ELF class"}) == Finding(
        "nccl.library", "fail", "libnccl.so.2: wrong ELF class", LDD_FIX)
    assert library(None) == Finding("nccl.library", "fail",
                                    "the probe sent no 'nccl' facts (an older or broken probe)", LDD_FIX)
    assert INSTALL_FIX == ("install NCCL where the job finds it: `pip install nvidia-nccl-cu12` (or -cu13) in "
                           "environment.python's environment, or the distribution's libnccl2 package")


def test_library_pass_and_old_version() -> None:
    ok = {"status": "ok", "version": "2.21.5", "path": "/usr/lib/libnccl.so.2"}
    assert library(ok) == Finding("nccl.library", "pass", "libnccl 2.21.5 (/usr/lib/libnccl.so.2) satisfies >=2.18")
    assert library({**ok, "version": "2.17.1"}) == Finding(
        "nccl.library", "fail", "libnccl 2.17.1 (/usr/lib/libnccl.so.2) does not satisfy expect.nccl >=2.18",
        "install a matching NCCL: `pip install 'nvidia-nccl-cu12>=2.18'` in environment.python's "
        "environment (torch loads the pip wheel first), or update the system libnccl2")


def test_a_prerelease_nccl_is_compared_as_a_version() -> None:
    assert nccl.version_misses("2.19.0a1", ">=2.18") is None
    assert nccl.version_misses("2.17.1", ">=2.18") == "does not satisfy expect.nccl >=2.18"
    assert nccl.version_misses("two", ">=2.18") == "NCCL version 'two' cannot be compared"
    assert nccl.version_misses("2.18", "at least 2.18") == (
        "expect.nccl 'at least 2.18' is not a PEP 440 specifier (write e.g. '>=2.18')")


def test_library_with_a_bad_specifier_tells_to_fix_the_profile() -> None:
    assert library({"status": "ok", "version": "2.21.5", "path": "/x"}, "2.18+") == Finding(
        "nccl.library", "fail", "expect.nccl '2.18+' is not a PEP 440 specifier (write e.g. '>=2.18')",
        "fix expect.nccl in the profile, e.g. nccl: '>=2.18'")


def torch_finding(torch: dict[str, Any] | None, profile: dict[str, Any] | None = None,
                  facts: dict[str, Any] | None = None) -> Finding:
    return nccl.check_torch({**(facts or {}), **({} if torch is None else {"torch": torch})}, profile or {})


def test_torch_skipped_without_deep() -> None:
    assert torch_finding({"status": "skipped"}) == Finding(
        "nccl.torch", "warn", "the probe did not import torch (it ran without --deep)", "run preflight with --deep")


def test_torch_passes_with_its_gpus_counted() -> None:
    assert torch_finding(TORCH, {"environment": {"python": "/opt/py"}}) == Finding(
        "nccl.torch", "pass", "torch 2.3.0 (CUDA 12.1, NCCL 2.20.5) sees 8 GPUs")
    assert torch_finding({**TORCH, "device_count": None}) == Finding(
        "nccl.torch", "pass", "torch 2.3.0 (CUDA 12.1, NCCL 2.20.5) sees 0 GPUs")


def test_a_cpu_only_torch_without_nccl_backend() -> None:
    cpu = {**TORCH, "cuda": None, "cuda_available": False, "distributed_nccl": False}
    assert torch_finding(cpu) == Finding(
        "nccl.torch", "fail", "torch 2.3.0 is a CPU-only build (torch.version.cuda is None); "
        "torch.distributed has no NCCL backend", CUDA_BUILD_FIX)


def test_a_cuda_torch_that_sees_no_gpu() -> None:
    assert torch_finding({**TORCH, "cuda_available": False}) == Finding(
        "nccl.torch", "fail", "torch.cuda.is_available() is False (torch built for CUDA 12.1)", DRIVER_FIX)
    # not reported: no problem of its own, and the CUDA fix is not given
    assert torch_finding({**TORCH, "cuda_available": None}).status == "pass"


def test_torchs_own_nccl_against_expect_nccl() -> None:
    assert torch_finding({**TORCH, "nccl": "2.17.1"}, {"expect": {"nccl": ">=2.18"}}) == Finding(
        "nccl.torch", "fail", "torch's NCCL 2.17.1 does not satisfy expect.nccl >=2.18",
        "install a torch/NCCL build that matches expect.nccl")
    assert torch_finding({**TORCH, "nccl": None}, {"expect": {"nccl": ">=2.18"}}).status == "pass"
    # a probe that could not tell whether CUDA is available: the fix is still the NCCL build
    assert torch_finding({**TORCH, "nccl": "2.17.1", "cuda_available": None}, {"expect": {"nccl": ">=2.18"}}).fix == (
        "install a torch/NCCL build that matches expect.nccl")


def test_expect_torch_cuda_false_needs_only_the_import() -> None:
    cpu = {**TORCH, "cuda": None}
    assert torch_finding(cpu, {"expect": {"torch_cuda": False}}) == Finding(
        "nccl.torch", "pass", "torch 2.3.0 imports with python3 (expect.torch_cuda: false, so CUDA and NCCL "
        "are not required)")


def test_torch_not_importable_over_ssh_names_the_python_and_the_setup_lines() -> None:
    profile = {"environment": {"python": "python", "setup": ["module load cuda", "source /opt/venv/bin/activate"]}}
    error = {"status": "error", "error": "ModuleNotFoundError: No module named 'torch'"}
    assert torch_finding(error, profile) == Finding(
        "nccl.torch", "fail", "environment.python (python) cannot import torch: "
        "ModuleNotFoundError: No module named 'torch'",
        "preflight runs python over SSH without environment.setup (`module load cuda`; "
        "`source /opt/venv/bin/activate`): set environment.python to the full path of the interpreter that has "
        "torch (e.g. /opt/venvs/train/bin/python), or install torch for python")
    assert torch_finding(error).fix == (
        "preflight runs python3 over SSH: set environment.python to the full path of the interpreter that has "
        "torch (e.g. /opt/venvs/train/bin/python), or install torch for python3")


def test_torch_not_importable_inside_a_job_says_the_setup_lines_ran() -> None:
    profile = {"environment": {"python": "python", "setup": ["module load cuda", "conda activate train"]}}
    error = {"status": "error", "error": "No module named 'torch'"}
    assert torch_finding(error, profile, {"slurm_node": "gpu-01"}).fix == (
        "the job ran python after its environment.setup lines (`module load cuda`; `conda activate train`): "
        "set environment.python to the interpreter that has torch (a full path, e.g. "
        "/opt/venvs/train/bin/python), fix the setup lines so that python finds it, or install torch for python "
        "(a job file may set its own environment:)")
    assert torch_finding(error, {}, {"slurm_node": "gpu-01"}).fix == (
        "the job ran python3 with no environment.setup lines: set environment.python to the interpreter that "
        "has torch (a full path, e.g. /opt/venvs/train/bin/python), fix the setup lines so that python3 finds "
        "it, or install torch for python3 (a job file may set its own environment:)")


def test_check_runs_library_on_expect_nccl_and_torch_on_deep() -> None:
    facts = {"nccl": {"status": "ok", "version": "2.21.5", "path": "/l"}, "torch": TORCH}
    profile = {"expect": {"nccl": ">=2.18"}}
    assert [f.id for f in nccl.check(facts, profile)] == ["nccl.library"]
    assert [f.id for f in nccl.check(facts, profile, True)] == ["nccl.library", "nccl.torch"]
    assert [f.id for f in nccl.check(facts, {}, True)] == ["nccl.torch"]
    assert [f.id for f in evaluate(facts, profile, deep=True)] == ["nccl.library", "nccl.torch"]
