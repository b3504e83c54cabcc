"""Re-capture the verbatim Slurm output the unit tests parse (a developer tool).

Needs a running Slurm (nodes n1, n2 with 4 CPUs and 4 GRES gpus each, partition
debug) reachable through $SLURM_CONF, and no other jobs. Usage:

    SLURM_CONF=... python tests/data/slurm/capture.py basic WORKDIR
    SLURM_CONF=... python tests/data/slurm/capture.py accounting WORKDIR   # needs slurmdbd
    SLURM_CONF=... python tests/data/slurm/capture.py requeued WORKDIR     # needs slurmdbd
    SLURM_CONF=... python tests/data/slurm/capture.py nodes WORKDIR        # reads only; nodes n1-n3
    SLURM_CONF=... python tests/data/slurm/capture.py sigterm WORKDIR      # about 90 s

`sigterm` records what `scontrol show job -o` says inside a batch script at the moment
its SIGTERM comes: at the time limit, on `scontrol requeue` and on `scancel`
(`scontrol_show_job_at_sigterm_*.stdout`; the supervisor tells them apart from it).

The `requeued` cases were recorded on a second such cluster, with slurmdbd, whose
nodes are a1 and a2.

`scontrol_show_node_fqdn.stdout` is the one file not recorded: it is
`scontrol_show_node_all.stdout` with each node's NodeHostName made an FQDN
(`gpu00N.cluster.local`) and its NodeAddr a 10.1.0.N address, by hand, as on a
cluster whose host names differ from its Slurm names (it has no cases.json entry).

Each case writes `<case>.stdout` and `<case>.stderr` verbatim and records its
argv and exit status in `cases.json`. The argv comes from cluster_kit.slurm.builders's
builders, so the fixtures are exactly what the parsers meet in production.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from cluster_kit.slurm import builders as slurm

HERE = Path(__file__).resolve().parent
INDEX = HERE / "cases.json"


def run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60,
                          check=False)


def save(case: str, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run argv, store its output under `case`, return the result."""
    proc = run(argv, stdin)
    (HERE / f"{case}.stdout").write_text(proc.stdout)
    (HERE / f"{case}.stderr").write_text(proc.stderr)
    index = json.loads(INDEX.read_text()) if INDEX.exists() else {}
    index[case] = {"argv": argv, "returncode": proc.returncode, "stdin": stdin}
    INDEX.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    print(f"{case}: rc={proc.returncode} {proc.stdout.strip()[:60]!r} {proc.stderr.strip()[:80]!r}")
    return proc


def submit(case: str | None, options: dict[str, slurm.OptionValue], script: str | None = None) -> str:
    argv = slurm.build_sbatch(options)
    proc = save(case, argv, script) if case else run(argv, script)
    return slurm.parse_sbatch(proc.stdout)


def wait_for(job_id: str, phases: tuple[str, ...], limit: float = 180) -> str:
    """Poll scontrol until the job's phase is one of `phases`; its state."""
    deadline = time.time() + limit
    while time.time() < deadline:
        records = slurm.parse_scontrol_show_job(run(slurm.build_scontrol_show_job(job_id)).stdout)
        state = records[0]["JobState"] if records else ""
        if slurm.job_phase(state) in phases:
            return state
        time.sleep(0.5)
    raise SystemExit(f"job {job_id} did not reach {phases} in {limit}s")


def show(case: str, job_id: str) -> None:
    save(f"squeue_{case}", slurm.build_squeue(job_id))
    save(f"scontrol_show_job_{case}", slurm.build_scontrol_show_job(job_id))


def basic(work: Path) -> None:
    """Job states, test-only, errors, sinfo and drain, without accounting."""
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    spaced = work / "dir with space"
    spaced.mkdir(exist_ok=True)
    common = {"partition": "debug", "output": f"{out}/%x-%j.out", "chdir": str(work)}

    save("test_only_ok", slurm.build_sbatch({**common, "nodes": 2, "wrap": "true"}, test_only=True))
    save("sinfo_nodes", slurm.build_sinfo_nodes("debug"))
    timeout_job = submit(None, {**common, "job-name": "ck-timeout", "time": "1", "wrap": "sleep 600"})
    ok = submit("sbatch_parsable", {**common, "job-name": "ck-ok", "nodes": 2},
                "#!/bin/bash\necho hello from $SLURM_JOB_ID\n")
    save("sbatch_plain", slurm.build_sbatch({**common, "job-name": "ck-plain", "wrap": "true"},
                                            parsable=False))
    wait_for(ok, ("terminal",))
    show("completed", ok)
    save("sacct_disabled", slurm.build_sacct(ok))

    failed = submit(None, {**common, "chdir": str(spaced), "job-name": "ck fail|x",
                           "error": f"{out}/%x-%j.err"}, "#!/bin/bash\necho bad >&2\nexit 3\n")
    wait_for(failed, ("terminal",))
    show("failed", failed)

    running = submit(None, {**common, "job-name": "ck-long", "nodes": 2, "exclusive": True,
                            "gpus-per-node": 4, "wrap": "sleep 300"})
    wait_for(running, ("running",))
    pending = submit(None, {**common, "job-name": "ck-pending", "wrap": "true"})
    time.sleep(1)
    show("running", running)
    show("pending", pending)
    save("test_only_ok_busy", slurm.build_sbatch({**common, "nodes": 2, "wrap": "true"},
                                                  test_only=True))
    save("test_only_impossible", slurm.build_sbatch({**common, "nodes": 3, "wrap": "true"},
                                                     test_only=True))
    save("test_only_too_many_gpus", slurm.build_sbatch({**common, "gpus-per-node": 8, "wrap": "true"},
                                                        test_only=True))
    save("sbatch_refused", slurm.build_sbatch({**common, "gpus-per-node": 8, "wrap": "true"}))
    save("scancel_running", slurm.build_scancel(running))
    save("scancel_pending", slurm.build_scancel(pending))
    wait_for(running, ("terminal",))
    show("cancelled", running)
    show("cancelled_pending", pending)
    save("scancel_completed", slurm.build_scancel(ok))
    save("scancel_unknown", slurm.build_scancel("999999"))
    show("unknown", "999999")

    save("scontrol_update_drain", slurm.build_scontrol_update_nodes(
        "n2", "DRAIN", "clusterkit: gpu.driver 535.104.05 differs from 550.54.15"))
    save("sinfo_nodes_drained", slurm.build_sinfo_nodes("debug"))
    save("scontrol_update_resume", slurm.build_scontrol_update_nodes("n2", "RESUME"))
    save("scontrol_update_unknown_node", slurm.build_scontrol_update_nodes("n9", "DRAIN", "x"))
    save("sinfo_nodes_unknown_partition", slurm.build_sinfo_nodes("nosuch"))

    wait_for(timeout_job, ("terminal",), limit=240)
    show("timeout", timeout_job)


def accounting(work: Path) -> None:
    """sacct text: completed, failed with steps, cancelled, running."""
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    common = {"partition": "debug", "output": f"{out}/%x-%j.out", "chdir": str(work)}
    ok = submit(None, {**common, "job-name": "ck-ok", "wrap": "echo hi"})
    failed = submit(None, {**common, "job-name": "ck fail|x", "nodes": 2, "ntasks-per-node": 1},
                    "#!/bin/bash\nsrun true\nexit 3\n")
    for job in (ok, failed):
        wait_for(job, ("terminal",))
    running = submit(None, {**common, "job-name": "ck-long", "wrap": "srun sleep 300"})
    wait_for(running, ("running",))
    time.sleep(2)
    save("sacct_completed", slurm.build_sacct(ok))
    save("sacct_failed", slurm.build_sacct(failed))
    save("sacct_running", slurm.build_sacct(running))
    run(slurm.build_scancel(running))
    wait_for(running, ("terminal",))
    time.sleep(2)
    save("sacct_cancelled", slurm.build_sacct(running))
    save("sacct_unknown", slurm.build_sacct("999999"))


def requeued(work: Path) -> None:
    """sacct text of a two-node job requeued once while running, then completed.

    Plain sacct shows only the job's latest run; `--duplicates` shows every run,
    oldest first (the first one REQUEUED, its batch step CANCELLED by the requeue).
    Slurm holds a requeued job back for about two minutes (Reason=BeginTime).
    """
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    common = {"partition": "debug", "output": f"{out}/%x-%j.out", "chdir": str(work)}
    job = submit(None, {**common, "job-name": "ck-requeue", "nodes": 2, "requeue": True},
                 "#!/bin/bash\nsrun true\nsleep 4\n")
    wait_for(job, ("running",))
    time.sleep(2)
    run(["scontrol", "requeue", job])
    wait_for(job, ("terminal",), limit=300)
    time.sleep(2)
    argv = slurm.build_sacct(job)
    save("sacct_requeued", argv)
    save("sacct_requeued_duplicates", [argv[0], "--duplicates", *argv[1:]])


SIGTERM_PROBE = """#!/bin/bash
trap 'scontrol show job -o "$SLURM_JOB_ID" > {out}/$SLURM_JOB_ID.term; sleep 3' TERM
for i in $(seq 200); do sleep 1 & wait $!; done
"""


def sigterm(workdir: Path) -> None:
    """Three 1-minute jobs that write scontrol's view at their SIGTERM: one reaches its
    limit, one is requeued, one cancelled."""
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "probe.sh"
    script.write_text(SIGTERM_PROBE.format(out=workdir))
    ids = {}
    for case in ("time_limit", "requeue", "scancel"):
        ids[case] = slurm.parse_sbatch(subprocess.run(
            ["sbatch", "--parsable", "-N1", "--time=1", f"--output={workdir}/%j.out", str(script)],
            capture_output=True, text=True, check=True).stdout)
    time.sleep(5)
    subprocess.run(["scontrol", "requeue", ids["requeue"]], check=True)
    subprocess.run(["scancel", ids["scancel"]], check=True)
    time.sleep(85)
    subprocess.run(["scancel", ids["requeue"]], check=False)
    for case, job_id in ids.items():
        (HERE / f"scontrol_show_job_at_sigterm_{case}.stdout").write_text((workdir / f"{job_id}.term").read_text())


def nodes(work: Path) -> None:
    """`scontrol show node --oneliner`: every node, one node, and a node Slurm does not have."""
    save("scontrol_show_node_all", slurm.build_scontrol_show_nodes())
    save("scontrol_show_node_n1", slurm.build_scontrol_show_nodes("n1"))
    save("scontrol_show_node_unknown", slurm.build_scontrol_show_nodes("n9"))


if __name__ == "__main__":
    {"basic": basic, "accounting": accounting, "requeued": requeued, "sigterm": sigterm,
     "nodes": nodes}[sys.argv[1]](Path(sys.argv[2]))
