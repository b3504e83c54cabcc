"""The supervisor process in the batch script: one attempt, then the next one submitted.

`python supervisor.pyz OPTIONS -- LAUNCH...` (the batch script `exec`s it, so that
`--signal=B:USR1@grace` reaches it). Stdlib only, Python 3.8+; every Slurm command
has a timeout; nothing is built from what a rank wrote.
"""
import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from cluster_kit.analysis import culprit as culprits
from cluster_kit.analysis import rank_files
from cluster_kit.hostlist import NodeSet
from cluster_kit.slurm import outcome
from cluster_kit.supervisor import decide, record

POLL_S = 1.0
DUMP_WAIT_S = 20.0  # how long the ranks get to answer a dump request
STOP_WAIT_S = 15.0  # SIGTERM to the launch, then SIGKILL
SLURM_TIMEOUT_S = 60.0
STACK_CHARS = 4000  # of each rank's stack kept in the record
KEPT_LINES = 400  # srun / slurmstepd lines kept to read how the launch ended
SLURM_LINE = ("srun:", "slurmstepd", "srun ")


def say(message):
    sys.stderr.write(f"clusterkit supervisor: {message}\n")
    sys.stderr.flush()


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="clusterkit-supervisor")
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--tasks-per-node", type=int, required=True)
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument("--hang-timeout", type=float, default=300.0)
    parser.add_argument("--startup-timeout", type=float, default=0.0, help="0: max(hang timeout, 600 s)")
    parser.add_argument("--exclude", choices=("blamed", "never"), default="blamed")
    parser.add_argument("--grace", type=int, default=120)
    parser.add_argument("--max-time-requeues", type=int, default=5)
    parser.add_argument("--checkpoint-dir", default="")
    parser.add_argument("--preflight-failed", default="", help="nodes (comma-separated) the in-job preflight failed")
    parser.add_argument("--script", required=True, help="the batch script, to submit the next attempt")
    parser.add_argument("--bundle", default="", help="this zip app, removed once loaded")
    parser.add_argument("launch", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.launch[:1] == ["--"]:
        args.launch = args.launch[1:]
    if not args.launch:
        parser.error("no launch command after --")
    return args


def resilience_of(args):
    return {"max_restarts": args.max_restarts, "hang_timeout": args.hang_timeout,
            "startup_timeout": args.startup_timeout or None, "exclude": args.exclude,
            "grace": args.grace, "max_time_requeues": args.max_time_requeues,
            "checkpoint_dir": args.checkpoint_dir or None}


# --- Slurm ------------------------------------------------------------------------------
def slurm(argv, env=None):
    """stdout of a Slurm command; raises RuntimeError with its stderr."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, env=env,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{argv[0]}: {exc}")
    if done.returncode != 0:
        raise RuntimeError("{} failed: {}".format(" ".join(argv[:2]), done.stderr.strip() or done.returncode))
    return done.stdout


def show_job(job_id):
    """`scontrol show job -o` as {key: value} (values without spaces, as Slurm prints them)."""
    fields = {}
    for token in slurm(["scontrol", "show", "job", "-o", job_id]).split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def hostnames(nodelist):
    try:
        return list(NodeSet(nodelist))
    except ValueError:
        return []


def failed_nodes(nodes):
    """Allocated nodes Slurm marks DOWN, FAIL or not responding."""
    bad = []
    for node in nodes:
        try:
            text = slurm(["scontrol", "show", "node", "-o", node])
        except RuntimeError:
            continue
        state = next((t.split("=", 1)[1] for t in text.split() if t.startswith("State=")), "")
        if any(word in state for word in ("DOWN", "FAIL", "NOT_RESPONDING")) or state.endswith("*"):
            bad.append(node)
    return bad


def partition_nodes(job):
    """The nodes of the job's partition ([] when Slurm does not say)."""
    try:
        return slurm(["sinfo", "-h", "-N", "-p", job.get("Partition", ""), "-o", "%N"]).split()
    except RuntimeError:
        return []


def submit_next(folder, job_id, chain_id, exclude, script):
    """sbatch the next attempt, to start once this job ended; its job id."""
    # append: an output path without %j is every attempt's, and sbatch would truncate it
    argv = ["sbatch", "--parsable", f"--dependency=afterany:{job_id}", "--kill-on-invalid-dep=yes",
            "--open-mode=append"]
    if exclude:
        argv.append(f"--exclude={NodeSet.of(exclude)}")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) or k == "SLURM_CONF"}
    env.update(CLUSTERKIT_CHAIN_ID=chain_id, CLUSTERKIT_RECORD_DIR=folder)
    return slurm(argv + [script], env=env).strip().split(";")[0]


# --- the attempt -------------------------------------------------------------------------
class Attempt:
    """One launch under watch: signals, heartbeats, the launch's Slurm lines."""

    def __init__(self, args, control, env, nodes):
        self.args = args
        self.control = control
        self.env = env
        self.nodes = nodes  # the attempt's nodes, in Slurm's order
        self.grace = False
        self.cancelled = False
        self.proc = None
        self.lines = []

    def on_grace(self, signum, frame):
        self.grace = True
        try:
            fd = os.open(os.path.join(self.control, "stop"), os.O_WRONLY | os.O_CREAT, 0o600)
            os.close(fd)
        except OSError as exc:
            say(f"cannot write the stop file: {exc}")

    def on_cancel(self, signum, frame):
        self.cancelled = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def start(self):
        signal.signal(signal.SIGUSR1, self.on_grace)
        signal.signal(signal.SIGTERM, self.on_cancel)
        signal.signal(signal.SIGINT, self.on_cancel)
        self.proc = subprocess.Popen(self.args.launch, env=self.env, stderr=subprocess.PIPE)
        thread = threading.Thread(target=self._copy_stderr, daemon=True)
        thread.start()
        return thread

    def _copy_stderr(self):
        """The launch's stderr goes on to the job's, and srun's own lines are kept."""
        out = getattr(sys.stderr, "buffer", None)
        for raw in iter(self.proc.stderr.readline, b""):
            if out is not None:
                out.write(raw)
                out.flush()
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith(SLURM_LINE) or "slurmstepd" in line:
                self.lines = (self.lines + [line])[-KEPT_LINES:]

    def heartbeats(self, clock):
        for rank, path in rank_files.rank_paths(os.path.join(self.control, "heartbeat"), "").items():
            try:
                beat = rank_files.parse_heartbeat(rank_files.read_text(path))
            except (OSError, ValueError):
                continue
            clock.observe(rank, beat.steps, beat.time, beat.paused_since, beat.resumed_at)

    def watch(self, clock):
        """Until the launch exits, or a hang is diagnosed: (exit code, hang or None)."""
        while True:
            code = self.proc.poll()
            if code is not None:
                return code, None
            self.heartbeats(clock)
            now = time.time()
            stalled = [] if (self.grace or self.cancelled) else clock.stalled(now)
            if stalled:
                say(f"ranks {culprits.format_ranks(stalled)} finished no step for {now - clock.stalled_since(stalled):.0f} s: asking every rank for its stack and "
                    "collectives")
                hang = self.diagnose_hang(clock, stalled)
                self.stop_launch()
                return self.proc.wait(), hang
            time.sleep(POLL_S)

    def diagnose_hang(self, clock, stalled):
        request = f"hang-{int(time.time())}"
        path = os.path.join(self.control, "dump-request")
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(request + "\n")
        os.replace(tmp, path)
        dumps = os.path.join(self.control, "dumps", request)
        deadline = time.time() + DUMP_WAIT_S
        world = self.args.world_size
        while time.time() < deadline and len(rank_files.rank_paths(dumps, ".done")) < world:
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        files = rank_files.read_dump_folder(self.control, request)
        verdict = culprits.find_culprit(files, world)
        hosts = list(verdict.hosts) or [self.host_of(r) for r in verdict.ranks]
        hang = decide.culprit_of(verdict.ranks, hosts, verdict.evidence)
        hang["stacks"] = {str(r): f.stack.text[-STACK_CHARS:] for r, f in files.items() if f.stack}
        hang["detected_after_s"] = round(time.time() - clock.stalled_since(stalled), 1)
        return hang

    def host_of(self, rank):
        """The node of a rank that told nothing: srun places ranks node by node."""
        index = rank // max(1, self.args.tasks_per_node)
        return self.nodes[index] if index < len(self.nodes) else ""

    def stop_launch(self):
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def first_attempt_setup(folder, args, job):
    """The record's start: the script to resubmit and the nodes the job was sent without."""
    copy = os.path.join(folder, "job.sbatch")
    if not os.path.exists(copy):
        shutil.copyfile(args.script, copy)
        os.chmod(copy, 0o600)
    exc = job.get("ExcNodeList", "(null)")
    return [] if exc in ("", "(null)") else [exc]


def close_lost_attempts(rec, job_id):
    """An attempt still `running` in the record lost its batch script (Slurm requeued
    the job after a node failure): it ended as a node failure."""
    for attempt in rec["attempts"]:
        if attempt.get("ended") == "running":
            attempt.update(ended="node_failure", ended_at=time.time(),
                           why=f"its batch script was killed (job {job_id} was requeued by Slurm)")


def run(args):
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id:
        say("SLURM_JOB_ID is not set: the supervisor runs inside a Slurm batch job")
        return 2
    chain_id = os.environ.get("CLUSTERKIT_CHAIN_ID") or job_id
    job = show_job(job_id)
    folder = os.environ.get("CLUSTERKIT_RECORD_DIR") or record.folder_for(job.get("StdOut", ""), chain_id)
    record.make_private_dir(folder)
    rec = record.load(folder) or record.new_record(chain_id, resilience_of(args))
    if rec.get("final") and rec["attempts"] and rec["attempts"][-1].get("ended") == "preempted":
        say(f"the chain of job {chain_id} ended ({rec['final']['why']}): this requeued run does not train")
        return rec["final"]["exit_code"]
    if not rec["attempts"]:
        rec["start_exclude"] = first_attempt_setup(folder, args, job)
    close_lost_attempts(rec, job_id)
    number = len(rec["attempts"])
    nodes = os.environ.get("SLURM_JOB_NODELIST", "")
    attempt = {"attempt": number, "slurm_job_id": job_id, "nodes": nodes, "started_at": round(time.time(), 3),
               "ended": "running", "output": job.get("StdOut", "")}
    rec["attempts"].append(attempt)
    record.save(folder, rec)

    control = os.path.join(folder, f"attempt-{number}")
    record.make_private_dir(control)
    checkpoint = args.checkpoint_dir or os.path.join(folder, "checkpoint")
    os.makedirs(checkpoint, mode=0o700, exist_ok=True)
    env = dict(os.environ, CLUSTERKIT_CONTROL_DIR=control, CLUSTERKIT_ATTEMPT=str(number),
               CLUSTERKIT_CHECKPOINT_DIR=checkpoint, CLUSTERKIT_RECORD_DIR=folder, CLUSTERKIT_CHAIN_ID=chain_id)
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    say(f"attempt {number} of job {chain_id} on {nodes} (record: {folder})")

    watched = Attempt(args, control, env, hostnames(nodes))
    failed = [n for n in args.preflight_failed.split(",") if n]
    if failed:
        say("the in-job preflight failed on {}: training was not started".format(",".join(failed)))
        code = 1
        ended, blamed = decide.attempt_end(code, failed_nodes=failed)
        blamed["evidence"] = "the in-job preflight failed on {} (see its lines above)".format(",".join(failed))
    else:
        started = time.time()
        copier = watched.start()
        code, hang = watched.watch(decide.HangClock(args.world_size, args.hang_timeout, started,
                                                    args.startup_timeout or None))
        copier.join(timeout=10)
        ended, blamed = end_of(watched, code, hang)
        if ended == "cancelled" and requeued_since(job_id, job.get("Restarts", "0")):
            ended, blamed = "preempted", None
    attempt.update(ended=ended, ended_at=round(time.time(), 3), exit_code=code)
    if blamed:
        attempt["culprit"] = {k: blamed[k] for k in ("ranks", "hosts", "evidence")}
        attempt.update({k: blamed[k] for k in ("stacks", "detected_after_s") if k in blamed})
    step = decide.next_step(rec, ended, decide.excludable(blamed, watched.nodes), rec["resilience"], code,
                            partition_nodes(job),
                            int(job.get("NumNodes", "0").split("-")[0] or 0))
    return finish_attempt(rec, attempt, step, folder, job_id, chain_id)


def requeued_since(job_id, restarts):
    """Whether Slurm requeued the job after the run that saw `restarts` (scontrol's
    Restarts= counts the requeues; it has gone up by the time the batch script gets
    SIGTERM, where a cancelled job's has not)."""
    try:
        now = show_job(job_id).get("Restarts", "0")
    except RuntimeError:
        return False
    return now.isdigit() and str(restarts).isdigit() and int(now) > int(restarts)


def end_of(watched, code, hang):
    """How the attempt ended, and the culprit."""
    crash = first_task = None
    down = []
    if hang is None and code != 0 and not (watched.grace or watched.cancelled):
        verdict = outcome.parse_job_output("\n".join(watched.lines))
        first_task = verdict.first_failure
        down = list(verdict.failed_nodes) or failed_nodes(watched.nodes)
        crash = culprits.first_failure(rank_files.read_exceptions(watched.control))
        if crash is not None and not crash.host and first_task is not None:
            crash = dataclasses.replace(crash, host=first_task.node)
    return decide.attempt_end(code, hang=hang, grace=watched.grace, cancelled=watched.cancelled, crash=crash,
                              first_task=first_task, failed_nodes=down)


def finish_attempt(rec, attempt, step, folder, job_id, chain_id):
    attempt["why"] = step["why"]
    if step["action"] == "requeued":
        pass  # the same job runs again: nothing to submit, and the chain goes on
    elif step["action"] == "restart":
        attempt["excluded"] = [n for n in step["exclude"] if n not in record.excluded_nodes(rec)]
        rec["exclude"] = step["exclude"]
        try:
            exclude = list(rec.get("start_exclude") or []) + step["exclude"]
            attempt["next_job_id"] = submit_next(folder, job_id, chain_id, exclude,
                                                 os.path.join(folder, "job.sbatch"))
        except RuntimeError as exc:
            rec["final"] = {"ended": attempt["ended"], "exit_code": 1,
                            "why": "{}; the next attempt could not be submitted: {}".format(step["why"], exc)}
    else:
        rec["final"] = {"ended": attempt["ended"], "exit_code": step["exit_code"], "why": step["why"]}
    record.save(folder, rec)
    if rec["final"] is not None and attempt["ended"] == "preempted":
        cancel_requeued(job_id)
    evidence = (attempt.get("culprit") or {}).get("evidence")
    told = f"attempt {attempt['attempt']} ended: {attempt['ended']}"
    if evidence:
        told += f" ({evidence})"
    if "next_job_id" in attempt:
        say("{}; {}; next attempt: job {}".format(told, step["why"], attempt["next_job_id"]))
    else:
        say("{}; {}".format(told, (rec["final"] or {}).get("why", step["why"])))
    return step["exit_code"] if rec["final"] is None else rec["final"]["exit_code"]


def cancel_requeued(job_id):
    """The chain ended on a requeue by Slurm: cancel the requeued job (its run, if it
    starts anyway, reads the record's end and stops at once)."""
    try:
        slurm(["scancel", job_id])
    except RuntimeError as exc:
        say(f"cannot cancel the requeued job {job_id}: {exc}")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.bundle:
        try:
            os.unlink(args.bundle)  # every module is loaded by now
        except OSError:
            pass
    try:
        return run(args)
    except RuntimeError as exc:
        say(str(exc))
        return 1
