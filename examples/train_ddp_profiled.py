"""A DDP trainer profiled with cluster_kit.ddp.StepProfiler (for `clusterkit bench ddp`).

    python examples/train_ddp_profiled.py [--steps N] [--width W] [--depth D]
        [--slow-rank R --slow-ms MS] [--build-step] [--all-reduce-loss]

Started once per rank (srun or torchrun, env:// variables), Gloo on CPU and NCCL
on GPUs. With CLUSTERKIT_PROFILE_STEPS=N set (bench ddp sets it) each rank writes
a PyTorch profiler trace of N steps; unset, it just trains. ``--slow-rank`` makes
one rank compute ``--slow-ms`` longer per step (extra matmuls), the straggler a
report should name. ``--build-step`` uses cluster_kit.ddp.build_step, which
profiles by itself, instead of the explicit StepProfiler loop.
``--all-reduce-loss`` all-reduces the loss after every step, as trainers do to
log the mean loss: the job's own collective beside DDP's gradient buckets.

It keeps training the way a job with `resilience:` does: with
CLUSTERKIT_CHECKPOINT_DIR set it resumes through cluster_kit.checkpoint from the
newest checkpoint there that verifies (training only the steps still to do, none
once the run is finished) and saves one when done. `bench ddp` points CLUSTERKIT_CHECKPOINT_DIR at a fresh folder per
launch, so every benchmark launch trains (and records) its steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# The plain example beside this file: its process-group setup and cluster_kit.ddp loader.
from train_ddp import load_ddp_helper, setup


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps")
    parser.add_argument("--width", type=int, default=256, help="hidden layer width")
    parser.add_argument("--depth", type=int, default=4, help="hidden layers")
    parser.add_argument("--batch", type=int, default=64, help="batch size per rank")
    parser.add_argument("--slow-rank", type=int, default=-1, help="rank that computes longer")
    parser.add_argument("--slow-ms", type=float, default=0.0, help="extra compute per step there")
    parser.add_argument("--build-step", action="store_true", help="profile through build_step")
    parser.add_argument("--all-reduce-loss", action="store_true", help="all-reduce the loss every step")
    return parser.parse_args()


def build_model(args: argparse.Namespace, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(64, args.width), nn.ReLU()]
    for _ in range(args.depth - 1):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    layers.append(nn.Linear(args.width, 1))
    return nn.Sequential(*layers).to(device)


def busy(ms: float, device: torch.device) -> None:
    """Compute (not sleep) for about ``ms``: a profiler sees it as the rank's own work."""
    if ms <= 0:
        return
    a = torch.randn(256, 256, device=device)
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def open_checkpoints() -> Any | None:
    """A cluster_kit.checkpoint Checkpointer over CLUSTERKIT_CHECKPOINT_DIR, when it is set.

    Without clusterkit installed, the checkout this example lives in is put on the path.
    """
    if not os.environ.get("CLUSTERKIT_CHECKPOINT_DIR"):
        return None
    try:
        from cluster_kit import checkpoint
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from cluster_kit import checkpoint
    return checkpoint.Checkpointer()


def main() -> int:
    args = parse_args()
    ddp = load_ddp_helper()
    ddp.prepare_process_group_env()  # CUDA graphs need NCCL's async error handling off
    device = setup()
    model = ddp.wrap_ddp(build_model(args, device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    extra = args.slow_ms if dist.get_rank() == args.slow_rank else 0.0
    saver = open_checkpoints()
    loaded = saver.load(model=model, optimizer=optimizer) if saver else None
    done = loaded.step if loaded else 0
    todo = max(0, args.steps - done)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randn(args.batch, 64, generator=generator).to(device)
        return inputs, inputs.sum(dim=1, keepdim=True)

    def eager(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        busy(extra, device)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def logged(loss: torch.Tensor) -> torch.Tensor:
        """The mean loss over the ranks, as a trainer logs it (the job's own all-reduce)."""
        if args.all_reduce_loss:
            loss = loss.clone()
            dist.all_reduce(loss)
            loss /= dist.get_world_size()
        return loss

    loss = torch.zeros(())

    if args.build_step:
        step = ddp.build_step(model, optimizer, loss_fn, batch())
        for _ in range(todo):
            busy(extra, device)
            loss = logged(step(*batch()))
    else:
        with ddp.StepProfiler() as prof:
            for _ in range(todo):
                loss = logged(eager(*batch()))
                prof.step()
    if saver:
        saver.save(done + todo, model=model, optimizer=optimizer)
    if dist.get_rank() == 0:
        sys.stdout.write(f"rank=0 steps={todo} resumed_at={done} loss={float(loss):.4f} ok\n")
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    # As in train_ddp.py: every rank leaves right after the last barrier, without
    # tearing the gloo group down under a peer (which aborts that peer).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
