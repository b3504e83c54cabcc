"""Set-up of a compiled step, cold and warm: build_step(compile=True) against the whole-step torch.compile.

    PYTHONPATH=. python3 benchmarks/compile_setup.py [--only "small gpt d128,small gpt d1024"] [--json FILE]

Every figure comes from a process of its own (``benchmarks/ddp_step.py --repeats 0``,
one size, one way, fused AdamW), so no way finds another's compilations in memory:

* *cold*: Inductor's and Triton's caches in a new empty folder, as on a node's
  first start;
* *warm*: a second process with the same folders, as a job restarted on a node
  that ran it before (Inductor's FX-graph and AOTAutograd caches, Triton's
  kernels; dynamo still traces anew).

Set-up is ddp_step.py's: from building the step through its first 3 calls,
synchronized at both ends (build_step's compile, warm-up, trial and capture;
torch.compile's compiling and CUDA-graph recording). Not included: the process's
start and ``import torch``, the same for both. The ratio is compile's set-up over
build_step's (above 3: build_step's is under a third). In brackets, the part of
each set-up that dynamo and Inductor report as compiling (``ddp_step.py``'s
``<way>_compiler_s``); the rest is tracing outside their timers, loading, warm-up,
capture and CUDA-graph recording.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WAYS = ("build_step_compiled", "compile")
SIZES = ("small gpt d128", "small gpt d512", "small gpt d1024")
SCRIPT = Path(__file__).with_name("ddp_step.py")


def setup_seconds(size: str, way: str, cache: Path) -> tuple[float, float, dict[str, Any]]:
    """One process building one way's step at one size, Inductor's caches in ``cache``:
    set-up and compiling seconds, and the facts of the run."""
    out = cache / f"{way}.json"
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
               TRITON_CACHE_DIR=str(cache / "triton"))
    command = [sys.executable, str(SCRIPT), "--only", size, "--impls", "fused", "--ways", way,
               "--repeats", "0", "--rates", "none", "--json", str(out)]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{size} {way}: ddp_step.py failed (exit {done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    doc = json.loads(out.read_text())
    facts = {k: v for k, v in doc.items() if k != "rows"}
    row = doc["rows"][0]
    return float(row[f"{way}_setup_s"]), float(row.get(f"{way}_compiler_s", 0.0)), facts


def measure(size: str) -> dict[str, Any]:
    row: dict[str, Any] = {"name": size}
    for way in WAYS:
        with tempfile.TemporaryDirectory(prefix="compile-setup-") as folder:
            cache = Path(folder)
            row[f"{way}_cold_s"], row[f"{way}_cold_compiler_s"], row["facts"] = setup_seconds(size, way, cache)
            row[f"{way}_warm_s"], row[f"{way}_warm_compiler_s"], _ = setup_seconds(size, way, cache)
    for kind in ("cold", "warm"):
        row[f"ratio_{kind}"] = row[f"compile_{kind}_s"] / row[f"build_step_compiled_{kind}_s"]
    return row


def format_row(row: dict[str, Any]) -> str:
    cells = [f"{row[f'{way}_{kind}_s']:5.1f} ({row[f'{way}_{kind}_compiler_s']:4.1f})"
             for way in WAYS for kind in ("cold", "warm")]
    return (f"{row['name']:<20} " + " ".join(f"{c:>13}" for c in cells)
            + f" {row['ratio_cold']:>8.2f}x {row['ratio_warm']:>8.2f}x")


HEADER = (f"{'model':<20} {'ours cold':>13} {'ours warm':>13} {'cmp cold':>13} {'cmp warm':>13} "
          f"{'cold':>9} {'warm':>9}   (s, compiling in brackets; ratio = compile / build_step compiled)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SIZES),
                        help="comma-separated model names of ddp_step.py (default: the three small GPTs)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    sizes = [s for s in args.only.split(",") if s]
    rows = []
    for size in sizes:
        rows.append(measure(size))
        if len(rows) == 1:
            print(json.dumps(rows[0]["facts"]), HEADER, sep="\n", flush=True)
        print(format_row(rows[-1]), flush=True)
        if args.json:  # after every size: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))


if __name__ == "__main__":
    main()
