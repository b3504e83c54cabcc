"""The Slurm commands the supervisor runs, each with a timeout (stdlib only, Python 3.8+).

Nothing here is built from what a rank wrote: job ids come from Slurm, node names
from the allocation, the script from the record folder after its digest matched.
"""
import os
import subprocess
import time

from cluster_kit.hostlist import NodeSet

SLURM_TIMEOUT_S = 60.0
# The comment a restart is submitted with: how its supervisor finds the chain it goes
# on (Slurm keeps it with the job; only the job's user or an operator can set it).
CHAIN_COMMENT = "clusterkit-chain="
# Node states (sinfo %T) in which a node no longer serves the job.
BAD_STATES = ("down", "drain", "fail", "not_responding", "no_respond", "power_down", "powered_down")


def slurm(argv, env=None, stdin=None, cwd=None):
    """stdout of a Slurm command; raises RuntimeError with its stderr."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=SLURM_TIMEOUT_S, env=env,
                              check=False, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{argv[0]}: {exc}")
    out, err = (done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace"))
    if done.returncode != 0:
        raise RuntimeError("{} failed: {}".format(" ".join(argv[:2]), err.strip() or done.returncode))
    return out


def show_job(job_id):
    """`scontrol show job -o` as {key: value} (values without spaces, as Slurm prints them)."""
    fields = {}
    for token in slurm(["scontrol", "show", "job", "-o", job_id]).split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def job_comment(job_id):
    """The job's comment (`squeue %k`), '' when it has none."""
    text = slurm(["squeue", "-h", "-j", job_id, "-o", "%k"]).strip()
    return "" if text in ("(null)", "") else text


def chain_of(comment):
    """The first job id of the chain a restart goes on, from its comment; None for a first job."""
    for word in comment.replace(";", " ").split():
        if word.startswith(CHAIN_COMMENT) and word[len(CHAIN_COMMENT):].isdigit():
            return word[len(CHAIN_COMMENT):]
    return None


def user_comment(comment):
    """The comment without clusterkit's chain word: what the user's job set."""
    words = [w for w in comment.split(";") if chain_of(w) is None]
    return ";".join(words).strip()


def hostnames(nodelist):
    try:
        return list(NodeSet(nodelist))
    except ValueError:
        return []


def parse_node_states(text):
    """`sinfo -h -N -o '%N|%T|%E|%H'` lines -> {node: (state, reason, reason time or '')}."""
    states = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0]:
            states.setdefault(parts[0], (parts[1].lower(), parts[2], parts[3]))
    return states


def node_states(nodes):
    """{node: (state, reason, reason time)} of `nodes` as Slurm sees them now."""
    if not nodes:
        return {}
    return parse_node_states(slurm(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T|%E|%H"]))


def is_bad(state):
    """Whether a node in this sinfo state (%T, maybe with `*` for not responding) no longer serves a job."""
    return state.endswith("*") or any(state.startswith(bad) for bad in BAD_STATES)


def failed_nodes(nodes):
    """Allocated nodes Slurm marks DOWN, DRAIN, FAIL or not responding ([] when sinfo fails)."""
    try:
        states = node_states(nodes)
    except RuntimeError:
        return []
    return [n for n in nodes if n in states and is_bad(states[n][0])]


def partition_nodes(job):
    """The nodes of the job's partition ([] when Slurm does not say)."""
    try:
        return slurm(["sinfo", "-h", "-N", "-p", job.get("Partition", ""), "-o", "%N"]).split()
    except RuntimeError:
        return []


def submit_next(script, job_id, chain_id, exclude, comment="", after="afterany"):
    """sbatch the next attempt (`script`: the bytes of the verified copy, on stdin), to
    start once this job ended (`after`: afterany, or afternotok for the standby job that
    goes on only when this one dies unexpectedly); its job id."""
    # append: an output path without %j is every attempt's, and sbatch would truncate it
    argv = ["sbatch", "--parsable", f"--dependency={after}:{job_id}", "--kill-on-invalid-dep=yes",
            "--open-mode=append", "--comment=" + ";".join(filter(None, [CHAIN_COMMENT + chain_id, comment]))]
    if exclude:
        argv.append(f"--exclude={NodeSet.of(exclude)}")
    return slurm(argv, env=submit_environment(os.environ), stdin=script).strip().split(";")[0]


def submit_environment(environ):
    """The environment of an sbatch from inside a job: none of this job's Slurm
    variables and none of clusterkit's (a job's identity never comes from them)."""
    return {k: v for k, v in environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "CLUSTERKIT_")) or k == "SLURM_CONF"}


def requeued_since(job_id, restarts):
    """Whether Slurm requeued the job after the run that saw `restarts` (scontrol's
    Restarts= counts the requeues; it has gone up by the time the batch script gets
    SIGTERM, where a cancelled job's has not)."""
    try:
        now = show_job(job_id).get("Restarts", "0")
    except RuntimeError:
        return False
    return now.isdigit() and str(restarts).isdigit() and int(now) > int(restarts)


def cancel(job_id):
    slurm(["scancel", job_id])


GUARD_NAME = "clusterkit-guard"
# The guard: a step on another node than the batch script's that cancels the job once
# Slurm says the batch script's node is down or not responding. With --no-kill, Slurm
# 22.05 keeps such a job RUNNING without its batch script until its time limit; once
# cancelled, the standby job (--dependency=afternotok) takes the chain over.
GUARD_CODE = """import subprocess, sys, time
job, host = sys.argv[1], sys.argv[2]
while True:
    time.sleep(5)
    try:
        state = subprocess.run(["sinfo", "-h", "-n", host, "-o", "%T"], capture_output=True, text=True,
                               timeout=30).stdout.strip().lower()
    except (OSError, subprocess.TimeoutExpired):
        continue
    if state.endswith("*") or state.startswith(("down", "fail", "not_responding", "no_respond")):
        print("clusterkit guard: the batch script's node %s is %s: cancelling job %s" % (host, state, job),
              file=sys.stderr, flush=True)
        subprocess.run(["scancel", job], timeout=30)
        break
"""


def parse_steps(text):
    """`squeue -s -h -o %i|%j` lines -> the numeric step ids (`123.0` -> `0`) of the job's
    sruns, the guard's left out."""
    steps = []
    for line in text.splitlines():
        step_id, _, name = line.strip().partition("|")
        step = step_id.partition(".")[2]
        if step.isdigit() and name != GUARD_NAME:
            steps.append(step)
    return steps


def running_steps(job_id):
    """The ids of the job's srun steps that Slurm lists now ([] when squeue fails)."""
    try:
        return parse_steps(slurm(["squeue", "-s", "-h", "-j", job_id, "-o", "%i|%j"]))
    except RuntimeError:
        return []


def start_guard(job_id, node, batch_host, python):
    """The guard step on `node` (the srun process; stop it with stop_guard)."""
    argv = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", f"--job-name={GUARD_NAME}",
            "--mem=0", python, "-c", GUARD_CODE, job_id, batch_host]
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    except OSError:
        return None


def stop_guard(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def kill_steps(job_id, steps):
    """SIGKILL every task of these steps of the job: a rank stuck in a collective
    ignores anything gentler, and a rank told to stop by SIGTERM would checkpoint."""
    for step in steps:
        try:
            slurm(["scancel", "--signal=KILL", f"{job_id}.{step}"])
        except RuntimeError:
            pass  # it ended meanwhile


RELEASE_TRIES = 3  # right after a node failure Slurm may answer "try again in a bit"


def release_nodes(job_id, nodes, cwd):
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
