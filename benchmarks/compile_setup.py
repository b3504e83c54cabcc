"""Set-up of a compiled step, cold and warm: build_step(compile=True) against the whole-step torch.compile.

    PYTHONPATH=. python3 benchmarks/compile_setup.py [--only "small gpt d128,small gpt d1024"] [--repeats N]
        [--first-compile function|model] [--ours build_step_compiled,build_step_blocks] [--json FILE]

Every figure comes from a process of its own (``benchmarks/ddp_step.py --repeats 0``,
one size, one way, fused AdamW), so no way finds another's compilations in memory:

* *cold*: Inductor's and Triton's caches in a new empty folder, as on a node's
  first start;
* *warm*: a second process with the same folders, as a job restarted on a node
  that ran it before (Inductor's FX-graph and AOTAutograd caches, Triton's
  kernels; dynamo still traces anew).

Before the timed way each process pays, alike for both ways, what any process
pays once whichever way it takes: it builds the plain eager step (``--ways
eager,<way>``: CUDA's, cuBLAS's and NCCL's first use; *eager s*) and compiles a
small function (``--first-compile``: the start of dynamo, Inductor, Triton and
Inductor's compile workers; *first compile s*, cold and warm). With
``--first-compile model`` it compiles a one-block transformer of other sizes
instead, which also pays apart what a process pays once at its first compile of
such a model (Inductor's lowerings and passes for matmul, attention, norms and the
loss; a first kernel in more compile workers), for both ways alike.

Set-up is ddp_step.py's: from building the step through its first 3 calls,
synchronized at both ends (build_step's compile, warm-up, trial and capture;
torch.compile's compiling and CUDA-graph recording). The ratio is compile's
set-up over build_step's (above 3: build_step's is under a third); the second
ratio adds to each the process's first compile, as a fresh process pays it. In
brackets, the part of each set-up that dynamo and Inductor report as compiling
(``ddp_step.py``'s ``<way>_compiler_s``); the rest is tracing outside their
timers, loading, warm-up, capture and CUDA-graph recording.

``--ours`` names which of ddp_step.py's compiled build_step ways are measured
against compile: ``build_step_compiled`` (default: the step a job gets) and
``build_step_blocks`` (only the repeated blocks compiled); each gets its ratios
(``ratio_<kind>`` for the first, ``<way>_ratio_<kind>`` for the others).

A cold figure moves by a second or more from one process to the next;
``--repeats N`` runs N cold/warm pairs of each way, the ways taking turns, and
reports each figure's median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

OURS = ("build_step_compiled", "build_step_blocks")
THEIRS = "compile"
KINDS = ("cold", "warm")
SIZES = ("small gpt d128", "small gpt d512", "small gpt d1024")
SCRIPT = Path(__file__).with_name("ddp_step.py")


def run_process(size: str, way: str, cache: Path, first: str = "function") -> dict[str, Any]:
    """One process building one way's step at one size, Inductor's caches in ``cache``:
    its set-up and compiling seconds, and what it paid before (eager, first compile)."""
    out = cache / f"{way}.json"
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
               TRITON_CACHE_DIR=str(cache / "triton"))
    command = [sys.executable, str(SCRIPT), "--only", size, "--impls", "fused", "--ways", f"eager,{way}",
               "--first-compile", first, "--repeats", "0", "--rates", "none", "--json", str(out)]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{size} {way}: ddp_step.py failed (exit {done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    doc = json.loads(out.read_text())
    row = doc.pop("rows")[0]
    return {"setup_s": float(row[f"{way}_setup_s"]), "compiler_s": float(row.get(f"{way}_compiler_s", 0.0)),
            "eager_s": float(row["eager_setup_s"]), "first_compile_s": float(doc.pop("first_compile_s")),
            "facts": doc}


def ratio_prefix(ours: list[str] | tuple[str, ...], way: str) -> str:
    """The prefix of ``way``'s ratio keys: none for the first of ours, ``<way>_`` for the others."""
    return "" if way == ours[0] else f"{way}_"


def measure(size: str, repeats: int = 1, first: str = "function",
            ours: tuple[str, ...] = OURS[:1]) -> dict[str, Any]:
    """Each way's cold and warm figures at one size (``ours``, then compile): each the
    median of ``repeats`` cold/warm pairs (every pair in new folders; the ways take
    turns), all kept in ``<key>_all``."""
    row: dict[str, Any] = {"name": size, "repeats": repeats, "first_compile": first, "ours": list(ours)}
    samples: dict[str, list[float]] = {}
    ways = (*ours, THEIRS)
    for repeat in range(repeats):
        for way in ways[repeat % len(ways):] + ways[:repeat % len(ways)]:
            with tempfile.TemporaryDirectory(prefix="compile-setup-") as folder:
                for kind in KINDS:  # warm: the second process on the cold one's folders
                    got = run_process(size, way, Path(folder), first)
                    row["facts"] = got.pop("facts")
                    for key, value in got.items():
                        samples.setdefault(f"{way}_{kind}_{key}", []).append(value)
    for key, values in samples.items():
        row[key] = statistics.median(values)
        row[f"{key}_all"] = values
    for way in ours:
        prefix = ratio_prefix(ours, way)
        for kind in KINDS:
            mine, theirs = row[f"{way}_{kind}_setup_s"], row[f"{THEIRS}_{kind}_setup_s"]
            paid = {w: row[f"{w}_{kind}_first_compile_s"] for w in (way, THEIRS)}
            row[f"{prefix}ratio_{kind}"] = theirs / mine
            row[f"{prefix}ratio_{kind}_with_first_compile"] = (theirs + paid[THEIRS]) / (mine + paid[way])
    return row


def format_rows(row: dict[str, Any]) -> list[str]:
    """One line per way of ours: its set-up and compile's, and their ratios."""
    lines = []
    for way in row["ours"]:
        prefix = ratio_prefix(row["ours"], way)
        pair = (way, THEIRS)
        cells = [f"{row[f'{w}_{kind}_setup_s']:5.1f} ({row[f'{w}_{kind}_compiler_s']:4.1f})"
                 for w in pair for kind in KINDS]
        cells += [f"{row[f'{prefix}ratio_{kind}']:.2f}x / {row[f'{prefix}ratio_{kind}_with_first_compile']:.2f}x"
                  for kind in KINDS]
        cells += ["/".join(f"{row[f'{w}_{kind}_first_compile_s']:.1f}" for w in pair for kind in KINDS),
                  "/".join(f"{row[f'{w}_{kind}_eager_s']:.1f}" for w in pair for kind in KINDS)]
        lines.append(f"{row['name']:<20} {way:<20} " + " ".join(f"{c:>15}" for c in cells))
    return lines


HEADER = (f"{'model':<20} {'ours':<20} " + " ".join(f"{c:>15}" for c in (
    "ours cold", "ours warm", "cmp cold", "cmp warm", "cold: own/+1st", "warm: own/+1st",
    "first compile s", "eager s"))
    + "\n(s, compiling in brackets; ratio = compile / ours, own set-up / with each's first"
    " compile; first compile and eager: ours cold/warm/cmp cold/warm)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SIZES),
                        help="comma-separated model names of ddp_step.py (default: the three small GPTs)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="cold/warm pairs per way and size; each figure is their median (default 1)")
    parser.add_argument("--first-compile", choices=("function", "model"), default="function",
                        help="what each process compiles first, apart (ddp_step.py --first-compile; "
                        "default: function)")
    parser.add_argument("--ours", default=OURS[0],
                        help=f"comma-separated, of: {', '.join(OURS)}: the compiled build_step ways "
                        f"measured against compile (default: {OURS[0]})")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be 1 or more, not {args.repeats}")
    ours = tuple(w for w in args.ours.split(",") if w)
    if not ours or set(ours) - set(OURS):
        parser.error(f"--ours {args.ours!r}: choose from {', '.join(OURS)}")
    sizes = [s for s in args.only.split(",") if s]
    rows = []
    for size in sizes:
        rows.append(measure(size, args.repeats, args.first_compile, ours))
        if len(rows) == 1:
            print(json.dumps(rows[0]["facts"]), HEADER, sep="\n", flush=True)
        print(*format_rows(rows[-1]), sep="\n", flush=True)
        if args.json:  # after every size: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))


if __name__ == "__main__":
    main()
