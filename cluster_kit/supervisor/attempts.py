"""The attempts of one Slurm job in its allocation (stdlib only, Python 3.8+): each started as
a step on the nodes it may use, watched, settled; the next one in the same allocation
while it holds enough nodes (a spare in place of each blamed node), else the chain's
next job."""
from __future__ import annotations

import os
import sys
import time
from typing import Any, NamedTuple

from cluster_kit.hostlist import NodeSet
from cluster_kit.supervisor import decide, ending, launch, record, slurmctl
from cluster_kit.supervisor.allocation import Allocation
from cluster_kit.supervisor.attempt import Attempt, LaunchPlan, say
from cluster_kit.supervisor.chain import Chain
from cluster_kit.supervisor.record import AttemptRecord
from cluster_kit.supervisor.settings import Settings
from cluster_kit.trainer import contract
from cluster_kit.trainer.checkpoint import interval
from cluster_kit.trainer.checkpoint import status as checkpoint_status

TERM_WAIT_S = 300.0  # after SIGTERM, the launch is waited for (Slurm's SIGKILL ends it sooner)


class End(NamedTuple):
    """How a launch ended: its exit code (None while it runs), the ending, the culprit."""

    code: int | None
    ended: str
    culprit: dict[str, Any] | None


class Attempts:
    """This job's attempts: `launch` is the script's launch line, `here` the allocation."""

    def __init__(self, chain: Chain, settings: Settings, launch_argv: list[str], here: Allocation) -> None:
        self.chain = chain
        self.settings = settings
        self.launch = launch_argv
        self.here = here
        self.number_here = 0
        self.previous: Attempt | None = None

    def run(self, failed: list[str]) -> int:
        """The attempts, until one is not restarted in this allocation; the supervisor's exit code.
        `failed`: the nodes the in-job preflight failed."""
        if not self.leave_out_excluded():
            return 0
        if failed and self.plan(NodeSet.of(failed)) is not None:
            released = self.here.drop(failed)
            say("the in-job preflight failed on {}: training without {} ({})".format(
                ",".join(failed), "it" if len(failed) == 1 else "them",
                f"released {released}" if released else "kept: the batch script runs there"))
            failed = []
        while True:
            nodes = self.plan() if not failed else None
            if self.previous is not None:
                self.end_steps(self.previous)
            attempt, watched = self.start(nodes)
            end = self.preflight_failure(failed) if nodes is None else self.watch(watched)
            outcome = self.settle(attempt, watched, end)
            if outcome is not None:
                return outcome
            self.number_here += 1
            self.previous = watched

    def plan(self, without: NodeSet | None = None) -> list[str] | None:
        """The next attempt's nodes among those it may use (and not `without`), or None."""
        usable = [n for n in self.here.usable if without is None or n not in without]
        return launch.step_nodes(usable, self.settings.nodes, self.settings.min_nodes)

    # --- before an attempt ----------------------------------------------------------------
    def leave_out_excluded(self) -> bool:
        """An allocation that holds nodes the chain excluded (a requeue by someone else, or a
        standby job submitted before they were excluded) trains without them: they are
        released when the job's nodes fit in the rest; else the chain moves on as a new job
        without them, named as the next job of the attempt before, and this one does not
        train (False)."""
        chain = self.chain
        excluded = NodeSet.of(n for n in self.here.usable if n in chain.exclude)
        if not excluded:
            return True
        if self.plan(excluded) is not None:
            released = self.here.drop(excluded)
            say("{} {} excluded by an earlier attempt: training without {} ({})".format(
                excluded, "was" if len(excluded) == 1 else "were", "it" if len(excluded) == 1 else "them",
                f"released {released}" if released else "kept: the batch script runs there"))
            return True
        last = chain.rec.attempts[-1]
        last.without = chain.exclude
        last.next_job_id = chain.submit_next(last.without)
        last.why = f"{last.why or last.ended}; job {chain.job.id} got {excluded}, which the chain excluded: moved to job {last.next_job_id}"
        chain.drop_standby(chain.job.id)
        chain.save()
        say(f"the allocation holds {excluded}, which the chain excluded, and too few nodes without them: "
            f"the chain goes on as job {last.next_job_id} without them; job {chain.job.id} does not train")
        return False

    def end_steps(self, previous: Attempt) -> None:
        """Every step of the attempt that ended is gone before the next one starts (a hung
        rank's step could outlive a kill Slurm did not list)."""
        steps = [previous.step.split(".", 1)[1]] if previous.step else []
        left = slurmctl.end_steps(self.here.job_id, steps)
        if left:
            say("steps {} of job {} are still listed by Slurm after being killed; the next attempt starts "
                "beside them".format(",".join(left), self.here.job_id))

    def start(self, nodes: list[str] | None) -> tuple[AttemptRecord, Attempt]:
        """Append the attempt to the record and make its control folder; the attempt and its
        Attempt (not started). `nodes` None: the in-job preflight failed, nothing runs."""
        rec = self.chain.rec
        number = len(rec.attempts)
        on = nodes if nodes is not None else list(self.here.nodes)
        attempt = AttemptRecord(number, self.here.job_id, str(NodeSet.of(on)),
                                os.environ.get("SLURM_JOB_NODELIST", ""), self.here.batch_host,
                                round(time.time(), 3), output=self.chain.job.output)
        if rec.last is not None and rec.last.ended_at:  # how long the restart (a requeue, a new job) waited
            attempt.waited_s = round(max(0.0, (attempt.started_at or 0) - rec.last.ended_at), 1)
        rec.attempts.append(attempt)
        self.chain.save()
        control = os.path.join(self.chain.folder, f"attempt-{number}")
        record.make_private_dir(control)
        where = f" (allocation {attempt.allocation})" if len(self.here.nodes) != len(on) else ""
        say(f"attempt {number} of job {self.chain.chain_id} on {attempt.nodes}{where} (record: {self.chain.folder})")
        plan = LaunchPlan(self.here.job_id, launch.step_argv(self.launch, on), control,
                          self.environment(control, number, on), on, self.settings.tasks_per_node)
        return attempt, Attempt(plan)

    def environment(self, control: str, number: int, nodes: list[str]) -> dict[str, str]:
        """The ranks' environment: the contract's variables, this attempt's MASTER_ADDR and
        MASTER_PORT, the checkpoint settings, and where NCCL's watchdog dumps."""
        resilience = self.settings.resilience
        checkpoint = resilience.checkpoint_dir or os.path.join(self.chain.folder, "checkpoint")
        os.makedirs(checkpoint, mode=0o700, exist_ok=True)
        env = dict(os.environ, MASTER_ADDR=nodes[0] if nodes else "",
                   MASTER_PORT=str(launch.step_port(os.environ.get("MASTER_PORT", "29500"), self.number_here)))
        env.update({contract.CONTROL_DIR_ENV: control, contract.ATTEMPT_ENV: str(number),
                    contract.CHECKPOINT_DIR_ENV: checkpoint})
        env.update(self.checkpoint_env(len(nodes)))
        env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
        prefix = contract.nccl_dump_prefix(control)  # torch does not create its folder
        record.make_private_dir(os.path.dirname(prefix))
        for key, value in (("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"), ("TORCH_FR_DUMP_TEMP_FILE", prefix)):
            env.setdefault(key, value)  # unless the job says
        return env

    def checkpoint_env(self, nodes: int) -> dict[str, str]:
        """What cluster_kit.checkpoint reads in the ranks: the job's checkpoint settings, the
        failure rate of this chain and of the user's earlier chains beside it, and this
        chain's restart time, for `checkpoint_every: auto`."""
        rec, resilience = self.chain.rec, self.settings.resilience
        run_s, failures, restart_s = decide.chain_history(rec.attempts)
        earlier_s, earlier_failures = decide.earlier_history(record.earlier(self.chain.folder), nodes)
        mtbf_s = interval.estimate_mtbf_s(run_s + earlier_s, failures + earlier_failures, nodes,
                                          resilience.mtbf_hours or interval.DEFAULT_MTBF_HOURS)
        env = {contract.CHAIN_ENV: rec.job_id, contract.MTBF_ENV: f"{mtbf_s:.0f}"}
        if restart_s is not None:
            env[contract.RESTART_ENV] = f"{restart_s:.1f}"
        if resilience.checkpoint_every:
            env[contract.CHECKPOINT_EVERY_ENV] = str(resilience.checkpoint_every)
        if resilience.keep_checkpoints:
            env[contract.KEEP_CHECKPOINTS_ENV] = str(resilience.keep_checkpoints)
        return env

    # --- during and after an attempt ---------------------------------------------------------
    def preflight_failure(self, failed: list[str]) -> End:
        say("the in-job preflight failed on {}: training was not started".format(",".join(failed)))
        ended, blamed = decide.attempt_end(1, decide.Evidence(failed_nodes=tuple(failed)))
        assert blamed is not None
        blamed["evidence"] = "the in-job preflight failed on {} (see its lines above)".format(",".join(failed))
        blamed["detected_after_s"] = 0.0  # found before the attempt started
        return End(1, ended, blamed)

    def watch(self, watched: Attempt) -> End:
        """(exit code or None, ended, culprit) of the launch, its guard step beside it."""
        guard = self.start_guard(watched.nodes)
        try:
            started = time.time()
            copier = watched.start(self.previous)
            resilience = self.settings.resilience
            seen = watched.watch(decide.HangClock(watched.world_size, resilience.hang_timeout, started,
                                                  resilience.startup_timeout))
            if seen.why == "signal":
                return End(*ending.signalled(watched, self.chain.job.fields))
            copier.join(timeout=10)
            if seen.why in ("hang", "nodes"):
                return End(seen.code, "hang" if seen.why == "hang" else "node_failure", seen.culprit)
            return End(seen.code, *ending.end_of(watched, seen.code, self.chain.job.fields))
        finally:
            slurmctl.stop_guard(guard, 0.0 if watched.terminated else 5.0)

    def start_guard(self, nodes: list[str]) -> Any:
        """The guard step, on a node of the attempt other than the batch script's (none for
        a job of one node): it cancels the job if the batch script's node dies, so that the
        standby job can take over."""
        other = next((n for n in nodes if n != self.here.batch_host), None)
        if other is None or not self.here.batch_host:
            return None
        return slurmctl.start_guard(self.here.job_id, other, self.here.batch_host, sys.executable,
                                    slurmctl.slurmd_timeout())

    def settle(self, attempt: AttemptRecord, watched: Attempt, end: End) -> int | None:
        """Record how the attempt ended and take the next step: None for a new attempt in
        this allocation, else the supervisor's exit code once the next job is submitted (or
        the chain is over), after a launch that a signal left running has ended."""
        code, ended, blamed = end
        chain = self.chain
        attempt.ended, attempt.ended_at, attempt.exit_code = ended, round(time.time(), 3), code
        if watched.terminated:
            chain.save()  # Slurm's KillWait may end this script before the rest is settled
        saved = checkpoint_status.read_status(watched.control)
        if saved:
            attempt.checkpoints = checkpoint_status.describe(saved)
        attempt.step = watched.step
        blamed = decide.as_the_scripts(chain.rec, ending.slurm_names(blamed, watched.nodes))
        if blamed:
            attempt.culprit = decide.recorded_culprit(blamed)
            attempt.stacks = blamed.get("stacks") or {}
            attempt.detected_after_s = blamed.get("detected_after_s")
        culprit = decide.excludable(blamed, watched.nodes)
        resilience = self.settings.resilience.to_dict()
        # In this allocation the next attempt needs only the job's own nodes among those it
        # holds (restart_here checks), so no blamed node is taken back for the partition's sake.
        if self.restart_here(attempt, decide.next_step(chain.rec, decide.Ending(ended, culprit, code), resilience),
                             watched):
            return None
        requeued = ended == "preempted" and slurmctl.requeued_since(self.here.job_id,
                                                                    chain.job.fields.get("Restarts", "0"))
        room = decide.Room(tuple(slurmctl.partition_nodes(chain.job.fields)),
                           int(chain.job.fields.get("NumNodes", "0").split("-")[0] or 0))
        exit_code = chain.finish(attempt, decide.next_step(chain.rec, decide.Ending(ended, culprit, code, requeued),
                                                           resilience, room))
        if watched.proc is not None and watched.proc.poll() is None:
            attempt.exit_code = watched.wait_launch(TERM_WAIT_S)
            chain.save()
        return exit_code

    def restart_here(self, attempt: AttemptRecord, step: decide.Step, watched: Attempt) -> bool:
        """After a failure, the next attempt in this allocation when it still holds enough
        nodes without the blamed ones (a spare in place of each): the blamed nodes are
        handed back to Slurm. A node someone drained meanwhile, or that Slurm says is not
        usable, is left out too, unblamed. False when the next attempt must be a new job."""
        if step.action != "restart" or attempt.ended not in record.FAILURES or watched.terminated \
                or watched.grace:
            return False
        here, rec = self.here, self.chain.rec
        failed = set(slurmctl.failed_nodes(list(here.usable)))
        blamed = [n for n in here.usable if n in step.exclude or n in failed]
        unusable = set(slurmctl.unusable_nodes(list(here.usable))) | watched.drained
        lost = NodeSet.of(n for n in here.usable if n in blamed or n in unusable)
        nodes = self.plan(lost)
        if nodes is None:
            return False
        released = here.drop(lost)
        if blamed:
            attempt.excluded = blamed
        if lost:
            attempt.released = list(released)
        rec.exclude = rec.excluded_nodes() + [n for n in blamed if n not in rec.exclude]
        spares = [n for n in nodes if n not in watched.nodes]
        fewer = f" with {len(nodes)} of {self.settings.nodes} nodes" if len(nodes) < self.settings.nodes else ""
        attempt.why = "{}; restarted in job {} on {}{}{}".format(
            step.why, attempt.slurm_job_id, NodeSet.of(nodes), fewer,
            f" ({NodeSet.of(spares)} in place of {lost})" if spares else "")
        self.chain.exclude_standby()
        self.chain.save()
        evidence = (attempt.culprit or {}).get("evidence")
        say("attempt {} ended: {}{}; {}{}".format(attempt.attempt, attempt.ended,
                                                   f" ({evidence})" if evidence else "", attempt.why,
                                                   f"; {released} handed back to Slurm" if released else ""))
        return True
