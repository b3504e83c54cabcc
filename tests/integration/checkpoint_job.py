"""A real 2-rank gloo training job on localhost that checkpoints through cluster_kit.checkpoint.

Run as a rank (``python checkpoint_job.py WORKDIR [options]`` with RANK, WORLD_SIZE and
the CLUSTERKIT_* variables a supervisor would export), it trains a small model with
dropout, SGD with momentum and a LambdaLR schedule on a shuffled DistributedSampler
(3 epochs of 8 batches a rank: 24 steps), resumes from the newest checkpoint that
verifies, saves when ``checkpoint.due(step)`` says so (every 4 steps) and writes the
final weights. Faults for the tests:

* ``--exit-after N``: every rank leaves without a word after step N (a lost attempt);
* ``--hold-save N``: rank 0 stops inside the save of step N, after the model file is
  written and before anything is committed, and says so in ``WORKDIR/held``: the test
  then kills it with SIGKILL;
* ``--wait-for FILE``: after the first save the ranks wait for FILE, then try to save
  step 8 (an attempt that a newer one has overtaken: the save must be refused).

Imported, :func:`start_attempt` starts the ranks of one attempt as local processes.
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervised_job import kill_ranks, wait_ranks

REPO = Path(__file__).resolve().parents[2]
WORLD_SIZE = 2
EPOCHS = 3
STEPS = 24  # 3 epochs x 64 samples / 2 ranks / batch 4
DEADLINE_S = 120.0  # 2 ranks importing torch on a 2-core machine, then training


# --- the ranks ----------------------------------------------------------------------------
class Hold:
    """An entry whose pickling never ends: rank 0 stays inside its save until it is killed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        self.marker.write_text(str(os.getpid()))
        threading.Event().wait()
        raise AssertionError("unreachable")


def rank_main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from cluster_kit import checkpoint

    args = parse(argv)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"file://{args.workdir}/store-{os.environ['CLUSTERKIT_ATTEMPT']}",
                            rank=rank, world_size=WORLD_SIZE, timeout=datetime.timedelta(seconds=60))
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(64, 8, generator=generator)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True).tanh())
    position = checkpoint.DataPosition(DistributedSampler(dataset, shuffle=True, seed=11))
    loader = DataLoader(dataset, batch_size=4, sampler=position)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + 0.1 * s))
    torch.manual_seed(100 + rank)  # each rank's own dropout
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "data": position}
    saver = checkpoint.configure(str(args.workdir / "ckpt"), async_=args.async_saves)
    loaded = saver.load(**state)
    step = loaded.step if loaded else 0
    print(f"rank {rank}: attempt {os.environ['CLUSTERKIT_ATTEMPT']} starts at step {step}", flush=True)
    wrapped = nn.parallel.DistributedDataParallel(model)
    for _ in position.epochs(EPOCHS):
        for x, y in position.batches(loader):
            optimizer.zero_grad()
            nn.functional.mse_loss(wrapped(x), y).backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step == args.exit_after:
                os._exit(0)
            if saver.due(step):
                extra = {"hold": Hold(args.workdir / "held")} if step == args.hold_save and rank == 0 else {}
                saver.save(step, **state, **extra)  # the model's file first, then the hold
            if args.wait_for and step == 4:
                return late_save(args.wait_for, saver, state)
    saver.wait()
    if rank == 0:
        torch.save(model.state_dict(), args.workdir / f"weights-{os.environ['CLUSTERKIT_ATTEMPT']}.pt")
    print(f"rank {rank}: trained to step {step}", flush=True)
    dist.barrier()
    return 0


def late_save(go: Path, saver: Any, state: dict[str, Any]) -> int:
    """Wait until told, then try to save as this (by then overtaken) attempt."""
    from cluster_kit import checkpoint

    while not go.exists():
        time.sleep(0.1)  # another process's file: nothing in this one to wait on
    try:
        saver.save(8, **state)
    except checkpoint.Fenced as exc:
        print(f"refused: {exc}", flush=True)
        return 3
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--exit-after", type=int, default=0)
    parser.add_argument("--hold-save", type=int, default=0)
    parser.add_argument("--wait-for", type=Path)
    parser.add_argument("--async", dest="async_saves", action="store_true")
    return parser.parse_args(argv)


# --- the supervisor's side -----------------------------------------------------------------
@dataclass
class Attempt:
    """The ranks of one attempt."""

    number: int
    processes: list[subprocess.Popen[str]]

    def wait(self, deadline_s: float = DEADLINE_S) -> list[tuple[int, str]]:
        """(exit code, output) of every rank, killing those still running at the deadline."""
        return wait_ranks(self.processes, deadline_s)

    def kill(self) -> None:
        kill_ranks(self.processes)


def start_attempt(workdir: Path, number: int, *options: str) -> Attempt:
    """Start the ranks of attempt ``number`` as the supervisor would, with its control folder."""
    control = workdir / f"attempt-{number}"
    control.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, WORLD_SIZE=str(WORLD_SIZE), CLUSTERKIT_ATTEMPT=str(number), CLUSTERKIT_CHAIN_ID="4711",
               CLUSTERKIT_CONTROL_DIR=str(control), CLUSTERKIT_CHECKPOINT_EVERY="4",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    processes = [
        subprocess.Popen([sys.executable, __file__, str(workdir), *options], env=dict(env, RANK=str(rank)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir)
        for rank in range(WORLD_SIZE)
    ]
    return Attempt(number, processes)


if __name__ == "__main__":
    code = rank_main(sys.argv[1:])
    # As examples/train_ddp.py: leave without tearing the gloo group down under a peer.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
