"""One launch under watch: signals, heartbeats, node states, the launch's Slurm lines
(stdlib only, Python 3.8+).

`Attempt.watch` returns once the launch exited, a hang was diagnosed, Slurm says an
allocated node failed, or a SIGTERM came (scancel, the time limit, preemption): the
caller decides what it was. Signal handlers only set flags and write the `stop`
file; every Slurm command runs in the main loop.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

from cluster_kit.analysis import culprit as culprits
from cluster_kit.analysis import rank_files
from cluster_kit.supervisor import decide, slurmctl
from cluster_kit.trainer import contract

POLL_S = 1.0
NODE_POLL_S = 5.0  # how often the allocated nodes' Slurm states are read
DUMP_WAIT_S = 20.0  # how long the ranks get to answer a dump request
STOP_WAIT_S = 15.0  # after its steps were killed, the launch is waited for this long, then killed
SETTLE_S = 2.0  # after a rank's exception file appeared, before the launch is stopped
STACK_CHARS = 4000  # of each rank's stack kept in the record
KEPT_LINES = 400  # srun / slurmstepd lines kept to read how the launch ended
SLURM_LINE = ("srun:", "slurmstepd", "srun ")


def say(message: str) -> None:
    sys.stderr.write(f"clusterkit supervisor: {message}\n")
    sys.stderr.flush()


def pause_words(overdue: Mapping[int, tuple[str, float, float]]) -> str:
    """`rank 0 stayed in ddp.paused("checkpoint save") for 1805 s, past its max_s of 1800 s; `
    for the pauses that stopped the hang clock too long ({rank: (reason, seconds, max_s)})."""
    return "".join(f"rank {rank} stayed in ddp.paused({reason!r}) for {seconds:.0f} s, past its max_s of "
                   f"{limit:g} s; " for rank, (reason, seconds, limit) in sorted(overdue.items()))


@dataclasses.dataclass(frozen=True)
class Watched:
    """Why `watch` returned: the launch's exit code (None while it runs), and one of
    `exit`, `hang` (with the culprit), `nodes` (with the culprit) or `signal`."""

    why: str
    code: int | None = None
    culprit: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """What one attempt runs: the job, the launch line (a step on exactly `nodes`), its
    control folder and environment, and how many ranks each node holds."""

    job_id: str
    argv: list[str]
    control: str
    env: dict[str, str]
    nodes: list[str]  # the attempt's nodes, in Slurm's order
    tasks_per_node: int


class Attempt:
    """One launch under watch."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.job_id = plan.job_id
        self.control = plan.control
        self.nodes = plan.nodes
        self.tasks_per_node = plan.tasks_per_node
        self.world_size = len(plan.nodes) * plan.tasks_per_node
        self.grace = False
        self.terminated = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self.step: str | None = None  # "<job>.<step>" once Slurm lists the launch's step
        self.steps_before: tuple[str, ...] = ()
        self.silent_since: dict[str, float] = {}  # node -> when it was first seen not responding
        self.drained: set[str] = set()  # nodes someone else drains meanwhile: left out of the next attempt
        self.slurmd_timeout = slurmctl.DEFAULT_SLURMD_TIMEOUT_S  # start() asks Slurm
        self.stopped_at: float | None = None  # when the supervisor told the ranks to stop
        self.first_error_at: float | None = None  # when srun wrote its first error line

    # --- signals (flags and the stop file only) ---------------------------------------
    def on_grace(self, signum: int, frame: FrameType | None) -> None:
        self.grace = True
        self.write_stop()

    def on_term(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM (scancel, the time limit, preemption): the ranks are told to stop at
        once, so that a checkpoint can still be written; the caller finds out why."""
        self.terminated = True
        self.write_stop()

    def write_stop(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.time()
        try:
            fd = os.open(os.path.join(self.control, contract.STOP), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.close(fd)
        except OSError as exc:
            say(f"cannot write the stop file: {exc}")

    def start(self, previous: Attempt | None = None) -> threading.Thread:
        """Install the signal handlers and start the launch; a signal the attempt before
        this one (in the same allocation) got after it ended carries over."""
        if previous is not None and (previous.grace or previous.terminated):
            self.grace, self.terminated = previous.grace, previous.terminated
            self.write_stop()
        signal.signal(signal.SIGUSR1, self.on_grace)
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, self.on_term)
        self.steps_before = tuple(slurmctl.running_steps(self.job_id))
        self.slurmd_timeout = slurmctl.slurmd_timeout()
        self.proc = subprocess.Popen(self.plan.argv, env=self.plan.env, stderr=subprocess.PIPE)
        thread = threading.Thread(target=self._copy_stderr, daemon=True)
        thread.start()
        return thread

    def _copy_stderr(self) -> None:
        """The launch's stderr goes on to the job's, and srun's own lines are kept."""
        out = getattr(sys.stderr, "buffer", None)
        assert self.proc is not None and self.proc.stderr is not None
        for raw in iter(self.proc.stderr.readline, b""):
            if out is not None:
                out.write(raw)
                out.flush()
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith(SLURM_LINE) or "slurmstepd" in line:
                self.lines = (self.lines + [line])[-KEPT_LINES:]
                if self.first_error_at is None and line.startswith("srun: error:"):
                    self.first_error_at = time.time()

    # --- watching ------------------------------------------------------------------------
    def heartbeats(self, clock: decide.HangClock) -> None:
        for rank, path in rank_files.rank_paths(os.path.join(self.control, contract.HEARTBEAT), "").items():
            try:
                beat = contract.parse_heartbeat(rank_files.read_text(path))
            except (OSError, ValueError):
                continue
            clock.observe(rank, beat)

    def watch(self, clock: decide.HangClock) -> Watched:
        """Until the launch exits, a hang is diagnosed, a node fails or a SIGTERM came."""
        assert self.proc is not None
        next_nodes = time.time() + NODE_POLL_S
        while True:
            code = self.proc.poll()
            if self.terminated:  # first: ranks told to stop by it may have returned 0 already
                return Watched("signal", code)
            if code is not None:
                return Watched("exit", code)
            self.heartbeats(clock)
            self.find_step()
            now = time.time()
            if now >= next_nodes:
                next_nodes = now + NODE_POLL_S
                down = self.failed_nodes(now)
                if down is not None:
                    self.stop_launch()
                    return Watched("nodes", self.proc.wait(), down)
            if self.rank_failed():
                time.sleep(SETTLE_S)  # the others' own files (a peer's timeout is evidence too)
                self.stop_launch()
                return Watched("exit", self.proc.wait())
            stalled = [] if self.grace else clock.stalled(now)
            if stalled:
                say(f"ranks {culprits.format_ranks(stalled)} finished no step for "
                    f"{now - clock.stalled_since(stalled):.0f} s: asking every rank for its stack and collectives")
                hang = self.diagnose_hang(clock, stalled, clock.overdue(now))
                self.stop_launch()
                return Watched("hang", self.proc.wait(), hang)
            time.sleep(POLL_S)

    def find_step(self) -> None:
        """The launch's step id: the newest step Slurm lists that was not there before."""
        if self.step is None:
            new = [int(s) for s in slurmctl.running_steps(self.job_id) if s not in self.steps_before]
            if new:
                self.step = f"{self.job_id}.{max(new)}"

    def rank_failed(self) -> bool:
        """Whether some rank wrote its exception or fault file: it is ending, and srun
        would otherwise wait for the others until Slurm's KillWait is over."""
        for kind in (contract.EXCEPTIONS, contract.FAULTS):
            for path in rank_files.rank_paths(os.path.join(self.control, kind), contract.TEXT).values():
                try:
                    if os.path.getsize(path) > 0:
                        return True
                except OSError:
                    continue
        return False

    def failed_nodes(self, now: float) -> dict[str, Any] | None:
        """The culprit of a node failure Slurm reports for an allocated node, else None.

        Slurm's own verdict counts (DOWN, FAIL, or the health gate's drain); a node that
        only stops responding (`*`) counts once it has been silent longer than Slurm's
        SlurmdTimeout; a node someone else drains is no fault of the attempt: it is
        noted in `drained`, to be left out of the next one."""
        try:
            states = slurmctl.node_states(self.nodes)
        except RuntimeError:
            return None
        bad: dict[str, tuple[str, str, str]] = {}
        for node in self.nodes:
            state, why, at = states.get(node, ("", "", ""))
            verdict = slurmctl.node_verdict(state, why)
            if verdict == slurmctl.SILENT:
                since = self.silent_since.setdefault(node, now)
                if now - since > self.slurmd_timeout:
                    bad[node] = (f"{state} (not responding for {now - since:.0f} s)", "", "")
                continue
            self.silent_since.pop(node, None)
            if verdict == slurmctl.DRAINED and node not in self.drained:
                self.drained.add(node)
                say(f"{node} is {state}" + (f" ({why})" if why and why != "none" else "")
                    + ": the attempt goes on; the next one is started without it")
            elif verdict == slurmctl.FAULT:
                bad[node] = (state, why, at)
        if not bad:
            return None
        said = ", ".join(f"{n} is {s}" + (f" ({why})" if why and why != "none" else "")
                         for n, (s, why, _) in sorted(bad.items()))
        say(f"Slurm says {said}: ending the attempt")
        blamed = decide.culprit_of([], sorted(bad), f"Slurm reports {said}")
        marked = [t for t in (decide.slurm_time(at) for _, _, at in bad.values()) if t is not None and t <= now]
        if marked:
            blamed["detected_after_s"] = round(now - max(marked), 1)
        return blamed

    def diagnose_hang(self, clock: decide.HangClock, stalled: Sequence[int],
                      overdue: Mapping[int, tuple[str, float, float]] | None = None) -> dict[str, Any]:
        request = f"hang-{int(time.time())}"
        path = os.path.join(self.control, contract.DUMP_REQUEST)
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(request + "\n")
        os.replace(tmp, path)
        dumps = os.path.join(self.control, contract.DUMPS, request)
        deadline = time.time() + DUMP_WAIT_S
        while time.time() < deadline and len(rank_files.rank_paths(dumps, contract.DONE)) < self.world_size:
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.5)
        files = rank_files.read_dump_folder(self.control, request)
        verdict = culprits.find_culprit(files, self.world_size)
        hosts = list(verdict.hosts) or [self.host_of(r) for r in verdict.ranks]
        hang = decide.culprit_of(verdict.ranks, hosts, pause_words(overdue or {}) + verdict.evidence)
        signature = verdict.signature()
        if signature is not None:
            hang.update(signature=signature.key, error=signature.error, where=signature.where)
        hang["stacks"] = {str(r): f.stack.text[-STACK_CHARS:] for r, f in files.items() if f.stack}
        hang["detected_after_s"] = round(time.time() - clock.stalled_since(stalled), 1)
        return hang

    def host_of(self, rank: int) -> str:
        """The node of a rank that told nothing: srun places ranks node by node."""
        index = rank // max(1, self.tasks_per_node)
        return self.nodes[index] if index < len(self.nodes) else ""

    def stop_launch(self, wait_s: float = STOP_WAIT_S) -> None:
        """End the launch at once: SIGKILL to every task of the job's running steps (a
        hung rank ignores anything gentler), then to the launch itself if it is still
        there after `wait_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        slurmctl.kill_steps(self.job_id, slurmctl.running_steps(self.job_id))
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def wait_launch(self, timeout: float) -> int | None:
        """The launch's exit code once it ended within `timeout`, else None."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
