"""A DDP job that keeps training: it checkpoints, resumes, and stops when told.

Run under a job with `resilience:` (examples/cpu-resilient.yaml). Each rank:

- resumes through `cluster_kit.checkpoint` from the newest checkpoint in
  `$CLUSTERKIT_CHECKPOINT_DIR` that verifies (model, optimizer, random number
  generators and the step to go on from);
- calls `cluster_kit.ddp.heartbeat()` once a step, so the supervisor sees progress;
- saves a checkpoint when `--checkpoint-every` says (steps, a duration such as
  `30m`, or `auto`; by default the job's `resilience.checkpoint_every`, else 5
  steps), and at once when `stop_requested()` turns True on any rank (the grace
  signal before the time limit);
- writes the final weights to `--weights-out` (rank 0) when all steps are done.

The batch of every (step, rank) is drawn from its own seed, so a run that was
interrupted and resumed trains on the same data as one that was not.

Faults to try the supervisor with: `--plant ATTEMPT:KIND:RANK:STEP` (repeatable;
ATTEMPT a number, compared with `CLUSTERKIT_ATTEMPT`, or `any`): KIND `hang` stops
the rank in `load_batch` at that step (the others wait in DDP's all-reduce),
`raise` makes it raise there, `segv` kills it with a segmentation fault, `oom` makes it
allocate host memory until the kernel's OOM killer ends it (inside a job with `mem:`). `--plant 0:hang:3:10` hangs rank 3 at step 10 of
the first attempt only. `--ignore-stop` never looks at `stop_requested()` (a script
not written for clusterkit, killed at its time limit); `--slow-save STEP:SECONDS`
keeps rank 0 inside `ddp.paused` that much longer after STEP, as a slow save would.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from cluster_kit import checkpoint, ddp


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps in all")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time each step takes")
    parser.add_argument("--width", type=int, default=64, help="hidden width")
    parser.add_argument("--layers", type=int, default=0,
                        help="more hidden layers of --width (a bigger model costs more to checkpoint)")
    parser.add_argument("--checkpoint-every", default=os.environ.get("CLUSTERKIT_CHECKPOINT_EVERY", "5"),
                        help="steps between checkpoints, a duration (30m) or auto")
    parser.add_argument("--weights-out", default="", help="rank 0 writes the final weights here (torch.save)")
    parser.add_argument("--plant", action="append", default=[], type=planted, metavar="ATTEMPT:KIND:RANK:STEP",
                        help="a fault: KIND hang, raise, segv or oom, ATTEMPT a number or any (repeatable)")
    parser.add_argument("--ignore-stop", action="store_true",
                        help="never look at stop_requested() (a script not written for clusterkit)")
    parser.add_argument("--slow-save", type=slow_save, default=(-1, 0.0), metavar="STEP:SECONDS",
                        help="rank 0 takes SECONDS longer after STEP, inside ddp.paused, as a slow save would")
    return parser.parse_args()


def planted(text: str) -> tuple[str, str, int, int]:
    attempt, kind, rank, step = text.split(":")
    if kind not in ("hang", "raise", "segv", "oom") or not (attempt == "any" or attempt.isdigit()):
        raise ValueError(text)
    return attempt, kind, int(rank), int(step)


def slow_save(text: str) -> tuple[int, float]:
    step, seconds = text.split(":")
    return int(step), float(seconds)


def fault_at(plants: list, attempt: int, rank: int, step: int) -> str | None:
    """`hang`, `raise`, `segv`, `oom` or None: what was planted for this rank at this step of this attempt."""
    for when, kind, where, at in plants:
        if when in ("any", str(attempt)) and (where, at) == (rank, step):
            return kind
    return None


def load_batch(step: int, rank: int, hang: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of `step`; with `hang`, it never comes (a stuck data loader)."""
    while hang:
        time.sleep(0.5)
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=generator), torch.randn(16, 1, generator=generator)


def stop_everywhere(ignore: bool) -> bool:
    """True on every rank once any rank was told to stop (never with `ignore`)."""
    flag = torch.tensor([1.0 if ddp.stop_requested() and not ignore else 0.0])
    dist.all_reduce(flag)
    return bool(flag.item())


def main() -> int:
    args = parse_args()
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(minutes=10))
    rank = dist.get_rank()
    attempt = int(os.environ.get("CLUSTERKIT_ATTEMPT", "0"))
    torch.manual_seed(0)
    hidden = [layer for _ in range(args.layers) for layer in (nn.Linear(args.width, args.width), nn.Tanh())]
    model = nn.Sequential(nn.Linear(32, args.width), nn.Tanh(), *hidden, nn.Linear(args.width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    saver = checkpoint.configure(os.environ.get("CLUSTERKIT_CHECKPOINT_DIR", "checkpoints"),
                                 every=args.checkpoint_every)
    loaded = saver.load(model=model, optimizer=optimizer)
    start = loaded.step if loaded else 0
    print(f"rank {rank}: attempt {attempt} starts at step {start} of {args.steps}", flush=True)
    wrapped = nn.parallel.DistributedDataParallel(model)
    for step in range(start, args.steps):
        fault = fault_at(args.plant, attempt, rank, step)
        if fault == "raise":
            raise RuntimeError(f"rank {rank}: planted fault at step {step}")
        if fault == "segv":  # as a GPU or memory fault kills a process: a node's fault, not the script's
            faulthandler._sigsegv()
        if fault == "oom":  # a leak: memory touched page by page until the cgroup's OOM killer ends it
            hoard = []
            while True:
                hoard.append(bytearray(64 << 20))
        inputs, targets = load_batch(step, rank, fault == "hang")
        optimizer.zero_grad()
        nn.functional.mse_loss(wrapped(inputs), targets).backward()
        optimizer.step()
        ddp.heartbeat()
        time.sleep(args.step_seconds)
        done = step + 1
        if done == args.slow_save[0] and rank == 0:
            with ddp.paused("checkpoint"):  # as a save this much slower would; the others wait for it
                time.sleep(args.slow_save[1])
        if stop_everywhere(args.ignore_stop):
            saver.save(done, model=model, optimizer=optimizer)
            print(f"rank {rank}: stopped at step {done} for the time limit", flush=True)
            return 0
        if saver.due(done):
            saver.save(done, model=model, optimizer=optimizer)
            if rank == 0:
                print(f"checkpoint: step {done} -> {saver.directory}", flush=True)
    saver.wait()
    if rank == 0 and args.weights_out:
        torch.save(model.state_dict(), args.weights_out)
    print(f"rank {rank}: trained {args.steps} steps", flush=True)
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    # Every rank leaves right after the last barrier, without tearing the process
    # group down: a gloo rank whose peer closed its connections first aborts
    # ("terminate called without an active exception") after training succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
