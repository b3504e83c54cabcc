"""The supervisor process in the batch script: one attempt, then the next one submitted.

`python supervisor.pyz OPTIONS -- LAUNCH...` (the batch script `exec`s it, so that
`--signal=B:USR1@grace` reaches it). Stdlib only, Python 3.8+; every Slurm command
has a timeout (slurmctl.py); nothing is built from what a rank wrote.

Which chain a job belongs to comes from Slurm and the record, never from the
environment: a restart carries `clusterkit-chain=<first job id>` in its Slurm
comment, and its record (a folder of this user that nobody else can write,
private.py) must list it as the attempt that comes next.
"""
import argparse
import os
import socket
import sys
import time

from cluster_kit.analysis import culprit as culprits
from cluster_kit.analysis import rank_files
from cluster_kit.hostlist import NodeSet
from cluster_kit.slurm import builders, node_names, outcome
from cluster_kit.supervisor import decide, launch, private, record, slurmctl
from cluster_kit.supervisor.attempt import Attempt, say
from cluster_kit.trainer import contract
from cluster_kit.trainer.checkpoint import interval
from cluster_kit.trainer.checkpoint import status as checkpoint_status

SCRIPT_NAME = "job.sbatch"
AGAIN = object()  # settle's word for: the next attempt runs in this allocation
TERM_WAIT_S = 300.0  # after SIGTERM, the launch is waited for (Slurm's SIGKILL ends it sooner)
REQUEUE_UPDATE_S = 3.0  # what Slurm's KillWait leaves for setting a requeued job's excluded nodes


class Refused(RuntimeError):
    """The job does not train: the message says why and what to do."""


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="clusterkit-supervisor")
    parser.add_argument("--nodes", type=int, required=True, help="the job's nodes (without its spares)")
    parser.add_argument("--tasks-per-node", type=int, required=True, help="ranks per node")
    parser.add_argument("--spare-nodes", type=int, default=0)
    parser.add_argument("--min-nodes", type=int, default=0, help="0: --nodes")
    parser.add_argument("--checkpoint-every", default="")
    parser.add_argument("--keep-checkpoints", type=int, default=0)
    parser.add_argument("--mtbf-hours", type=float, default=0.0)
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument("--hang-timeout", type=float, default=300.0)
    parser.add_argument("--startup-timeout", type=float, default=0.0, help="0: max(hang timeout, 600 s)")
    parser.add_argument("--exclude", choices=("blamed", "never"), default="blamed")
    parser.add_argument("--exclude-on", choices=decide.EXCLUDE_ON, default="node_faults")
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
            "startup_timeout": args.startup_timeout or None, "exclude": args.exclude, "exclude_on": args.exclude_on,
            "grace": args.grace, "max_time_requeues": args.max_time_requeues,
            "checkpoint_dir": args.checkpoint_dir or None, "spare_nodes": args.spare_nodes,
            "min_nodes": args.min_nodes or None, "checkpoint_every": args.checkpoint_every or None,
            "keep_checkpoints": args.keep_checkpoints or None, "mtbf_hours": args.mtbf_hours or None}


# --- the chain's record -------------------------------------------------------------------
def open_chain(job_id, job, comment, args):
    """(chain id, record folder, record) of this job (`job`: scontrol's fields, `comment`:
    its Slurm comment), trusted; Refused when it cannot be."""
    chain_id = slurmctl.chain_of(comment) or job_id
    folder = record.folder_for(job.get("StdOut", ""), chain_id)
    record.make_private_dir(folder)
    rec = record.load(folder)
    if chain_id != job_id:
        if rec is None or str(rec.get("job_id")) != chain_id or not lists_job(rec, job_id):
            raise Refused(f"job {job_id} was submitted as an attempt of the chain of job {chain_id}, but that "
                          f"chain's record ({os.path.join(folder, record.RECORD_NAME)}) does not name it as its "
                          "next attempt; nothing was run")
        return chain_id, folder, rec
    if rec is not None and str(rec.get("job_id")) != job_id:
        raise Refused(f"{folder} holds the record of job {rec.get('job_id')}, not of job {job_id}; nothing was run")
    if rec is None:
        rec = record.new_record(job_id, resilience_of(args))
    return chain_id, folder, rec


def lists_job(rec, job_id):
    """Whether the record names `job_id` as one of its attempts, as the one submitted next,
    or as the standby job."""
    return (any(job_id in (str(a.get("slurm_job_id")), str(a.get("next_job_id"))) for a in rec["attempts"])
            or str((rec.get("standby") or {}).get("job_id")) == job_id)


def keep_script(folder, rec, script_path):
    """Copy the batch script into the record folder (attempt 0) and keep its digest:
    only that script is ever submitted again."""
    with open(script_path, "rb") as f:
        data = f.read()
    private.write(os.path.join(folder, SCRIPT_NAME), data)
    rec["script_digest"] = private.digest(data)


def kept_script(folder, rec):
    """The bytes of the script copy, once they match the digest kept at attempt 0."""
    path = os.path.join(folder, SCRIPT_NAME)
    data = private.read(path)
    if data is None or not rec.get("script_digest") or private.digest(data) != rec["script_digest"]:
        raise Refused(f"{path} is not the script attempt 0 kept (its digest differs, or it is gone): "
                      "the next attempt was not submitted")
    return data


def nccl_dump_env(control, environ):
    """Where NCCL's watchdog writes its Flight Recorder on a collective timeout (a
    folder of the control folder: torch does not create it), unless the job says."""
    prefix = contract.nccl_dump_prefix(control)
    record.make_private_dir(os.path.dirname(prefix))
    wanted = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": prefix}
    return {k: v for k, v in wanted.items() if k not in environ}


def slurm_names(culprit, nodes):
    """The culprit with its hosts as the allocation's Slurm names (a rank reports
    SLURMD_NODENAME, else its host name: an FQDN or a cloud name is matched against the
    nodes' NodeHostName and NodeAddr); a host that is none of them is kept apart."""
    if not culprit or not culprit.get("hosts"):
        return culprit
    table = node_table(nodes)
    if table is None:  # Slurm did not answer: the allocation's own names still are Slurm names
        return decide.on_slurm_names(culprit, {h: h for h in culprit["hosts"] if h in nodes})
    known = {n.name for n in table}
    resolved = {h: addresses_of(h) for h in culprit["hosts"] if h not in known}
    return decide.on_slurm_names(culprit, node_names.slurm_names(culprit["hosts"], table, resolved))


NODE_TABLE_TRIES = 3


def node_table(nodes, tries=NODE_TABLE_TRIES, pause=2.0):
    """`scontrol show node` of the allocation's nodes, asked again when it fails (Slurm
    busy with a failed node); None when it never answered."""
    argv = builders.build_scontrol_show_nodes(",".join(nodes))
    for attempt in range(tries):
        try:
            return builders.parse_scontrol_show_nodes(slurmctl.slurm(argv))
        except (RuntimeError, ValueError) as exc:
            if attempt == tries - 1:
                say(f"cannot read the allocation's nodes from Slurm ({exc}): blaming by the names ranks reported")
                return None
            time.sleep(pause)
    return None


def addresses_of(host):
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None)})
    except OSError:
        return []


def checkpoint_env(args, rec, folder, nodes):
    """What cluster_kit.checkpoint reads in the ranks: the job's checkpoint settings, the
    failure rate of this chain and of the user's earlier chains beside it, and this
    chain's restart time, for `checkpoint_every: auto`."""
    run_s, failures, restart_s = decide.chain_history(rec["attempts"])
    earlier_s, earlier_failures = decide.earlier_history(record.earlier(folder), nodes)
    run_s, failures = run_s + earlier_s, failures + earlier_failures
    env = {contract.CHAIN_ENV: str(rec["job_id"]),
           contract.MTBF_ENV: "{:.0f}".format(interval.estimate_mtbf_s(
               run_s, failures, nodes, args.mtbf_hours or interval.DEFAULT_MTBF_HOURS))}
    if restart_s is not None:
        env[contract.RESTART_ENV] = f"{restart_s:.1f}"
    if args.checkpoint_every:
        env[contract.CHECKPOINT_EVERY_ENV] = args.checkpoint_every
    if args.keep_checkpoints:
        env[contract.KEEP_CHECKPOINTS_ENV] = str(args.keep_checkpoints)
    return env


def close_lost_attempts(rec, job_id):
    """An attempt still `running` in the record lost its batch script: the node of the
    batch script failed (this is the standby job, or Slurm requeued the job). It ended as
    a node failure of the nodes Slurm says failed. False when no node failed: the batch
    script was ended by a cancel, not a fault, and the chain ends as cancelled."""
    for attempt in rec["attempts"]:
        if attempt.get("ended") != "running":
            continue
        nodes = slurmctl.hostnames(attempt.get("allocation") or attempt.get("nodes") or "")
        down = slurmctl.failed_nodes(nodes)
        now = round(time.time(), 3)
        attempt.update(ended="node_failure", ended_at=now, why=f"its batch script was killed (job {job_id} took over)")
        if not down and str(attempt.get("slurm_job_id")) != job_id:
            attempt.update(ended="cancelled", why=f"its batch script ended and no node of it failed: the chain was "
                                                  f"cancelled (job {job_id}, its standby, does not train)")
            rec["final"] = {"ended": "cancelled", "exit_code": 1, "why": attempt["why"]}
            return False
        if down:
            attempt["culprit"] = decide.recorded_culprit(decide.culprit_of(
                [], down, "Slurm reports node {} failed; the batch script ran on {}".format(
                    ",".join(down), attempt.get("batch_host") or "?")))
            attempt["excluded"] = [n for n in down if n not in record.excluded_nodes(rec)]
            rec["exclude"] = record.excluded_nodes(rec) + attempt["excluded"]
            since = [t for t in (decide.slurm_time(at) for at in slurmctl.reason_times(down).values()) if t]
            attempt["detected_after_s"] = round(max(0.0, now - max(since)), 1) if since else 0.0
    return True


def keep_standby(rec, folder, job_id, chain_id):
    """A job that goes on with the chain only if this one dies with its batch script (its
    node failed: with --no-kill Slurm does not requeue the job then, it fails it):
    `--dependency=afternotok` on this job. Every end the supervisor sees cancels it."""
    standby = rec.get("standby") or {}
    if standby.get("after") == job_id:
        return  # this job runs again (Slurm requeued it): its standby still waits
    try:
        exclude = chain_exclude(rec)
        comment = slurmctl.user_comment(slurmctl.job_comment(job_id))
        rec["standby"] = {"job_id": slurmctl.submit_next(kept_script(folder, rec), job_id, chain_id, exclude,
                                                          comment, after="afternotok"), "after": job_id}
    except (RuntimeError, private.Untrusted) as exc:
        say(f"no standby job (the chain ends if the batch script's node fails): {exc}")
        rec["standby"] = None


def chain_exclude(rec):
    """The nodes every start of the chain goes without: the first submit's --exclude and
    the nodes the chain excluded."""
    named = slurmctl.hostnames(",".join(list(rec.get("start_exclude") or []) + record.excluded_nodes(rec)))
    return list(dict.fromkeys(named))


def exclude_standby(rec):
    """The waiting standby job leaves out what the chain excludes now (its list was
    fixed when it was submitted)."""
    standby = rec.get("standby") or {}
    if standby.get("job_id") and not slurmctl.set_excluded(str(standby["job_id"]), chain_exclude(rec)):
        say(f"cannot update the excluded nodes of the standby job {standby['job_id']}; it leaves them out "
            "when it starts")


def drop_standby(rec, job_id):
    """Cancel this job's standby: the supervisor saw the attempt end and took the next step."""
    standby = rec.get("standby") or {}
    if standby.get("after") != job_id:
        return
    try:
        slurmctl.cancel(str(standby["job_id"]))
    except RuntimeError as exc:
        say(f"cannot cancel the standby job {standby['job_id']}: {exc}")
    rec["standby"] = None


# --- the attempts of this job ---------------------------------------------------------
class Allocation:
    """This job's nodes: those an attempt may use, those released to Slurm, the batch host."""

    def __init__(self, job_id, nodelist, batch_host, unusable=(), folder="."):
        self.job_id = job_id
        self.nodes = slurmctl.hostnames(nodelist)
        self.batch_host = batch_host or (self.nodes[0] if self.nodes else "")
        self.usable = [n for n in self.nodes if n not in unusable]
        self.released = []
        self.folder = folder  # scontrol's resize files go there, not into the job's folder

    def drop(self, nodes):
        """Train without `nodes` from now on, and hand those Slurm can take back (all but
        the batch script's own) to it; the nodes released."""
        self.usable = [n for n in self.usable if n not in nodes]
        freed = [n for n in nodes if n != self.batch_host and n not in self.released]
        if not freed:
            return []
        try:
            released = slurmctl.release_nodes(self.job_id, freed, self.folder)
        except RuntimeError as exc:
            say(f"cannot hand {NodeSet.of(freed)} back to Slurm: {exc}")
            return []
        self.released += released
        return released


def run(args):
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id:
        say("SLURM_JOB_ID is not set: the supervisor runs inside a Slurm batch job")
        return 2
    job = slurmctl.show_job(job_id)
    chain_id, folder, rec = open_chain(job_id, job, slurmctl.job_comment(job_id), args)
    record.take_lock(folder, job_id)
    try:
        return run_chain(args, job_id, job, chain_id, folder, record.load(folder) or rec)
    finally:
        record.release_lock(folder, job_id)


def run_chain(args, job_id, job, chain_id, folder, rec):
    """This job's part of the chain, with the chain's lock held."""
    if rec.get("final"):
        say(f"the chain of job {chain_id} ended ({rec['final']['why']}): job {job_id} does not train")
        return rec["final"]["exit_code"]
    if not rec["attempts"]:
        keep_script(folder, rec, args.script)
        exc = job.get("ExcNodeList", "(null)")
        rec["start_exclude"] = [] if exc in ("", "(null)") else slurmctl.hostnames(exc)
    if not close_lost_attempts(rec, job_id):
        drop_standby(rec, str((rec.get("standby") or {}).get("after") or ""))
        record.save(folder, rec)
        say(rec["final"]["why"])
        return rec["final"]["exit_code"]
    keep_standby(rec, folder, job_id, chain_id)
    try:
        return run_attempts(args, job_id, job, chain_id, folder, rec)
    except Exception:
        drop_standby(rec, job_id)  # a supervisor that fails must not be taken over, again and again
        record.save(folder, rec)
        raise


def run_attempts(args, job_id, job, chain_id, folder, rec):
    """The attempts of this job, in its allocation, until one is not restarted in it."""
    failed = [n for n in args.preflight_failed.split(",") if n]
    here = Allocation(job_id, os.environ.get("SLURM_JOB_NODELIST", ""), os.environ.get("SLURMD_NODENAME", ""),
                      failed, folder)
    least = args.min_nodes or args.nodes
    if not leave_out_excluded(rec, here, args, job_id, folder):
        return 0
    if failed and launch.step_nodes(here.usable, args.nodes, least) is not None:
        released = here.drop(failed)
        say("the in-job preflight failed on {}: training without {} ({})".format(
            ",".join(failed), "it" if len(failed) == 1 else "them",
            f"released {NodeSet.of(released)}" if released else "kept: the batch script runs there"))
        failed = []
    number_here, previous = 0, None
    while True:
        plan = launch.step_nodes(here.usable, args.nodes, least) if not failed else None
        if previous is not None:
            end_steps(job_id, previous)
        attempt, watched = start_attempt(rec, folder, job_id, job, chain_id, args, here, plan, number_here)
        if plan is None:
            say("the in-job preflight failed on {}: training was not started".format(",".join(failed)))
            code = 1
            ended, blamed = decide.attempt_end(code, failed_nodes=failed)
            blamed["evidence"] = "the in-job preflight failed on {} (see its lines above)".format(",".join(failed))
            blamed["detected_after_s"] = 0.0  # found before the attempt started
        else:
            guard = start_guard(job_id, here, plan)
            try:
                code, ended, blamed = watch_attempt(watched, args, job_id, job, previous)
            finally:
                slurmctl.stop_guard(guard, 0.0 if watched.terminated else 5.0)
        outcome = settle(rec, attempt, folder, job_id, job, chain_id, watched, code, ended, blamed, here, args)
        if outcome is not AGAIN:
            return outcome
        number_here += 1
        previous = watched


def leave_out_excluded(rec, here, args, job_id, folder):
    """An allocation that holds nodes the chain excluded (a requeue by someone else, or a
    standby job submitted before they were excluded) trains without them: they are
    released when the job's nodes fit in the rest; else the chain moves on as a new job
    without them, named as the next job of the attempt before, and this one does not
    train (False)."""
    excluded = [n for n in here.usable if n in chain_exclude(rec)]
    if not excluded:
        return True
    if launch.step_nodes([n for n in here.usable if n not in excluded], args.nodes,
                         args.min_nodes or args.nodes) is not None:
        released = here.drop(excluded)
        say("{} {} excluded by an earlier attempt: training without {} ({})".format(
            NodeSet.of(excluded), "was" if len(excluded) == 1 else "were", "it" if len(excluded) == 1 else "them",
            f"released {NodeSet.of(released)}" if released else "kept: the batch script runs there"))
        return True
    last = rec["attempts"][-1]
    comment = slurmctl.user_comment(slurmctl.job_comment(job_id))
    last["next_job_id"] = slurmctl.submit_next(kept_script(folder, rec), job_id, rec["job_id"], chain_exclude(rec),
                                               comment)
    last["without"] = chain_exclude(rec)
    last["why"] = "{}; job {} got {}, which the chain excluded: moved to job {}".format(
        last.get("why") or last.get("ended"), job_id, NodeSet.of(excluded), last["next_job_id"])
    drop_standby(rec, job_id)
    record.save(folder, rec)
    say(f"the allocation holds {NodeSet.of(excluded)}, which the chain excluded, and too few nodes without them: "
        f"the chain goes on as job {last['next_job_id']} without them; job {job_id} does not train")
    return False


def end_steps(job_id, previous):
    """Every step of the attempt that ended is gone before the next one starts (a hung
    rank's step could outlive a kill Slurm did not list)."""
    steps = [previous.step.split(".", 1)[1]] if previous.step else []
    left = slurmctl.end_steps(job_id, steps)
    if left:
        say("steps {} of job {} are still listed by Slurm after being killed; the next attempt starts "
            "beside them".format(",".join(left), job_id))


def start_guard(job_id, here, plan):
    """The guard step, on a node of the attempt other than the batch script's (none for
    a job of one node): it cancels the job if the batch script's node dies, so that the
    standby job can take over."""
    other = next((n for n in plan if n != here.batch_host), None)
    if other is None or not here.batch_host:
        return None
    return slurmctl.start_guard(job_id, other, here.batch_host, sys.executable, slurmctl.slurmd_timeout())


def start_attempt(rec, folder, job_id, job, chain_id, args, here, plan, number_here):
    """Append the attempt to the record and make its control folder; the attempt and its
    Attempt (not started)."""
    number = len(rec["attempts"])
    nodes = plan if plan is not None else here.nodes
    attempt = {"attempt": number, "slurm_job_id": job_id, "nodes": str(NodeSet.of(nodes)),
               "allocation": os.environ.get("SLURM_JOB_NODELIST", ""), "batch_host": here.batch_host,
               "started_at": round(time.time(), 3),
               "ended": "running", "output": job.get("StdOut", "")}
    before = rec["attempts"][-1] if rec["attempts"] else {}
    if before.get("ended_at"):  # how long the restart (a requeue, a new job) waited to run
        attempt["waited_s"] = round(max(0.0, attempt["started_at"] - float(before["ended_at"])), 1)
    rec["attempts"].append(attempt)
    record.save(folder, rec)
    control = os.path.join(folder, f"attempt-{number}")
    record.make_private_dir(control)
    checkpoint = args.checkpoint_dir or os.path.join(folder, "checkpoint")
    os.makedirs(checkpoint, mode=0o700, exist_ok=True)
    env = dict(os.environ, MASTER_ADDR=nodes[0] if nodes else "",
               MASTER_PORT=str(launch.step_port(os.environ.get("MASTER_PORT", "29500"), number_here)))
    env.update({contract.CONTROL_DIR_ENV: control, contract.ATTEMPT_ENV: str(number),
                contract.CHECKPOINT_DIR_ENV: checkpoint})
    env.update(checkpoint_env(args, rec, folder, len(nodes)))
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    env.update(nccl_dump_env(control, env))
    where = f" (allocation {attempt['allocation']})" if here.nodes != nodes else ""
    say(f"attempt {number} of job {chain_id} on {attempt['nodes']}{where} (record: {folder})")
    watched = Attempt(job_id, launch.step_argv(args.launch, nodes), control, env, nodes,
                      len(nodes) * args.tasks_per_node, args.tasks_per_node)
    return attempt, watched


def watch_attempt(watched, args, job_id, job, previous=None):
    """(exit code or None, ended, culprit) of the launch."""
    started = time.time()
    copier = watched.start(previous)
    seen = watched.watch(decide.HangClock(watched.world_size, args.hang_timeout, started,
                                          args.startup_timeout or None))
    if seen.why == "signal":
        return signalled(watched, job_id, job)
    copier.join(timeout=10)
    if seen.why == "hang":
        return (seen.code, "hang", seen.culprit)
    if seen.why == "nodes":
        return (seen.code, "node_failure", seen.culprit)
    ended, blamed = end_of(watched, seen.code, job)
    return seen.code, ended, blamed


def signalled(watched, job_id, job):
    """SIGTERM came: scancel, the time limit, or preemption. The stop file is written
    already; what comes next is settled before the launch is waited for, since Slurm
    kills this script too once its KillWait (or GraceTime) is over. A job Slurm requeued
    (someone's `scontrol requeue`, preemption without grace time) gets the chain's
    excluded nodes as its ExcNodeList now, while Slurm still takes it."""
    try:
        now = slurmctl.show_job(job_id)
    except RuntimeError:
        now = {}
    cause = decide.term_cause(job, now)
    if cause == "cancelled" and watched.proc.poll() is None:
        watched.stop_launch()
    say({"requeued": "Slurm requeued the job", "preempted": "the job is preempted",
         "time_limit": "the job reached its time limit", "cancelled": "the job was cancelled"}[cause]
        + ("; the ranks were told to stop" if cause != "cancelled" else ""))
    ended = {"requeued": "preempted"}.get(cause, cause)
    return watched.proc.poll(), ended, None


def stop_of(watched):
    """(told, ending) of an attempt whose launch ended: whether the ranks were told to
    stop and none reported that training finished, so that it is requeued, never
    counted as completed. The supervisor's grace signal is the time limit; a SIGTERM
    the ranks got from Slurm counts only while Slurm preempts the job (PreemptTime:
    with a partition's GraceTime its steps are signalled, not the batch script), since
    srun sends the same SIGTERM to every task once one of them failed."""
    if rank_files.read_notes(watched.control, contract.FINISHED):
        return False, ""
    if watched.grace:
        return True, "time_limit"
    causes = {n.what for n in rank_files.read_notes(watched.control, contract.STOPPED).values()}
    if "SIGUSR1" in causes:  # the job's own --signal=USR1@N to its steps: the time limit ahead
        return True, "time_limit"
    if not causes:
        return False, ""
    try:
        preempted = decide.preempting(slurmctl.show_job(watched.job_id))
    except RuntimeError:
        preempted = False
    if preempted:
        say("Slurm preempts the job: the ranks were told to stop ({}) and did not report that training "
            "finished".format(", ".join(sorted(causes))))
    return preempted, "preempted" if preempted else ""


def memory_of(job):
    """The job's memory as Slurm holds it (`300M per node`, `2000M per CPU`), '' when unknown."""
    for key, unit in (("MinMemoryNode", "node"), ("MinMemoryCPU", "CPU")):
        value = job.get(key, "")
        if value and value not in ("0", "(null)"):
            return f"{value} per {unit}"
    return ""


def end_of(watched, code, job=None):
    """How the attempt ended, and the culprit."""
    told, cause = stop_of(watched)
    if told:
        return cause, None
    crash = first_task = None
    down = []
    if code != 0:
        failed = watched.failed_nodes(time.time())  # with Slurm's state and reason
        if failed is not None:
            return "node_failure", failed
        verdict = outcome.parse_job_output("\n".join(watched.lines))
        first_task = verdict.first_failure
        down = list(verdict.failed_nodes)
        crash = culprits.first_failure(rank_files.read_exceptions(watched.control),
                                       rank_files.read_failure_files(watched.control), watched.world_size)
    ended, blamed = decide.attempt_end(code, crash=crash, first_task=first_task, failed_nodes=down, now=time.time(),
                                       node_of_rank=watched.host_of, memory=memory_of(job or {}))
    if blamed is not None and "detected_after_s" not in blamed and watched.first_error_at is not None:
        blamed["detected_after_s"] = round(max(0.0, time.time() - watched.first_error_at), 1)
    return ended, blamed


def settle(rec, attempt, folder, job_id, job, chain_id, watched, code, ended, blamed, here, args):
    """Record how the attempt ended and take the next step: AGAIN for a new attempt in
    this allocation, else the supervisor's exit code once the next job is submitted (or
    the chain is over), after a launch that a signal left running has ended."""
    attempt.update(ended=ended, ended_at=round(time.time(), 3), exit_code=code)
    if watched.terminated:
        record.save(folder, rec)  # Slurm's KillWait may end this script before the rest is settled
    saved = checkpoint_status.read_status(watched.control)
    if saved:
        attempt["checkpoints"] = checkpoint_status.describe(saved)
    if watched.step:
        attempt["step"] = watched.step
    blamed = decide.as_the_scripts(rec, slurm_names(blamed, watched.nodes))
    if blamed:
        attempt["culprit"] = decide.recorded_culprit(blamed)
        attempt.update({k: blamed[k] for k in ("stacks", "detected_after_s") if k in blamed})
    culprit = decide.excludable(blamed, watched.nodes)
    # In this allocation the next attempt needs only the job's own nodes among those it
    # holds (restart_here checks), so no blamed node is taken back for the partition's sake.
    if restart_here(rec, attempt, decide.next_step(rec, ended, culprit, rec["resilience"], code),
                    ended, watched, here, args, folder):
        return AGAIN
    requeued = ended == "preempted" and slurmctl.requeued_since(job_id, job.get("Restarts", "0"))
    step = decide.next_step(rec, ended, culprit, rec["resilience"], code, slurmctl.partition_nodes(job),
                            int(job.get("NumNodes", "0").split("-")[0] or 0), requeued)
    exit_code = finish_attempt(rec, attempt, step, folder, job_id, chain_id)
    if watched.proc is not None and watched.proc.poll() is None:
        attempt["exit_code"] = watched.wait_launch(TERM_WAIT_S)
        record.save(folder, rec)
    return exit_code


def restart_here(rec, attempt, step, ended, watched, here, args, folder):
    """After a failure, the next attempt in this allocation when it still holds enough
    nodes without the blamed ones (a spare in place of each): the blamed nodes are
    handed back to Slurm. A node someone drained meanwhile, or that Slurm says is not
    usable, is left out too, unblamed. False when the next attempt must be a new job."""
    if step["action"] != "restart" or ended not in record.FAILURES or watched.terminated or watched.grace:
        return False
    failed = set(slurmctl.failed_nodes(here.usable))
    blamed = [n for n in here.usable if n in step["exclude"] or n in failed]
    unusable = set(slurmctl.unusable_nodes(here.usable)) | watched.drained
    usable = [n for n in here.usable if n not in blamed and n not in unusable]
    plan = launch.step_nodes(usable, args.nodes, args.min_nodes or args.nodes)
    if plan is None:
        return False
    lost = [n for n in here.usable if n not in usable]
    released = here.drop(lost)
    if blamed:
        attempt["excluded"] = blamed
    if lost:
        attempt["released"] = released
    before = record.excluded_nodes(rec)
    rec["exclude"] = before + [n for n in blamed if n not in before]
    spares = [n for n in plan if n not in watched.nodes]
    fewer = f" with {len(plan)} of {args.nodes} nodes" if len(plan) < args.nodes else ""
    attempt["why"] = "{}; restarted in job {} on {}{}{}".format(
        step["why"], attempt["slurm_job_id"], NodeSet.of(plan), fewer,
        f" ({NodeSet.of(spares)} in place of {NodeSet.of(lost)})" if spares else "")
    exclude_standby(rec)
    record.save(folder, rec)
    evidence = (attempt.get("culprit") or {}).get("evidence")
    say("attempt {} ended: {}{}; {}{}".format(attempt["attempt"], ended, f" ({evidence})" if evidence else "",
                                               attempt["why"],
                                               f"; {NodeSet.of(released)} handed back to Slurm" if released else ""))
    return True


def finish_attempt(rec, attempt, step, folder, job_id, chain_id):
    """Record the next step: nothing to submit when Slurm requeued the job (it gets the
    chain's excluded nodes), a new job without them, or the chain's end."""
    attempt["why"] = step["why"]
    if step["action"] != "requeued":
        drop_standby(rec, job_id)
    if step["action"] == "requeued":
        # The same job runs again: Slurm takes an ExcNodeList while the requeued job
        # completes. The record first: Slurm's KillWait may end this script any moment.
        record.save(folder, rec)
        if chain_exclude(rec) and not slurmctl.set_excluded(job_id, chain_exclude(rec), REQUEUE_UPDATE_S):
            say(f"cannot set the excluded nodes of the requeued job {job_id} now; its next run leaves them out")
    elif step["action"] == "restart":
        added = [n for n in step["exclude"] if n not in record.excluded_nodes(rec)]
        if added:
            attempt["excluded"] = added
        rec["exclude"] = step["exclude"]
        without = chain_exclude(rec)  # (Slurm gives a new job no drained node by itself)
        attempt["without"] = without
        try:
            comment = slurmctl.user_comment(slurmctl.job_comment(job_id))
            attempt["next_job_id"] = slurmctl.submit_next(kept_script(folder, rec), job_id, chain_id, without,
                                                          comment)
        except (RuntimeError, private.Untrusted) as exc:
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
        say("{}; {}; next attempt: job {}{}".format(told, step["why"], attempt["next_job_id"],
                                                   f" without {NodeSet.of(without)}" if without else ""))
    else:
        say("{}; {}".format(told, (rec["final"] or {}).get("why", step["why"])))
    return (step["exit_code"] or 0) if rec["final"] is None else rec["final"]["exit_code"]


def cancel_requeued(job_id):
    """The chain ended on a requeue by Slurm: cancel the requeued job (its run, if it
    starts anyway, reads the record's end and stops at once)."""
    try:
        slurmctl.cancel(job_id)
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
    except (Refused, private.Untrusted, record.CorruptRecord) as exc:
        say(f"{exc}")
        return 1
    except RuntimeError as exc:
        say(str(exc))
        return 1
