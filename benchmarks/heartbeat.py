"""What `cluster_kit.ddp.heartbeat()` costs a training loop: per call, and per 1 ms step.

    .venv/bin/python benchmarks/heartbeat.py [--reps 300] [--steps 50] [--calls 1000000]

Runs twice, each in a fresh interpreter: supervised (CLUSTERKIT_CONTROL_DIR set to a
temporary folder, the default 1 s interval, the watcher thread running) and not
supervised (no control folder: heartbeat() is a no-op). In each:

* per call: `--calls` heartbeat() calls in a loop, minus the same loop calling an
  empty function (best of 5);
* per step: `--reps` repetitions of `--steps` busy 1 ms steps (a spin on
  perf_counter until 1 ms has passed), with and without a heartbeat() after each
  step, alternated so that load from other processes falls on both; the figure is
  the fastest repetition with heartbeats over the fastest without, minus 1 (load
  only ever adds time to a spin; the ratio of the medians is printed beside it).

Exit status 1 when the supervised per-step overhead is 1 % or more (the target for
jobs that keep training).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEP_S = 0.001
TARGET = 0.01


def busy_step() -> None:
    """One 1 ms step of pure CPU work (a spin, so its length does not depend on the load)."""
    end = time.perf_counter() + STEP_S
    while time.perf_counter() < end:
        pass


def nothing() -> None:
    pass


def per_call_ns(call: object, calls: int) -> float:
    """Best of 5: ns per call of `call()` above an empty function's."""
    def timed(function: object) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            function()  # type: ignore[operator]
        return time.perf_counter() - start

    return min(timed(call) - timed(nothing) for _ in range(5)) / calls * 1e9


def per_step(beat: object, reps: int, steps: int) -> dict[str, float]:
    """Median seconds of `steps` busy steps with and without `beat()`, alternated."""
    with_beat, without = [], []
    for rep in range(reps):
        for use in ((True, False) if rep % 2 else (False, True)):
            start = time.perf_counter()
            for _ in range(steps):
                busy_step()
                if use:
                    beat()  # type: ignore[operator]
            (with_beat if use else without).append(time.perf_counter() - start)
    a, b = min(with_beat), min(without)
    median = statistics.median(with_beat) / statistics.median(without) - 1
    return {"with_s": a, "without_s": b, "overhead": a / b - 1, "median_overhead": median}


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from cluster_kit.trainer import supervision

    supervision.heartbeat()  # the first call sets up (and, supervised, writes and starts the watcher)
    result = {"supervised": supervision.enable_supervision() is not None,
              "per_call_ns": per_call_ns(supervision.heartbeat, args.calls)}
    result.update(per_step(supervision.heartbeat, args.reps, args.steps))
    print(json.dumps(result))


def run(args: argparse.Namespace, control: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERKIT_")}
    if control:
        env["CLUSTERKIT_CONTROL_DIR"] = control
    argv = [sys.executable, __file__, "--child", "--reps", str(args.reps), "--steps", str(args.steps),
            "--calls", str(args.calls)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.reps} x {args.steps} steps of 1 ms")
    with tempfile.TemporaryDirectory() as folder:
        rows = [("supervised", run(args, folder)), ("not supervised", run(args, None))]
    print(f"{'':16} {'ns/call':>8} {'ms/step with':>13} {'ms/step without':>16} {'overhead':>9} {'(medians)':>10}")
    for name, r in rows:
        print(f"{name:16} {r['per_call_ns']:8.0f} {r['with_s'] / args.steps * 1e3:13.4f} "
              f"{r['without_s'] / args.steps * 1e3:16.4f} {r['overhead'] * 100:8.3f}% "
              f"{r['median_overhead'] * 100:9.3f}%")
    per_call = rows[0][1]["per_call_ns"] * 1e-9 / STEP_S
    print(f"supervised heartbeat() per call: {per_call * 100:.4f} % of a 1 ms step (target < 1 %)")
    return 0 if rows[0][1]["overhead"] < TARGET and per_call < TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
