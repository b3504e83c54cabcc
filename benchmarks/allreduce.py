"""All-reduce sweep over this machine's GPUs, and nccl-tests beside it when it can be run.

    PYTHONPATH=. python3 benchmarks/allreduce.py [--log FILE] [--json FILE] [sweep options]

Runs ``torchrun --standalone --nproc-per-node=<GPUs> cluster_kit/node/allreduce_sweep.py``,
parses the job log like ``clusterkit bench allreduce`` does and prints the summary.
With one GPU the all-reduce has nobody to talk to: busbw is 0 by nccl-tests'
formula and algbw only measures NCCL's one-rank path; both are reported as they are.

nccl-tests is used only if it is already on this machine (``all_reduce_perf`` on the
PATH or in ``$NCCL_TESTS_DIR/build``); otherwise the script reports what a build
would need (nvcc, nccl.h, the nccl-tests source) and which of those are missing.
``benchmarks/nccl_tests.py`` takes the path of a built ``all_reduce_perf``, runs both
side by side and prints their ratios per size; its docstring says how to build it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from cluster_kit.report.allreduce import parse_sweep_log, parse_sweep_meta, summarise

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "cluster_kit" / "node" / "allreduce_sweep.py"


def gpu_count() -> int:
    """GPUs visible to torch (0 on a machine without CUDA)."""
    code = "import torch; print(torch.cuda.device_count())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return int(out.stdout.strip())


def sweep_argv(nproc: int, sweep_args: list[str]) -> list[str]:
    """The sweep under torchrun on this host, as a job's step runs it."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(SWEEP), *sweep_args]


def run_sweep(nproc: int, sweep_args: list[str], log_path: Path) -> tuple[int, str]:
    """Run the sweep under torchrun; returns (exit status, combined log text)."""
    cmd = sweep_argv(nproc, sweep_args)
    proc = subprocess.run(
        cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log_path.write_text(proc.stdout)
    return proc.returncode, proc.stdout


def find_nccl_headers() -> list[str]:
    """nccl.h files in the usual system places and in pip's nvidia-nccl wheels."""
    site = sysconfig.get_paths()["purelib"]
    patterns = [
        "/usr/include/nccl.h",
        "/usr/local/include/nccl.h",
        "/usr/local/cuda*/include/nccl.h",
        f"{site}/nvidia/nccl/include/nccl.h",
        f"{site}/nvidia/*/include/nccl.h",
    ]
    return sorted({p for pat in patterns for p in glob.glob(pat)})


def nccl_tests_status() -> dict[str, Any]:
    """Whether nccl-tests' all_reduce_perf can run here, and if not, why."""
    source = os.environ.get("NCCL_TESTS_DIR", "")
    binary = shutil.which("all_reduce_perf") or (
        f"{source}/build/all_reduce_perf"
        if source and os.path.exists(f"{source}/build/all_reduce_perf")
        else None
    )
    status: dict[str, Any] = {
        "all_reduce_perf": binary,
        "nvcc": shutil.which("nvcc")
        or next(iter(glob.glob("/usr/local/cuda*/bin/nvcc")), None),
        "nccl_headers": find_nccl_headers(),
        "source": source if source and os.path.isdir(source) else None,
    }
    missing = [k for k in ("nvcc", "nccl_headers", "source") if not status[k]]
    status["can_run"] = binary is not None
    status["why_not"] = (
        None
        if binary
        else (
            "no all_reduce_perf binary here and a build lacks: "
            + ", ".join(missing)
            + (
                " (the source cannot be downloaded: this machine has no network)"
                if "source" in missing
                else ""
            )
        )
    )
    return status


def run_nccl_tests(binary: str, nproc: int) -> str:
    """nccl-tests' all-reduce over the same range as the sweep (8 B to 4 GiB)."""
    cmd = [binary, "-b", "8", "-e", "4G", "-f", "2", "-g", str(nproc)]
    return subprocess.run(cmd, check=False, capture_output=True, text=True).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--log", default="allreduce_sweep.log", help="where the sweep's log goes"
    )
    parser.add_argument("--json", help="write the summary document here")
    parser.add_argument(
        "--expect-busbw", type=float, help="GB/s the large messages must reach"
    )
    args, sweep_args = parser.parse_known_args()
    nproc = max(gpu_count(), 1)
    status, text = run_sweep(nproc, sweep_args, Path(args.log))
    table, doc, passed = summarise(parse_sweep_log(text), args.expect_busbw)
    doc.update(meta=parse_sweep_meta(text), sweep_exit_status=status, nproc=nproc)
    doc["nccl_tests"] = nccl_tests_status()
    if doc["nccl_tests"]["can_run"]:
        doc["nccl_tests"]["output"] = run_nccl_tests(
            doc["nccl_tests"]["all_reduce_perf"], nproc
        )
    print(table)
    print("nccl-tests:", doc["nccl_tests"]["why_not"] or "ran, see the JSON document")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0 if passed and status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
