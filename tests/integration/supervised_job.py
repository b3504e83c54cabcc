"""A real 4-rank gloo job on localhost, supervised through a control folder as a job would be.

Run as a rank (``python supervised_job.py rank SCENARIO STORE``, with RANK, WORLD_SIZE
and CLUSTERKIT_CONTROL_DIR in the environment) it trains a small DDP model with
``cluster_kit.ddp.build_step`` and then, by scenario:

* ``hang``: rank 3 stays in ``load_batch`` while the others wait in DDP's all-reduce;
* ``mismatch``: rank 3 calls a broadcast (``sync_weights``) where the others all-reduce;
* ``stop``: every rank trains until ``stop_requested()``, agreed through an all-reduce;
* ``crash``: rank 2 raises in ``bad_batch`` after a few steps;
* ``timeout``: as ``hang``, with a process-group timeout of TIMEOUT_S seconds: ranks 0-2
  fail in the all-reduce with gloo's timeout while rank 3 still sits in ``load_batch``.

Imported, it starts such a job (:func:`start_job`) and plays the supervisor's part:
:func:`request_dump` writes ``dump-request``, :func:`wait_for_files` waits for the ranks'
answers. ``python tests/integration/supervised_job.py record DIR`` regenerates the
recorded dumps of tests/data/flight_recorder (its README says what they are).
"""
from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORLD_SIZE = 4
STEPS_BEFORE_TROUBLE = 5
START_DEADLINE_S = 120.0  # 4 ranks importing torch on a 2-core machine
TIMEOUT_S = 10  # the process group's timeout in the `timeout` scenario (gloo's default: 30 min)


# --- the ranks ----------------------------------------------------------------------------
def load_batch(step: int, rank: int, hang: bool) -> tuple:
    """The next batch; the hung rank never returns from here."""
    import torch

    while hang:
        time.sleep(0.2)  # a stuck data loader, as seen from the training loop
    generator = torch.Generator().manual_seed(step * 100 + rank)
    return torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)


def sync_weights(model: object) -> None:
    """A collective the other ranks never call: they all-reduce instead."""
    import torch.distributed as dist

    for param in model.parameters():  # type: ignore[attr-defined]
        dist.broadcast(param.data, src=3)


def bad_batch(step: int) -> None:
    raise ValueError(f"batch {step} has no labels")


def rank_main(scenario: str, store: str) -> int:
    """One rank of the job: STEPS_BEFORE_TROUBLE good steps, then the scenario's trouble."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from cluster_kit import ddp

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = TIMEOUT_S if scenario == "timeout" else 60
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = ddp.build_step(model, optimizer, torch.nn.functional.mse_loss, load_batch(0, rank, False))
    steps = 0
    while scenario == "stop" or steps < STEPS_BEFORE_TROUBLE:
        step(*load_batch(steps, rank, False))
        steps += 1
        if scenario == "stop" and agreed_stop(ddp.stop_requested()):
            return report_stop(rank, steps)
    if scenario == "crash" and rank == 2:
        bad_batch(steps)
    if scenario == "mismatch" and rank == 3:
        sync_weights(model)
    step(*load_batch(steps, rank, hang=scenario in ("hang", "timeout") and rank == 3))
    return 0


def agreed_stop(local: bool) -> bool:
    """Stop when any rank was asked to: every rank must leave the loop at the same step."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if local else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def report_stop(rank: int, steps: int) -> int:
    """Print what this rank's own stop_requested() says (within a deadline), then leave."""
    import torch.distributed as dist

    from cluster_kit import ddp

    deadline = time.monotonic() + 10
    while not ddp.stop_requested() and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"rank {rank} stop_requested={ddp.stop_requested()} steps={steps}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# --- the supervisor's side -----------------------------------------------------------------
@dataclass
class Job:
    """The ranks of one run and the folder they answer in."""

    control_dir: Path
    processes: list[subprocess.Popen[str]]

    def heartbeats(self) -> dict[int, str]:
        folder = self.control_dir / "heartbeat"
        return {int(p.name.split("-")[1]): p.read_text() for p in folder.glob("rank-*")} if folder.exists() else {}

    def wait_for_steps(self, steps: int, deadline_s: float = START_DEADLINE_S) -> None:
        """Until every rank's heartbeat file shows `steps` steps (the watcher writes the last count)."""
        def done() -> bool:
            beats = self.heartbeats()
            return len(beats) == WORLD_SIZE and all(int(line.split()[0]) >= steps for line in beats.values())
        wait_until(done, deadline_s, f"every rank at {steps} steps: {self.heartbeats()} {self.outputs()}")

    def outputs(self) -> str:
        return " ".join(f"rank {i}: rc={p.poll()}" for i, p in enumerate(self.processes))

    def wait(self, deadline_s: float) -> list[tuple[int, str]]:
        """(exit code, output) of every rank, killing those still running at the deadline."""
        return wait_ranks(self.processes, deadline_s)

    def kill(self) -> None:
        kill_ranks(self.processes)


def wait_ranks(processes: list[subprocess.Popen[str]], deadline_s: float) -> list[tuple[int, str]]:
    """(exit code, output) of every rank, killing those still running at the deadline."""
    end = time.monotonic() + deadline_s
    results = []
    for process in processes:
        try:
            out, _ = process.communicate(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        results.append((process.returncode, out))
    return results


def kill_ranks(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
    for process in processes:
        process.communicate()


def wait_until(condition: object, deadline_s: float, what: str) -> None:
    """Poll `condition()` every 0.1 s; AssertionError naming `what` at the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")


@contextmanager
def start_job(scenario: str, workdir: Path) -> Iterator[Job]:
    """Start the WORLD_SIZE ranks of `scenario` with a control folder under `workdir`."""
    control = workdir / "control"
    control.mkdir(mode=0o700)
    env = dict(os.environ, WORLD_SIZE=str(WORLD_SIZE), CLUSTERKIT_CONTROL_DIR=str(control),
               CLUSTERKIT_HEARTBEAT_INTERVAL="0.2", TORCH_FR_BUFFER_SIZE="2000",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    store = workdir / "store"
    processes = [
        subprocess.Popen([sys.executable, __file__, "rank", scenario, str(store)], env=dict(env, RANK=str(rank)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir)
        for rank in range(WORLD_SIZE)
    ]
    job = Job(control, processes)
    try:
        yield job
    finally:
        job.kill()


def request_dump(control_dir: Path, request: str) -> None:
    """What the supervisor does on a hang: a new id in dump-request (written whole, then renamed)."""
    partial = control_dir / ".dump-request.new"
    partial.write_text(request + "\n")
    os.chmod(partial, 0o600)
    partial.replace(control_dir / "dump-request")


def wait_for_files(paths: Iterable[Path], deadline_s: float) -> None:
    wanted = list(paths)
    wait_until(lambda: all(p.exists() for p in wanted), deadline_s,
               ", ".join(str(p) for p in wanted if not p.exists()) or "files")


def dump_hang(scenario: str, workdir: Path, request: str = "hang-1") -> Path:
    """Run `scenario` until the ranks hang, ask for a dump and return the dump folder."""
    with start_job(scenario, workdir) as job:
        job.wait_for_steps(STEPS_BEFORE_TROUBLE)
        time.sleep(0.5)  # let the waiting ranks enter the collective the hung one never reaches
        request_dump(job.control_dir, request)
        folder = job.control_dir / "dumps" / request
        wait_for_files((folder / f"rank-{r}.done" for r in range(WORLD_SIZE)), 60)
        return folder


# --- regenerating tests/data/flight_recorder ----------------------------------------------
SHOWN_REPO = "/home/alice/clusterkit"  # the checkout's path in the recorded files


def copy_recorded(source: Path, target: Path) -> None:
    """Copy a rank's file, with this checkout's path written as SHOWN_REPO (stable test data)."""
    target.write_text(source.read_text().replace(str(REPO), SHOWN_REPO))


def record(out: Path) -> None:
    """Write the hang, mismatch and crash recordings under `out` (see its README)."""
    for scenario in ("hang", "mismatch"):
        with tempfile.TemporaryDirectory() as tmp:
            folder = dump_hang(scenario, Path(tmp))
            target = out / scenario
            shutil.rmtree(target, ignore_errors=True)
            for sub, files in (("dumps/hang-1", folder.glob("rank-*")),
                               ("heartbeat", (folder.parents[1] / "heartbeat").glob("rank-*"))):
                (target / sub).mkdir(parents=True)
                for path in sorted(files):
                    if not path.name.endswith(".done"):
                        copy_recorded(path, target / sub / path.name)
    with tempfile.TemporaryDirectory() as tmp, start_job("crash", Path(tmp)) as job:
        job.wait(START_DEADLINE_S)
        target = out / "crash" / "exceptions"
        shutil.rmtree(target.parent, ignore_errors=True)
        target.mkdir(parents=True)
        for path in sorted((job.control_dir / "exceptions").glob("rank-*.txt")):
            copy_recorded(path, target / path.name)
    record_timeout(out)


def run_timeout(workdir: Path) -> Job:
    """Run `timeout` until ranks 0-2 failed (gloo's timeout), then kill rank 3, still hung."""
    with start_job("timeout", workdir) as job:
        job.wait_for_steps(STEPS_BEFORE_TROUBLE)
        wait_until(lambda: all(p.poll() is not None for p in job.processes[:3]), START_DEADLINE_S,
                   f"ranks 0-2 to fail after the {TIMEOUT_S} s timeout: {job.outputs()}")
        return job


def record_timeout(out: Path) -> None:
    """The `timeout` scenario's exception files, Flight Recorder dumps and heartbeats."""
    with tempfile.TemporaryDirectory() as tmp:
        job = run_timeout(Path(tmp))
        target = out / "timeout"
        shutil.rmtree(target, ignore_errors=True)
        for sub in ("exceptions", "heartbeat"):
            (target / sub).mkdir(parents=True)
            for path in sorted((job.control_dir / sub).glob("rank-*")):
                copy_recorded(path, target / sub / path.name)


def main(argv: list[str]) -> int:
    if argv[:1] == ["rank"]:
        return rank_main(argv[1], argv[2])
    if argv[:1] == ["record"] and len(argv) == 2:
        record(Path(argv[1]))
        return 0
    if argv[:1] == ["record-timeout"] and len(argv) == 2:
        record_timeout(Path(argv[1]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
