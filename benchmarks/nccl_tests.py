"""clusterkit's all-reduce sweep against NVIDIA nccl-tests' all_reduce_perf, same GPUs, same call.

    PYTHONPATH=. python3 benchmarks/nccl_tests.py PATH/TO/all_reduce_perf \\
        [--nproc N] [--min-bytes 8] [--max-bytes 4294967296] [--warmup 5] [--iters 20] \\
        [--log-dir DIR] [--json FILE]

Runs, one after the other on the same ``N`` GPUs (default: all that torch sees):

* ``all_reduce_perf -b MIN -e MAX -f 2 -g N -w WARMUP -n ITERS -c 1`` (float32 sum,
  one process driving N GPUs, results checked);
* ``python3 -m torch.distributed.run --standalone --nproc-per-node=N
  cluster_kit/node/allreduce_sweep.py`` with the same sizes, warm-up and iterations,
  which is the Python a rendered sweep job runs on each node.

Both outputs are saved under ``--log-dir`` before they are parsed, then the script
prints, per message size, algbw and busbw of each (nccl-tests' in-place columns, since
the sweep's ``dist.all_reduce`` is in place; out-of-place alongside) and the ratio
sweep / nccl-tests, and the large-message ratio: the highest busbw over sizes of at
least 256 MiB, as ``clusterkit bench allreduce`` reports it. With one GPU busbw is 0
for both by definition, so the large-message ratio is taken on algbw and says so.

nccl-tests is not part of clusterkit. Build it from its source
(https://github.com/NVIDIA/nccl-tests) on the GPU machine, against the NCCL that
torch uses (the nvidia-nccl wheel) so that both sides run the same library::

    W=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')
    mkdir -p ncclhome/lib && ln -sf $W/include ncclhome/include
    ln -sf $W/lib/libnccl.so.2 ncclhome/lib/libnccl.so
    make -C nccl-tests/src -j16 MPI=0 CUDA_HOME=/usr/local/cuda \\
        NCCL_HOME=$PWD/ncclhome NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90 \\
        ../build/all_reduce_perf
    export LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH

(``sm_90`` is Hopper; name your GPUs' architecture, or leave NVCC_GENCODE out to
build for all.) Exit status: 0 when both ran and every checked result was right,
1 otherwise, 2 when the binary is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from allreduce import (  # the sweep as benchmarks/allreduce.py runs it
    SWEEP,
    gpu_count,
    sweep_argv,
)

from cluster_kit.report.allreduce import (
    LARGE_MESSAGE_BYTES,
    SweepLogError,
    format_size,
    parse_sweep_log,
    parse_sweep_meta,
)

Row = dict[str, Any]

_VERSION = re.compile(
    r"^# nccl-tests version (\S+) nccl-headers=(\d+) nccl-library=(\d+)"
)


class NcclTestsOutputError(ValueError):
    """A result line of all_reduce_perf that does not have its columns."""


def _number(text: str) -> float:
    return float(text)


def _wrong(text: str) -> int | None:
    return None if text == "N/A" else int(float(text))


def parse_nccl_tests(text: str) -> list[Row]:
    """The result rows of all_reduce_perf's table (no per-iteration columns).

    A result line is one that does not start with ``#`` and whose first field is an
    integer: size (B), count, type, redop, root, then time (us), algbw, busbw (GB/s)
    and #wrong out of place, and the same four in place (a timestamp may follow).
    """
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or line.lstrip().startswith("#") or not fields[0].isdigit():
            continue
        if len(fields) < 13:
            raise NcclTestsOutputError(
                f"line {number}: {len(fields)} fields, a result line has 13: {line.strip()!r}"
            )
        try:
            rows.append(
                {
                    "bytes": int(fields[0]),
                    "count": int(fields[1]),
                    "dtype": fields[2],
                    "redop": fields[3],
                    "out_of_place": {
                        "time_us": _number(fields[5]),
                        "algbw_gbps": _number(fields[6]),
                        "busbw_gbps": _number(fields[7]),
                        "wrong": _wrong(fields[8]),
                    },
                    "in_place": {
                        "time_us": _number(fields[9]),
                        "algbw_gbps": _number(fields[10]),
                        "busbw_gbps": _number(fields[11]),
                        "wrong": _wrong(fields[12]),
                    },
                }
            )
        except ValueError as exc:
            raise NcclTestsOutputError(
                f"line {number}: {exc}: {line.strip()!r}"
            ) from exc
    return rows


def parse_nccl_tests_meta(text: str) -> dict[str, Any]:
    """nccl-tests' version, the NCCL it was built against and runs with, its summary."""
    meta: dict[str, Any] = {}
    for line in text.splitlines():
        found = _VERSION.match(line)
        if found:
            meta.update(
                version=found.group(1),
                nccl_headers=int(found.group(2)),
                nccl_library=int(found.group(3)),
            )
        elif line.startswith("# Avg bus bandwidth"):
            meta["avg_busbw_gbps"] = float(line.split(":", 1)[1].split()[0])
        elif line.startswith("# Out of bounds values"):
            meta["out_of_bounds"] = int(line.split(":", 1)[1].split()[0])
    return meta


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def compare(sweep: list[Row], nccl: list[Row]) -> list[Row]:
    """Per size measured by both: each side's figures and sweep / nccl-tests (in place).

    nccl-tests' algbw is bytes / time by its definition, but it is printed in six
    characters (``2e+06`` above 999999 GB/s); it is recomputed here from the size and
    the printed time, which keeps three or more digits. Both sides use the same
    busbw factor at the same world size, so busbw's ratio is algbw's where it exists.
    """
    by_size = {r["bytes"]: r for r in nccl}
    rows = []
    for s in sweep:
        n = by_size.get(s["bytes"])
        if n is None:
            continue
        ip = n["in_place"]
        nccl_algbw = s["bytes"] / ip["time_us"] / 1e3 if ip["time_us"] > 0 else 0.0
        rows.append(
            {
                "bytes": s["bytes"],
                "sweep_time_us": s["time_us"],
                "sweep_algbw_gbps": s["algbw_gbps"],
                "sweep_busbw_gbps": s["busbw_gbps"],
                "nccl_time_us": ip["time_us"],
                "nccl_algbw_gbps": nccl_algbw,
                "nccl_algbw_printed_gbps": ip["algbw_gbps"],
                "nccl_busbw_gbps": ip["busbw_gbps"],
                "nccl_oop_time_us": n["out_of_place"]["time_us"],
                "nccl_oop_algbw_gbps": n["out_of_place"]["algbw_gbps"],
                "nccl_oop_busbw_gbps": n["out_of_place"]["busbw_gbps"],
                "algbw_ratio": _ratio(ip["time_us"], s["time_us"]),
                "busbw_ratio": _ratio(s["busbw_gbps"], ip["busbw_gbps"]),
            }
        )
    return rows


def large_message(rows: list[Row], threshold: int = LARGE_MESSAGE_BYTES) -> Row:
    """Highest busbw of each side over sizes >= threshold (largest size if none is),
    their ratio, or the algbw ratio where busbw is 0 on both (world size 1)."""
    if not rows:
        return {"basis": "no size measured by both", "ratio": None}
    large = [r for r in rows if r["bytes"] >= threshold] or [
        max(rows, key=lambda r: r["bytes"])
    ]
    sweep_bus = max(r["sweep_busbw_gbps"] for r in large)
    nccl_bus = max(r["nccl_busbw_gbps"] for r in large)
    doc: Row = {
        "sizes": [r["bytes"] for r in large],
        "sweep_busbw_gbps": sweep_bus,
        "nccl_busbw_gbps": nccl_bus,
        "sweep_algbw_gbps": max(r["sweep_algbw_gbps"] for r in large),
        "nccl_algbw_gbps": max(r["nccl_algbw_gbps"] for r in large),
    }
    if nccl_bus > 0:
        doc.update(metric="busbw", ratio=sweep_bus / nccl_bus)
    else:
        doc.update(
            metric="algbw (busbw is 0 on both: world size 1)",
            ratio=_ratio(doc["sweep_algbw_gbps"], doc["nccl_algbw_gbps"]),
        )
    doc["basis"] = (
        f"max over sizes {format_size(min(doc['sizes']))} to {format_size(max(doc['sizes']))}"
    )
    return doc


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_comparison(rows: list[Row], large: Row) -> str:
    """The per-size table and the large-message line, for people."""
    head = (
        f"{'size':>10} {'sweep us':>10} {'nccl us':>10} {'sweep algbw':>12} "
        f"{'nccl algbw':>11} {'algbw x':>8} {'sweep busbw':>12} {'nccl busbw':>11} {'busbw x':>8}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{format_size(r['bytes']):>10} {r['sweep_time_us']:>10.2f} {r['nccl_time_us']:>10.2f} "
            f"{r['sweep_algbw_gbps']:>12.2f} {r['nccl_algbw_gbps']:>11.2f} "
            f"{_fmt_ratio(r['algbw_ratio']):>8} {r['sweep_busbw_gbps']:>12.2f} "
            f"{r['nccl_busbw_gbps']:>11.2f} {_fmt_ratio(r['busbw_ratio']):>8}"
        )
    lines.append(
        f"large messages ({large['basis']}): sweep / nccl-tests {large.get('metric', '')} = "
        f"{_fmt_ratio(large['ratio'])}"
    )
    return "\n".join(lines)


def run_logged(cmd: list[str], log: Path, timeout: float) -> tuple[int, str]:
    """Run ``cmd``, write stdout+stderr to ``log``; (exit status, text)."""
    try:
        proc = subprocess.run(
            cmd,
            check=False,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        status, text = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        status = 124
        text = (
            out.decode() if isinstance(out, bytes) else out
        ) + f"\n[timed out after {timeout:g} s]\n"
    log.write_text(text)
    return status, text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "all_reduce_perf", help="path of a built nccl-tests all_reduce_perf"
    )
    parser.add_argument(
        "--nproc", type=int, help="GPUs to use (default: all torch sees)"
    )
    parser.add_argument("--min-bytes", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=4 << 30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument(
        "--log-dir", default=".", help="where both raw outputs are written"
    )
    parser.add_argument("--json", help="write the comparison document here")
    parser.add_argument(
        "--timeout", type=float, default=300, help="seconds per program"
    )
    args = parser.parse_args()
    binary = Path(args.all_reduce_perf)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        print(
            f"error: {binary}: no executable all_reduce_perf there; build nccl-tests as "
            "this script's docstring says and pass the path of build/all_reduce_perf",
            file=sys.stderr,
        )
        return 2
    nproc = args.nproc or max(gpu_count(), 1)
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    nccl_status, nccl_text = run_logged(
        [
            str(binary),
            "-b",
            str(args.min_bytes),
            "-e",
            str(args.max_bytes),
            "-f",
            "2",
            "-g",
            str(nproc),
            "-w",
            str(args.warmup),
            "-n",
            str(args.iters),
            "-c",
            "1",
        ],
        logs / "nccl_tests.log",
        args.timeout,
    )
    sweep_status, sweep_text = run_logged(
        sweep_argv(nproc, [
            "--min-bytes",
            str(args.min_bytes),
            "--max-bytes",
            str(args.max_bytes),
            "--warmup",
            str(args.warmup),
            "--iters",
            str(args.iters),
        ]),
        logs / "allreduce_sweep.log",
        args.timeout,
    )
    try:
        nccl_rows = parse_nccl_tests(nccl_text)
    except NcclTestsOutputError as exc:
        print(
            f"error: {logs / 'nccl_tests.log'}: {exc}; is {binary} nccl-tests' "
            "all_reduce_perf run without -I?",
            file=sys.stderr,
        )
        return 1
    try:
        sweep_rows = parse_sweep_log(sweep_text)
    except SweepLogError as exc:
        print(
            f"error: {logs / 'allreduce_sweep.log'}: {exc}; the sweep's output is "
            f"not what {SWEEP.name} prints",
            file=sys.stderr,
        )
        return 1
    rows = compare(sweep_rows, nccl_rows)
    large = large_message(rows)
    nccl_meta = parse_nccl_tests_meta(nccl_text)
    print(
        f"world size {nproc}; nccl-tests {nccl_meta}; sweep {parse_sweep_meta(sweep_text)}"
    )
    print(format_comparison(rows, large))
    wrong = [
        r["bytes"]
        for r in nccl_rows
        for side in ("out_of_place", "in_place")
        if r[side]["wrong"]
    ] + [r["bytes"] for r in sweep_rows if r.get("check") != "ok"]
    ok = nccl_status == 0 and sweep_status == 0 and bool(rows) and not wrong
    if not ok:
        print(
            f"FAILED: nccl-tests exit {nccl_status}, sweep exit {sweep_status}, "
            f"{len(rows)} sizes compared, wrong results at {wrong or 'none'}; see {logs}/",
            file=sys.stderr,
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "world_size": nproc,
                    "nccl_tests": nccl_meta,
                    "sweep": parse_sweep_meta(sweep_text),
                    "rows": rows,
                    "large_message": large,
                    "passed": ok,
                },
                indent=2,
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
