"""The Slurm commands the supervisor runs, each with a timeout (stdlib only, Python 3.8+).

Nothing here is built from what a rank wrote: job ids come from Slurm, node names
from the allocation, the script from the record folder after its digest matched.
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence

from cluster_kit.hostlist import NodeSet

SLURM_TIMEOUT_S = 60.0
# The comment a restart is submitted with: how its supervisor finds the chain it goes
# on (Slurm keeps it with the job; only the job's user or an operator can set it).
CHAIN_COMMENT = "clusterkit-chain="
# Node states (sinfo %T) in which a node no longer serves the job: Slurm's own verdict.
BAD_STATES = ("down", "fail", "power_down", "powered_down")
# A drain reason clusterkit's health gate writes: its drain is a node fault, an admin's is not.
GATE_REASON = "clusterkit:"
DEFAULT_SLURMD_TIMEOUT_S = 300.0  # slurm.conf's default SlurmdTimeout


def slurm(argv: Sequence[str], env: Mapping[str, str] | None = None, stdin: bytes | None = None,
          cwd: str | None = None, timeout: float = SLURM_TIMEOUT_S) -> str:
    """stdout of a Slurm command; raises RuntimeError with its stderr."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, env=env,
                              check=False, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{argv[0]}: {exc}")
    out, err = (done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace"))
    if done.returncode != 0:
        raise RuntimeError("{} failed: {}".format(" ".join(argv[:2]), err.strip() or done.returncode))
    return out


def show_job(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as {key: value} (values without spaces, as Slurm prints them)."""
    fields = {}
    for token in slurm(["scontrol", "show", "job", "-o", job_id]).split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def job_comment(job_id: str) -> str:
    """The job's comment (`squeue %k`), '' when it has none."""
    text = slurm(["squeue", "-h", "-j", job_id, "-o", "%k"]).strip()
    return "" if text in ("(null)", "") else text


def chain_of(comment: str) -> str | None:
    """The first job id of the chain a restart goes on, from its comment; None for a first job."""
    for word in comment.replace(";", " ").split():
        if word.startswith(CHAIN_COMMENT) and word[len(CHAIN_COMMENT):].isdigit():
            return word[len(CHAIN_COMMENT):]
    return None


def user_comment(comment: str) -> str:
    """The comment without clusterkit's chain word: what the user's job set."""
    words = [w for w in comment.split(";") if chain_of(w) is None]
    return ";".join(words).strip()


def hostnames(nodelist: str) -> list[str]:
    try:
        return list(NodeSet(nodelist))
    except ValueError:
        return []


def parse_node_states(text: str) -> dict[str, tuple[str, str, str]]:
    """`sinfo -h -N -o '%N|%T|%E|%H'` lines -> {node: (state, reason, reason time or '')}."""
    states: dict[str, tuple[str, str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0]:
            states.setdefault(parts[0], (parts[1].lower(), parts[2], parts[3]))
    return states


def node_states(nodes: Sequence[str]) -> dict[str, tuple[str, str, str]]:
    """{node: (state, reason, reason time)} of `nodes` as Slurm sees them now."""
    if not nodes:
        return {}
    return parse_node_states(slurm(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T|%E|%H"]))


FAULT, DRAINED, SILENT, OK = "fault", "drained", "silent", "ok"


def node_verdict(state: str, reason: str = "") -> str:
    """What a node's sinfo state (%T, `*` appended while it does not respond) and reason
    (%E) mean for a job on it: FAULT (Slurm says it is down or failed, or clusterkit's
    health gate drained it), DRAINED (someone else drains it: its jobs run on, it is
    only left out of the next attempt), SILENT (not responding, not yet down: it may
    answer again before Slurm's SlurmdTimeout) or OK."""
    bare = state.rstrip("*~#!%$@^-+")
    if any(bare.startswith(bad) for bad in BAD_STATES) or bare in ("not_responding", "no_respond"):
        return FAULT
    if "drain" in bare:
        return FAULT if reason.startswith(GATE_REASON) else DRAINED
    if state.endswith("*"):
        return SILENT
    return OK


def failed_nodes(nodes: Sequence[str]) -> list[str]:
    """Allocated nodes Slurm marks DOWN or FAIL, or that the health gate drained ([] when sinfo fails)."""
    try:
        states = node_states(nodes)
    except RuntimeError:
        return []
    return [n for n in nodes if n in states and node_verdict(states[n][0], states[n][1]) == FAULT]


def reason_times(nodes: Sequence[str]) -> dict[str, str]:
    """{node: when Slurm set its state's reason (sinfo %H)} ({} when sinfo fails)."""
    try:
        states = node_states(nodes)
    except RuntimeError:
        return {}
    return {n: states[n][2] for n in nodes if n in states}


def unusable_nodes(nodes: Sequence[str]) -> list[str]:
    """Nodes the next attempt should not start on: failed, drained, or not responding."""
    try:
        states = node_states(nodes)
    except RuntimeError:
        return []
    return [n for n in nodes if n in states and node_verdict(states[n][0], states[n][1]) != OK]


def parse_slurmd_timeout(text: str) -> float | None:
    """SlurmdTimeout in seconds from `scontrol show config` (`SlurmdTimeout = 30 sec`); None if absent."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "SlurmdTimeout":
            words = value.split()
            if words and words[0].isdigit():
                return float(words[0])
    return None


def slurmd_timeout() -> float:
    """How long Slurm waits for a silent node before it calls it DOWN (SlurmdTimeout)."""
    try:
        found = parse_slurmd_timeout(slurm(["scontrol", "show", "config"]))
    except RuntimeError:
        found = None
    return found if found is not None else DEFAULT_SLURMD_TIMEOUT_S


def partition_nodes(job: Mapping[str, str]) -> list[str]:
    """The nodes of the job's partition ([] when Slurm does not say)."""
    try:
        return slurm(["sinfo", "-h", "-N", "-p", job.get("Partition", ""), "-o", "%N"]).split()
    except RuntimeError:
        return []


def submit_next(script: bytes, job_id: str, chain_id: str, exclude: Sequence[str], after: str = "afterany") -> str:
    """sbatch the next attempt (`script`: the bytes of the verified copy, on stdin), to
    start once job `job_id` ended (`after`: afterany, or afternotok for the standby job
    that goes on only when this one dies unexpectedly), with the comment the user gave
    `job_id` and the chain's own word; its job id."""
    comment = user_comment(job_comment(job_id))
    # append: an output path without %j is every attempt's, and sbatch would truncate it
    argv = ["sbatch", "--parsable", f"--dependency={after}:{job_id}", "--kill-on-invalid-dep=yes",
            "--open-mode=append", "--comment=" + ";".join(filter(None, [CHAIN_COMMENT + chain_id, comment]))]
    if exclude:
        argv.append(f"--exclude={NodeSet.of(exclude)}")
    return slurm(argv, env=submit_environment(os.environ), stdin=script).strip().split(";")[0]


def submit_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of an sbatch from inside a job: none of this job's Slurm
    variables and none of clusterkit's (a job's identity never comes from them)."""
    return {k: v for k, v in environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "CLUSTERKIT_")) or k == "SLURM_CONF"}


def requeued_since(job_id: str, restarts: str) -> bool:
    """Whether Slurm requeued the job after the run that saw `restarts` (scontrol's
    Restarts= counts the requeues; it has gone up by the time the batch script gets
    SIGTERM, where a cancelled job's has not)."""
    try:
        now = show_job(job_id).get("Restarts", "0")
    except RuntimeError:
        return False
    return now.isdigit() and str(restarts).isdigit() and int(now) > int(restarts)


def cancel(job_id: str) -> None:
    slurm(["scancel", job_id])


GUARD_NAME = "clusterkit-guard"
# The guard: a step on another node than the batch script's that cancels the job once
# Slurm says the batch script's node is down, or it has not responded for longer than
# SlurmdTimeout. With --no-kill, Slurm 22.05 keeps such a job RUNNING without its batch
# script until its time limit; once cancelled, the standby job (--dependency=afternotok)
# takes the chain over. It leaves with exit code 0 when its stdin closes (the supervisor
# is done with it): srun then reports no killed task.
GUARD_CODE = """import select, subprocess, sys, time
job, host, patience = sys.argv[1], sys.argv[2], float(sys.argv[3])
silent = None
while True:
    if select.select([sys.stdin], [], [], 5)[0] and not sys.stdin.buffer.read1(4096):
        sys.exit(0)
    try:
        state = subprocess.run(["sinfo", "-h", "-n", host, "-o", "%T"], capture_output=True, text=True,
                               timeout=30).stdout.strip().lower()
    except (OSError, subprocess.TimeoutExpired):
        continue
    down = state.rstrip("*~#!%$@^-+").startswith(("down", "fail"))
    silent = (silent or time.time()) if state.endswith("*") else None
    if down or (silent is not None and time.time() - silent > patience):
        print("clusterkit guard: the batch script's node %s is %s: cancelling job %s" % (host, state, job),
              file=sys.stderr, flush=True)
        subprocess.run(["scancel", job], timeout=30)
        break
"""


def parse_steps(text: str) -> list[str]:
    """`squeue -s -h -o %i|%j` lines -> the numeric step ids (`123.0` -> `0`) of the job's
    sruns, the guard's left out."""
    steps = []
    for line in text.splitlines():
        step_id, _, name = line.strip().partition("|")
        step = step_id.partition(".")[2]
        if step.isdigit() and name != GUARD_NAME:
            steps.append(step)
    return steps


def running_steps(job_id: str) -> list[str]:
    """The ids of the job's srun steps that Slurm lists now ([] when squeue fails)."""
    try:
        return parse_steps(slurm(["squeue", "-s", "-h", "-j", job_id, "-o", "%i|%j"]))
    except RuntimeError:
        return []


def start_guard(job_id: str, node: str, batch_host: str, python: str,
                patience_s: float) -> subprocess.Popen[bytes] | None:
    """The guard step on `node` (the srun process; stop it with stop_guard). `patience_s`:
    how long the batch script's node may not respond before the guard gives it up."""
    argv = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", f"--job-name={GUARD_NAME}",
            "--mem=0", python, "-c", GUARD_CODE, job_id, batch_host, f"{patience_s:g}"]
    try:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    except OSError:
        return None


def stop_guard(proc: subprocess.Popen[bytes] | None, wait_s: float = 5.0) -> None:
    """End the guard: its stdin closes and it leaves by itself (no `task 0: Killed` line
    in the job's output); terminated when it has not within `wait_s` (0 after a
    SIGTERM: the supervisor then has only Slurm's KillWait to record the attempt)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=wait_s)
        return
    except (OSError, subprocess.TimeoutExpired):
        pass
    proc.terminate()
    try:
        proc.wait(timeout=max(wait_s, 1.0))
    except subprocess.TimeoutExpired:
        proc.kill()


def kill_steps(job_id: str, steps: Iterable[str]) -> None:
    """SIGKILL every task of these steps of the job: a rank stuck in a collective
    ignores anything gentler, and a rank told to stop by SIGTERM would checkpoint."""
    for step in steps:
        try:
            slurm(["scancel", "--signal=KILL", f"{job_id}.{step}"])
        except RuntimeError:
            pass  # it ended meanwhile


STEPS_GONE_S = 60.0


def end_steps(job_id: str, steps: Iterable[str], timeout: float = STEPS_GONE_S) -> list[str]:
    """Kill these steps of the job (numbers, as the record keeps them) and every srun
    step Slurm still lists, and wait until none of them is listed: the next attempt
    never starts beside one that is still there. The steps still listed at `timeout`."""
    deadline = time.time() + timeout
    left = sorted(set(steps) | set(running_steps(job_id)), key=int)
    while left:
        kill_steps(job_id, left)
        time.sleep(0.5)
        listed = set(running_steps(job_id))
        left = [s for s in left if s in listed]
        if time.time() > deadline:
            break
    return left


def set_excluded(job_id: str, exclude: Sequence[str], timeout: float = SLURM_TIMEOUT_S) -> bool:
    """Set the ExcNodeList of a job that waits (pending, or requeued and completing: Slurm
    takes it then, not while the job runs) to `exclude`; False when Slurm refused or did
    not answer within `timeout` (a job that was resized answers "try again in a bit"
    for a few seconds after its requeue, which scontrol retries by itself)."""
    try:
        slurm(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={NodeSet.of(exclude) if exclude else ''}"],
              timeout=timeout)
        return True
    except RuntimeError:
        return False


def requeue(job_id: str) -> None:
    """Requeue this job (its own user may): it runs again under its id."""
    slurm(["scontrol", "requeue", job_id])


RELEASE_TRIES = 3  # right after a node failure Slurm may answer "try again in a bit"


def release_nodes(job_id: str, nodes: Sequence[str], cwd: str) -> list[str]:
    """Shrink the running job by `nodes`: they go back to Slurm (and an admin can take
    them); its steps on the others go on. A node Slurm already took out of the job (it
    does so itself with a failed one) counts as released. The nodes released.
    `cwd`: where scontrol writes its slurm_job_<id>_resize.* files."""
    for attempt in range(RELEASE_TRIES):
        now = hostnames(show_job(job_id).get("NodeList", ""))
        keep = [n for n in now if n not in nodes]
        if len(keep) == len(now):
            return list(nodes)
        try:
            slurm(["scontrol", "update", f"JobId={job_id}", f"NodeList={NodeSet.of(keep)}"], cwd=cwd)
            return list(nodes)
        except RuntimeError:
            if attempt == RELEASE_TRIES - 1:
                raise
            time.sleep(2)
    return []
