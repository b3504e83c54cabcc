"""nccl.library (libnccl on the node vs expect.nccl) and nccl.torch (--deep)."""
from __future__ import annotations

from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    failed,
    passed,
    plural,
    section,
    section_problem,
    settings,
    warned,
)

INSTALL_FIX = ("install NCCL where the job finds it: `pip install nvidia-nccl-cu12` (or -cu13) in "
               "environment.python's environment, or the distribution's libnccl2 package")


def version_misses(version: str, spec: str) -> str | None:
    """Why `version` does not satisfy the PEP 440 `spec`, or None when it does."""
    try:
        specifier = SpecifierSet(spec)
    except InvalidSpecifier:
        return f"expect.nccl {spec!r} is not a PEP 440 specifier (write e.g. '>=2.18')"
    try:
        if specifier.contains(Version(version), prereleases=True):
            return None
    except InvalidVersion:
        return f"NCCL version {version!r} cannot be compared"
    return f"does not satisfy expect.nccl {spec}"


def check_library(facts: Facts, spec: str) -> Finding:
    """nccl.library: a loadable libnccl whose version satisfies expect.nccl."""
    problem = section_problem(facts, "nccl")
    nccl = section(facts, "nccl")
    if problem is not None:
        fix = INSTALL_FIX if nccl.get("status") == "absent" else (
            "check the library's dependencies with `ldd` and that it matches the CPU architecture")
        return failed("nccl.library", problem, fix)
    version, path = str(nccl.get("version")), nccl.get("path")
    miss = version_misses(version, spec)
    if miss is None:
        return passed("nccl.library", f"libnccl {version} ({path}) satisfies {spec}")
    if miss.startswith("expect.nccl"):
        return failed("nccl.library", miss, "fix expect.nccl in the profile, e.g. nccl: '>=2.18'")
    return failed("nccl.library", f"libnccl {version} ({path}) {miss}",
                  f"install a matching NCCL: `pip install 'nvidia-nccl-cu12{spec}'` in environment.python's "
                  "environment (torch loads the pip wheel first), or update the system libnccl2")


def torch_problems(torch: Any, expect: Any) -> list[str]:
    """What keeps this torch from running NCCL DDP on this node's GPUs."""
    problems = []
    if not torch.get("cuda"):
        problems.append(f"torch {torch.get('version')} is a CPU-only build (torch.version.cuda is None)")
    elif torch.get("cuda_available") is False:
        problems.append(f"torch.cuda.is_available() is False (torch built for CUDA {torch.get('cuda')})")
    if torch.get("distributed_nccl") is False:
        problems.append("torch.distributed has no NCCL backend")
    spec = expect.get("nccl")
    if spec and torch.get("nccl"):
        miss = version_misses(str(torch["nccl"]), str(spec))
        if miss:
            problems.append(f"torch's NCCL {torch['nccl']} {miss}")
    return problems


def torch_fix(torch: Any) -> str:
    """The fix for torch_problems: the build, or the driver it needs."""
    if not torch.get("cuda"):
        return ("install a CUDA build of torch in environment.python's environment "
                "(pip install torch --index-url https://download.pytorch.org/whl/cu124)")
    if torch.get("cuda_available") is False:
        return ("the driver is older than torch's CUDA needs, or no GPU is visible: compare the "
                "driver's CUDA version (nvidia-smi) with torch.version.cuda")
    return "install a torch/NCCL build that matches expect.nccl"


def import_fix(facts: Facts, environment: Any) -> str:
    """What to do when environment.python cannot import torch, naming the python and the
    setup lines: inside a job (the probe saw SLURMD_NODENAME) they ran before it; over
    SSH they did not, so a python that needs them must be given by its full path."""
    python = environment.get("python") or "python3"
    setup = [str(line) for line in environment.get("setup") or []]
    lines = "; ".join(f"`{line}`" for line in setup)
    install = f"or install torch for {python}"
    if facts.get("slurm_node"):
        ran = f"after its environment.setup lines ({lines})" if setup else "with no environment.setup lines"
        return (f"the job ran {python} {ran}: set environment.python to the interpreter that has torch "
                f"(a full path, e.g. /opt/venvs/train/bin/python), fix the setup lines so that {python} "
                f"finds it, {install} (a job file may set its own environment:)")
    skipped = f" without environment.setup ({lines})" if setup else ""
    return (f"preflight runs {python} over SSH{skipped}: set environment.python to the full path of the "
            f"interpreter that has torch (e.g. /opt/venvs/train/bin/python), {install}")


def check_torch(facts: Facts, profile: Profile) -> Finding:
    """nccl.torch: environment.python imports torch, and (unless expect.torch_cuda is false)
    torch has CUDA and NCCL."""
    torch = section(facts, "torch")
    environment = settings(profile, "environment")
    python = environment.get("python") or "python3"
    if torch.get("status") == "skipped":
        return warned("nccl.torch", "the probe did not import torch (it ran without --deep)",
                      "run preflight with --deep")
    problem = section_problem(facts, "torch")
    if problem is not None:
        return failed("nccl.torch", f"environment.python ({python}) cannot import torch: {problem}",
                      import_fix(facts, environment))
    if settings(profile, "expect").get("torch_cuda") is False:
        return passed("nccl.torch", f"torch {torch.get('version')} imports with {python} "
                      "(expect.torch_cuda: false, so CUDA and NCCL are not required)")
    problems = torch_problems(torch, settings(profile, "expect"))
    if problems:
        return failed("nccl.torch", "; ".join(problems), torch_fix(torch))
    return passed("nccl.torch", f"torch {torch.get('version')} (CUDA {torch.get('cuda')}, NCCL {torch.get('nccl')}) "
                  f"sees {plural(int(torch.get('device_count') or 0), 'GPU')}")


def check(facts: Facts, profile: Profile, deep: bool = False) -> list[Finding]:
    """nccl.library when expect.nccl is set; nccl.torch with --deep."""
    expect = settings(profile, "expect")
    findings = []
    if expect.get("nccl"):
        findings.append(check_library(facts, str(expect["nccl"])))
    if deep:
        findings.append(check_torch(facts, profile))
    return findings
