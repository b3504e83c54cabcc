"""A small multi-node DDP job that proves the cluster wiring before a real run.

Started once per rank by the script `clusterkit render` writes (srun sets RANK
from SLURM_PROCID; torchrun sets it through its rendezvous). It reads RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the environment, uses
NCCL when CUDA is available and Gloo otherwise, and

1. all-reduces rank+1 and prints, per rank,
   `rank=1 local_rank=1 world_size=4 master_addr=n1 allreduce_sum=10 expected=10 ok`;
2. trains a tiny model for a few DDP steps the way a real job does (AdamW,
   warm-up + cosine LR schedule, bf16 autocast on GPU, gradient clipping,
   optional micro-batch accumulation; graphed when the job sets
   `cuda_graphs: true`, with the model compiled by Inductor inside the graph
   for `cuda_graphs: {compile: true}`) and checks that every rank ends with the
   same weights.

It exits 1 when either check fails.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    parser.add_argument("--width", type=int, default=64, help="hidden layer width")
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size per rank")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="linear LR warm-up steps (default: a tenth of --steps)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0,
                        help="clip the total gradient norm to this (0: no clipping)")
    parser.add_argument("--accumulation-steps", type=int, default=1,
                        help="micro-batches per optimizer step")
    return parser.parse_args()


def setup() -> torch.device:
    """Join the process group named by the env:// variables; pick this rank's device."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", torch.device("cuda", local_rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(minutes=5))
    return device


def say(line: str) -> None:
    """Print one whole line in one write: every rank shares the job's output file,
    and a line written in pieces (text, then newline) can be cut by another rank's."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def check_allreduce(device: torch.device) -> bool:
    """All-reduce rank+1 and print this rank's one-line verdict."""
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)
    total, expected = int(value.item()), world * (world + 1) // 2
    verdict = "ok" if total == expected else "FAIL"
    say(
        f"rank={rank} local_rank={os.environ.get('LOCAL_RANK', '?')} world_size={world}"
        f" master_addr={os.environ.get('MASTER_ADDR', '?')}"
        f" allreduce_sum={total} expected={expected} {verdict}"
    )
    return total == expected


def load_ddp_helper() -> Any:
    """cluster_kit.ddp: installed, or from the checkout this example lives in (its folder on
    sys.path is all the trainer needs: it imports only the stdlib, torch and itself)."""
    try:
        from cluster_kit import ddp
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from cluster_kit import ddp
    return ddp


def build_model(device: torch.device, args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts them)
    return nn.Sequential(nn.Linear(16, args.width), nn.GELU(), nn.Linear(args.width, 1)).to(device)


def batch(generator: torch.Generator, device: torch.device, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's data: (k, micro-batch, 16) inputs when accumulating k micro-batches."""
    k = args.accumulation_steps
    shape = (k, args.batch, 16) if k > 1 else (args.batch, 16)
    inputs = torch.randn(*shape, generator=generator).to(device)
    return inputs, inputs.sum(dim=-1, keepdim=True)


def warmup_cosine(optimizer: torch.optim.Optimizer, args: argparse.Namespace) -> Any:
    """Linear warm-up to the peak lr, then cosine decay to a tenth of it."""
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, args.steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, args.steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_step(model: nn.Module, device: torch.device, example: tuple[torch.Tensor, torch.Tensor],
              args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer, Step]:
    """DDP model, optimizer and training step: eager, or captured in a CUDA graph.

    `cuda_graphs: true` in the job file exports CLUSTERKIT_CUDA_GRAPHS=1; then
    cluster_kit.ddp builds DDP on its capture stream and replays forward,
    backward, clipping and optimizer step from one graph (eager, with the reason
    printed, where capture is not possible, e.g. on CPU). `cuda_graphs: {compile:
    true}` also exports CLUSTERKIT_CUDA_GRAPHS_COMPILE, which build_step reads:
    the model and loss are compiled by Inductor and their kernels captured in
    the same graph. Either way the step runs bf16 autocast on GPU, clips the
    gradient norm and accumulates micro-batches, exactly as the plain loop would.
    """
    ddp = load_ddp_helper()
    graphs = ddp.graphs_requested()
    ddp_model = ddp.wrap_ddp(model, for_capture=graphs)
    on_gpu = device.type == "cuda"
    # Fused AdamW is the fastest on GPU, eager or graphed; capturable lets it be captured.
    optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=args.lr, weight_decay=0.01,
                                  fused=on_gpu, capturable=on_gpu and graphs)
    step = ddp.build_step(
        ddp_model, optimizer, nn.MSELoss(), example, enabled=graphs,
        autocast_dtype=torch.bfloat16 if on_gpu else None,
        max_grad_norm=args.max_grad_norm or None,
        accumulation_steps=args.accumulation_steps,
    )
    if graphs and dist.get_rank() == 0:
        compiled = f" compiled={str(step.compiled).lower()}" if ddp.compile_requested() is not None else ""
        say(f"cuda_graphs: graphed={str(step.graphed).lower()}{compiled} reason={step.reason or '-'}")
    return ddp_model, optimizer, step


def train(device: torch.device, args: argparse.Namespace) -> tuple[nn.Module, float]:
    """DDP steps on random data that differs per rank, on a warm-up + cosine LR
    schedule: (model, last loss)."""
    model = build_model(device, args)
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    _ddp_model, optimizer, step = make_step(model, device, batch(generator, device, args), args)
    schedule = warmup_cosine(optimizer, args)
    loss = torch.zeros(())
    for _ in range(args.steps):
        loss = step(*batch(generator, device, args))
        schedule.step()
    if dist.get_rank() == 0:
        norm = step.last_grad_norm
        say(f"rank=0 lr={optimizer.param_groups[0]['lr']:.3g}"
            f" grad_norm={'-' if norm is None else f'{float(norm):.4f}'}"
            f" accumulation_steps={args.accumulation_steps}")
    return model, float(loss.item())


def weights_in_sync(model: nn.Module) -> bool:
    """True when every rank holds the same weights (the point of DDP)."""
    checksum = torch.stack(
        [p.detach().double().sum() for p in model.parameters()]
    ).sum()
    low, high = checksum.clone(), checksum.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    return bool(torch.isclose(low, high, rtol=0, atol=1e-9))


def main() -> int:
    args = parse_args()
    device = setup()
    try:
        ok = check_allreduce(device)
        model, loss = train(device, args)
        in_sync = weights_in_sync(model)
        if dist.get_rank() == 0:
            verdict = "ok" if in_sync else "FAIL"
            say(f"rank=0 steps={args.steps} loss={loss:.4f} weights_in_sync={str(in_sync).lower()} {verdict}")
        return 0 if ok and in_sync else 1
    finally:
        dist.barrier()


if __name__ == "__main__":
    code = main()
    # Leave at once, every rank right after the last barrier, without tearing the
    # process group down: a gloo rank whose peer closed its connections first (in
    # destroy_process_group or at interpreter exit) aborts with "terminate called
    # without an active exception", and the job fails after training succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
