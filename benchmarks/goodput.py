"""Goodput of a job that keeps training: three planted faults against the same run without.

    scripts/dev-cluster up
    .venv/bin/python benchmarks/goodput.py [--steps 120] [--step-seconds 0.25] [--json]

Both runs are examples/train_resilient.py as a 2-node x 2-rank gloo job with
`resilience:` on the dev cluster's real Slurm (profile local-dev, nodes n1-n3),
submitted with `clusterkit submit`. The faulted run gets, one per attempt:

1. attempt 0: rank 3 hangs in its data loader at 1/4 of the steps (hang_timeout 20 s);
2. attempt 1: rank 0 raises at 1/2 of the steps;
3. attempt 2: its second node dies after 1/8 of the steps in that attempt
   (`scripts/dev-cluster fail`, healed once the run is over).

Printed: each run's wall time (submit to the end of its last attempt) and attempts;
per fault, the time to detect it (hang: from the last step to the culprit named;
crash: from the exception file to the attempt's end; node: from the failure to the
attempt's end), the gap to the next attempt's start (Slurm starting the linked job
and the batch script) and the steps trained again (reached minus resumed); and the
goodput: the clean run's wall time over the faulted run's.
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTERKIT = str(Path(sys.executable).with_name("clusterkit"))
DEV_CLUSTER = str(ROOT / "scripts" / "dev-cluster")
HANG_TIMEOUT_S = 20
CHAIN_TIMEOUT_S = 900


def write_job(folder: Path, name: str, args: argparse.Namespace, plants: list[str]) -> Path:
    job = {"name": name, "profile": "local-dev", "nodes": 2, "gpus_per_node": 2, "time": "00:15:00",
           "script": str(ROOT / "examples" / "train_resilient.py"),
           "args": ["--steps", str(args.steps), "--step-seconds", str(args.step_seconds),
                    "--checkpoint-every", "5", *[a for p in plants for a in ("--plant", p)]],
           "output": f"{folder}/%x-%j.out", "env": {"OMP_NUM_THREADS": "1"}, "preflight": False,
           "resilience": {"hang_timeout": HANG_TIMEOUT_S, "max_restarts": 3,
                          "checkpoint_dir": str(folder / f"{name}.ckpt")}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def submit(path: Path) -> tuple[str, float]:
    began = time.time()
    done = subprocess.run([CLUSTERKIT, "submit", str(path), "--no-preflight"], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    if done.returncode != 0:
        sys.exit(f"goodput: clusterkit submit failed: {done.stderr.strip()}")
    return done.stdout.strip(), began


def record_of(folder: Path, job_id: str) -> dict[str, Any] | None:
    try:
        return json.loads((folder / f"clusterkit-{job_id}" / "attempts.json").read_text())
    except (OSError, ValueError):
        return None


def max_steps(folder: Path, job_id: str, attempt: int) -> int:
    """The most steps any rank of the attempt reported in its heartbeat (counted from
    the attempt's start, not from the step it resumed at)."""
    beats = folder / f"clusterkit-{job_id}" / f"attempt-{attempt}" / "heartbeat"
    counts = [int(p.read_text().split()[0]) for p in beats.glob("rank-*") if p.read_text().strip()]
    return max(counts, default=0)


def run_chain(folder: Path, job_id: str, fail_at: int | None = None) -> tuple[dict[str, Any], float | None]:
    """Wait for the chain's end; with `fail_at`, fail attempt 2's second node once it
    trained that many steps. The record and when the node was failed."""
    failed_at, victim = None, None
    deadline = time.monotonic() + CHAIN_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            record = record_of(folder, job_id)
            if record and record.get("final"):
                return record, failed_at
            attempts = (record or {}).get("attempts", [])
            if (fail_at is not None and victim is None and len(attempts) == 3
                    and attempts[2]["ended"] == "running" and max_steps(folder, job_id, 2) >= fail_at):
                victim = hostnames(attempts[2]["nodes"])[1]
                subprocess.run([DEV_CLUSTER, "fail", victim], check=True, capture_output=True, timeout=60)
                failed_at = time.time()
            time.sleep(0.5)
        sys.exit(f"goodput: the chain of job {job_id} did not end within {CHAIN_TIMEOUT_S} s")
    finally:
        if victim:
            subprocess.run([DEV_CLUSTER, "heal", victim], check=False, capture_output=True, timeout=120)


def hostnames(nodelist: str) -> list[str]:
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                          check=True).stdout.split()


def resumed_step(attempt: dict[str, Any]) -> int:
    match = re.search(r"rank 0: attempt \d+ starts at step (\d+)", Path(attempt["output"]).read_text())
    return int(match.group(1)) if match else 0


def fault_rows(folder: Path, job_id: str, record: dict[str, Any], failed_at: float | None) -> list[dict[str, Any]]:
    rows = []
    attempts = record["attempts"]
    for this, after in itertools.pairwise(attempts):
        if this["ended"] == "hang":
            detect = this["detected_after_s"]
        elif this["ended"] == "crash":
            raised = min(p.stat().st_mtime for p in
                         (folder / f"clusterkit-{job_id}" / f"attempt-{this['attempt']}" / "exceptions").glob("*"))
            detect = this["ended_at"] - raised
        else:
            detect = this["ended_at"] - failed_at if failed_at else None
        rows.append({"attempt": this["attempt"], "ended": this["ended"],
                     "culprit": (this.get("culprit") or {}).get("evidence", ""),
                     "detect_s": round(detect, 1) if detect is not None else None,
                     "restart_gap_s": round(after["started_at"] - this["ended_at"], 1),
                     "steps_redone": resumed_step(this) + max_steps(folder, job_id, this["attempt"])
                     - resumed_step(after),
                     "nodes": this["nodes"], "next_nodes": after["nodes"]})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ck-goodput-", dir="/tmp"))
    folder.chmod(0o777)
    try:
        clean_id, clean_began = submit(write_job(folder, "ck-goodput-clean", args, []))
        clean, _ = run_chain(folder, clean_id)
        quarter = args.steps // 4
        faulted_id, faulted_began = submit(write_job(folder, "ck-goodput-faults", args,
                                                     [f"0:hang:3:{quarter}", f"1:raise:0:{2 * quarter}"]))
        faulted, failed_at = run_chain(folder, faulted_id, fail_at=quarter // 2)
        result = {
            "steps": args.steps, "step_seconds": args.step_seconds, "hang_timeout_s": HANG_TIMEOUT_S,
            "clean": {"job_id": clean_id, "wall_s": round(clean["attempts"][-1]["ended_at"] - clean_began, 1),
                      "attempts": len(clean["attempts"]), "final": clean["final"]},
            "faulted": {"job_id": faulted_id,
                        "wall_s": round(faulted["attempts"][-1]["ended_at"] - faulted_began, 1),
                        "attempts": len(faulted["attempts"]), "final": faulted["final"]},
            "faults": fault_rows(folder, faulted_id, faulted, failed_at),
        }
        result["goodput"] = round(result["clean"]["wall_s"] / result["faulted"]["wall_s"], 3)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    ok = result["faulted"]["final"]["exit_code"] == 0 and len(result["faults"]) == 3
    return 0 if ok else 1


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['steps']} steps of {result['step_seconds']} s + compute, hang_timeout {result['hang_timeout_s']} s")
    for run in ("clean", "faulted"):
        r = result[run]
        print(f"{run:8} job {r['job_id']:>5}  wall {r['wall_s']:7.1f} s  attempts {r['attempts']}  "
              f"ended {r['final']['ended']} (exit {r['final']['exit_code']})")
    print(f"{'fault':14} {'detect s':>9} {'restart gap s':>14} {'steps redone':>13}  nodes -> next")
    for row in result["faults"]:
        detect = "-" if row["detect_s"] is None else f"{row['detect_s']:.1f}"
        print(f"{row['ended']:14} {detect:>9} {row['restart_gap_s']:14.1f} {row['steps_redone']:13d}  "
              f"{row['nodes']} -> {row['next_nodes']}")
    print(f"goodput (clean wall / faulted wall): {result['goodput']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
