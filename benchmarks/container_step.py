"""What a container srun step costs against a plain one, on the dev cluster's real pyxis.

    .venv/bin/python benchmarks/container_step.py [--repeat 5] [--nodes 1]

Needs `scripts/dev-cluster up` (which builds enroot, pyxis and the images). Each
round runs, alternated so that the machine's load falls on both alike:

- plain:     srun -N NODES -w n[1-NODES] true
- container: srun -N NODES -w n[1-NODES] --container-image=DIR/images/python.sqsh
             --no-container-mount-home true

and prints the median wall time of each and their ratio. The container step's
extra time is pyxis unpacking the image (enroot create) and starting the
container on every node of the step, once per step; jobs pay it for the probe
step and for the training step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

STATE = Path(os.environ.get("CLUSTERKIT_DEV_DIR", "/tmp/clusterkit-dev"))


def timed(argv: list[str]) -> float:
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    elapsed = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 2))
    args = parser.parse_args()
    image = STATE / "images" / "python.sqsh"
    if not image.exists():
        raise SystemExit(f"no {image}: run scripts/dev-cluster up first")
    nodes = "n1" if args.nodes == 1 else "n[1-2]"
    base = ["srun", "-N", str(args.nodes), "-w", nodes, "-p", "debug", "-t", "5"]
    plain, container = [], []
    for _ in range(args.repeat):
        plain.append(timed([*base, "true"]))
        container.append(timed([*base, f"--container-image={image}", "--no-container-mount-home", "true"]))
    p, c = statistics.median(plain), statistics.median(container)
    print(f"srun step on {args.nodes} node(s), {args.repeat} alternated rounds, image {image.name} "
          f"({image.stat().st_size / 2**20:.0f} MiB)")
    print(f"  plain     median {p:6.2f} s  (min {min(plain):.2f}, max {max(plain):.2f})")
    print(f"  container median {c:6.2f} s  (min {min(container):.2f}, max {max(container):.2f})")
    print(f"  container / plain: {c / p:.1f}x, +{c - p:.2f} s per step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
