"""Goodput of jobs that keep training: what each fault costs, and what changes it.

    scripts/dev-cluster up
    .venv/bin/python benchmarks/goodput.py restart  [--steps 120] [--step-seconds 0.25] [--json]
    .venv/bin/python benchmarks/goodput.py interval [--steps 240] [--step-seconds 0.25] [--json]

Every run is examples/train_resilient.py as a 2-node x 2-rank gloo job with
`resilience:` on the dev cluster's real Slurm (profile local-dev, n1-n4), submitted
with `clusterkit submit`; the clean run is the same training without a fault.

`restart`: restarts as a new linked job against restarts inside the allocation,
on a busy partition. Another user keeps a 3-node exclusive job waiting (Resources)
the whole time, as the normal state of a real cluster. Three faults per run:
1. attempt 0: rank 3 hangs in its data loader at 1/4 of the steps (hang_timeout 20 s);
2. attempt 1: once it trained 1/8 of the steps, its second node fails
   (`scripts/dev-cluster fail`, healed when the run is over);
3. attempt 2: rank 0 raises at 3/4 of the steps (a program error: restarted in
   place either way).
`linked` runs without spares, so its restarts after the node faults wait in the
queue behind the waiting job; `in-allocation` asks for `spare_nodes: 2` and goes on
on a spare each time.

`interval`: `checkpoint_every` fixed against `auto`, with the same faults planted at
a fixed rate (a rank killed by a segmentation fault every `--fault-every` steps;
`exclude: never` so every restart is in place), and a model big enough that a save
costs something (`--width`, `--layers`). `mtbf_hours` is set to the planted rate, as
a fleet's failure rate would be.

Printed per run: the wait in the queue before attempt 0 started (on the busy
partition each run first waits behind the other user's job), the wall time (from
attempt 0's start to the end of the last attempt), attempts, and
per fault where its time went: `detect` (hang: from the last step to the culprit
named; crash: from the fault or exception file to the attempt's end; node: from the
failure to the attempt's end), `stop` (hang: from the culprit named to the attempt's
end, its ranks killed), `restart` (from the attempt's end to the next attempt's first
step: the queue, if any, the ranks' start and the checkpoint's load), `redo` (the
steps trained again, reached minus resumed, at the clean run's time per step) and
their sum, `lost`; then each run's goodput: the clean run's wall time over its own.
The first step's time is read from the ranks' heartbeats, polled every 0.1 s.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTERKIT = str(Path(sys.executable).with_name("clusterkit"))
DEV_CLUSTER = str(ROOT / "scripts" / "dev-cluster")
HANG_TIMEOUT_S = 20
CHAIN_TIMEOUT_S = 1500


def write_job(folder: Path, name: str, args: argparse.Namespace, plants: list[str], resilience: dict[str, Any],
              extra_args: list[str] = ()) -> Path:
    job = {"name": name, "profile": "local-dev", "nodes": 2, "gpus_per_node": 2, "time": "00:30:00",
           "script": str(ROOT / "examples" / "train_resilient.py"),
           "args": ["--steps", str(args.steps), "--step-seconds", str(args.step_seconds), *extra_args,
                    *[a for p in plants for a in ("--plant", p)]],
           "output": f"{folder}/%x-%j.out", "env": {"OMP_NUM_THREADS": "1"}, "preflight": False,
           "resilience": {"hang_timeout": HANG_TIMEOUT_S, "max_restarts": 5,
                          "checkpoint_dir": str(folder / f"{name}.ckpt"), **resilience}}
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


def beats(folder: Path, job_id: str, attempt: int) -> list[tuple[int, float]]:
    """(steps, time) of each rank's latest heartbeat in the attempt; steps are counted
    from the attempt's start, not from the step it resumed at."""
    found = []
    for path in sorted((folder / f"clusterkit-{job_id}" / f"attempt-{attempt}" / "heartbeat").glob("rank-*")):
        fields = path.read_text().split()
        if len(fields) >= 2:
            found.append((int(fields[0]), float(fields[1])))
    return found


def max_steps(folder: Path, job_id: str, attempt: int) -> int:
    return max((steps for steps, _ in beats(folder, job_id, attempt)), default=0)


class Chain:
    """What the benchmark saw of a chain while it ran: when a node was failed, and when
    each attempt trained its first step (from rank 0's heartbeat, polled)."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.failed_at: float | None = None
        self.first_step: dict[int, float] = {}

    def saw(self, attempt: int, steps: int, when: float) -> None:
        if steps >= 1 and attempt not in self.first_step:
            self.first_step[attempt] = when - (steps - 1) * self.step_s


def run_chain(folder: Path, job_id: str, chain: Chain, fail_at: int | None = None) -> dict[str, Any]:
    """Wait for the chain's end, watching its heartbeats; with `fail_at`, fail attempt
    1's second node once it trained that many steps."""
    victim = None
    deadline = time.monotonic() + CHAIN_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            record = record_of(folder, job_id)
            attempts = (record or {}).get("attempts", [])
            for attempt in attempts[-2:]:
                for steps, when in beats(folder, job_id, attempt["attempt"])[:1]:
                    chain.saw(attempt["attempt"], steps, when)
            if record and record.get("final"):
                return record
            if (fail_at is not None and victim is None and len(attempts) == 2
                    and attempts[1]["ended"] == "running" and max_steps(folder, job_id, 1) >= fail_at):
                victim = hostnames(attempts[1]["nodes"])[1]
                subprocess.run([DEV_CLUSTER, "fail", victim], check=True, capture_output=True, timeout=60)
                chain.failed_at = time.time()
            time.sleep(0.1)
        sys.exit(f"goodput: the chain of job {job_id} did not end within {CHAIN_TIMEOUT_S} s")
    finally:
        if victim:
            subprocess.run([DEV_CLUSTER, "heal", victim], check=False, capture_output=True, timeout=120)


def hostnames(nodelist: str) -> list[str]:
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                          check=True).stdout.split()


def resumed_step(attempt: dict[str, Any]) -> int:
    found = re.search(rf"rank 0: attempt {attempt['attempt']} starts at step (\d+)", Path(attempt["output"]).read_text())
    return int(found.group(1)) if found else 0


def fault_rows(folder: Path, job_id: str, record: dict[str, Any], chain: Chain) -> list[dict[str, Any]]:
    rows = []
    attempts = record["attempts"]
    for index in range(1, len(attempts)):
        this, after = attempts[index - 1], attempts[index]
        control = folder / f"clusterkit-{job_id}" / f"attempt-{this['attempt']}"
        files = [p for kind in ("exceptions", "faults") for p in (control / kind).glob("*.txt") if p.stat().st_size]
        stop = None
        if this["ended"] == "hang":  # the supervisor's detection; stop: from then to the attempt's end
            detect = this.get("detected_after_s")
            if detect is not None:  # the hang began at the first rank that stopped stepping
                stop = this["ended_at"] - min(when for _, when in beats(folder, job_id, this["attempt"])) - detect
        else:
            began = (min(p.stat().st_mtime for p in files) if this["ended"] == "crash" and files
                     else chain.failed_at if this["ended"] == "node_failure" else None)
            detect = this["ended_at"] - began if began is not None else None
        first = chain.first_step.get(after["attempt"])
        restart = first - this["ended_at"] if first is not None else None
        redone = max(0, resumed_step(this) + max_steps(folder, job_id, this["attempt"]) - resumed_step(after))
        redo = redone * chain.step_s
        lost = None if detect is None or restart is None else detect + (stop or 0.0) + restart + redo
        rows.append({"attempt": this["attempt"], "ended": this["ended"],
                     "culprit": (this.get("culprit") or {}).get("evidence", ""),
                     "detect_s": rounded(detect), "stop_s": rounded(stop), "restart_s": rounded(restart),
                     "steps_redone": redone, "redo_s": rounded(redo),
                     "lost_s": rounded(lost),
                     "same_job": after["slurm_job_id"] == this["slurm_job_id"],
                     "nodes": this["nodes"], "next_nodes": after["nodes"]})
    return rows


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


@contextmanager
def busy_partition() -> Any:
    """Another user's 3-node exclusive job waiting for nodes the whole time: whenever the
    waiting one starts, the next is submitted."""
    stop = Path(tempfile.mkdtemp(prefix="ck-busy-")) / "stop"
    loop = subprocess.Popen(["bash", "-c", f"""
        while [ ! -e {stop} ]; do
            if [ -z "$(squeue -h -n ck-busy -t PD -o %i)" ]; then
                sbatch -N3 --exclusive -J ck-busy -o /dev/null --wrap 'sleep 45' >/dev/null
            fi
            sleep 1
        done"""])
    try:
        time.sleep(3)
        yield
    finally:
        stop.touch()
        loop.wait(timeout=30)
        subprocess.run(["scancel", "-n", "ck-busy"], check=False)


def run(folder: Path, name: str, args: argparse.Namespace, plants: list[str], resilience: dict[str, Any],
        extra: list[str] = (), fail_at: int | None = None, step_s: float | None = None) -> dict[str, Any]:
    """One chain; `step_s`: the clean run's time per step (measured here when not given)."""
    job_id, began = submit(write_job(folder, name, args, plants, resilience, list(extra)))
    chain = Chain(step_s or args.step_seconds)
    record = run_chain(folder, job_id, chain, fail_at)
    last = record["attempts"][-1]["attempt"]
    if step_s is None and last in chain.first_step:
        last_beats = beats(folder, job_id, last)
        ended, steps = max(when for _, when in last_beats), max(steps for steps, _ in last_beats)
        chain.step_s = (ended - chain.first_step[last]) / max(1, steps - 1)
    first, final = record["attempts"][0], record["attempts"][-1]
    return {"job_id": job_id, "queued_s": round(first["started_at"] - began, 1),
            "wall_s": round(final["ended_at"] - first["started_at"], 1),
            "attempts": len(record["attempts"]), "final": record["final"], "step_s": round(chain.step_s, 3),
            "faults": fault_rows(folder, job_id, record, chain) if plants or fail_at else [],
            "checkpoints": next((a["checkpoints"] for a in reversed(record["attempts"]) if a.get("checkpoints")), [])}


def compare_restarts(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    quarter = args.steps // 4
    plants = [f"0:hang:3:{quarter}", f"2:raise:0:{3 * quarter}"]
    result = {"clean": run(folder, "ck-goodput-clean", args, [], {})}
    step_s = result["clean"]["step_s"]
    with busy_partition():
        result["linked"] = run(folder, "ck-goodput-linked", args, plants, {}, fail_at=quarter // 2, step_s=step_s)
        result["in-allocation"] = run(folder, "ck-goodput-spares", args, plants, {"spare_nodes": 2},
                                      fail_at=quarter // 2, step_s=step_s)
    return result


def compare_intervals(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    every = args.fault_every
    plants = [f"{k}:segv:3:{every * (k + 1)}" for k in range(args.steps // every - 1)]
    model = ["--width", str(args.width), "--layers", str(args.layers)]
    rate_s = every * (args.step_seconds + args.measured_step_s)
    base = {"exclude": "never", "mtbf_hours": round(rate_s * 2 / 3600, 4)}
    result = {"clean": run(folder, "ck-goodput-clean", args, [], {}, model)}
    step_s = result["clean"]["step_s"]
    result["fixed"] = run(folder, "ck-goodput-fixed", args, plants, {**base, "checkpoint_every": args.fixed_every},
                          model + ["--checkpoint-every", str(args.fixed_every)], step_s=step_s)
    result["auto"] = run(folder, "ck-goodput-auto", args, plants, {**base, "checkpoint_every": "auto"},
                         model + ["--checkpoint-every", "auto"], step_s=step_s)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("comparison", choices=("restart", "interval"))
    parser.add_argument("--steps", type=int, default=0, help="default: 120 (restart), 240 (interval)")
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--fault-every", type=int, default=60, help="interval: steps between planted faults")
    parser.add_argument("--fixed-every", type=int, default=50, help="interval: the fixed run's checkpoint_every")
    parser.add_argument("--width", type=int, default=1024, help="interval: the model's width")
    parser.add_argument("--layers", type=int, default=8, help="interval: the model's hidden layers")
    parser.add_argument("--measured-step-s", type=float, default=0.05,
                        help="interval: compute per step beside --step-seconds, for mtbf_hours")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.steps = args.steps or (120 if args.comparison == "restart" else 240)
    folder = Path(tempfile.mkdtemp(prefix="ck-goodput-", dir="/tmp"))
    folder.chmod(0o777)
    try:
        runs = (compare_restarts if args.comparison == "restart" else compare_intervals)(folder, args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = {"comparison": args.comparison, "steps": args.steps, "step_seconds": args.step_seconds,
              "hang_timeout_s": HANG_TIMEOUT_S, "runs": runs}
    for run_result in runs.values():
        run_result["goodput"] = round(runs["clean"]["wall_s"] / run_result["wall_s"], 3)
    print(json.dumps(result, indent=1) if args.json else "\n".join(table(result)))
    return 0 if all(r["final"]["exit_code"] == 0 for r in runs.values()) else 1


def table(result: dict[str, Any]) -> list[str]:
    lines = [(f"{result['comparison']}: {result['steps']} steps of {result['step_seconds']} s + compute, "
             f"hang_timeout {result['hang_timeout_s']} s")]
    for name, run_result in result["runs"].items():
        lines.append(f"{name:14} job {run_result['job_id']:>5}  queued {run_result['queued_s']:5.1f} s  "
                     f"wall {run_result['wall_s']:6.1f} s  attempts "
                     f"{run_result['attempts']}  goodput {run_result['goodput']:.3f}  "
                     f"ended {run_result['final']['ended']} (exit {run_result['final']['exit_code']})")
        for line in run_result["checkpoints"][:1]:
            lines.append(f"{'':14} {line}")
        for row in run_result["faults"]:
            where = "same job" if row["same_job"] else "new job"
            times = "  ".join(f"{key} {seconds(row[key + '_s'])}" for key in ("detect", "stop", "restart", "redo"))
            lines.append(f"{'':14} {row['ended']:12} lost {seconds(row['lost_s'])} = {times}  "
                         f"({where}, {row['steps_redone']} steps redone)  {row['nodes']} -> {row['next_nodes']}")
    return lines


def seconds(value: float | None) -> str:
    return "    -  " if value is None else f"{value:5.1f} s"


if __name__ == "__main__":
    sys.exit(main())
