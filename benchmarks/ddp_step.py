"""Eager vs CUDA-graphed DDP training step time on the GPU(s).

    PYTHONPATH=. python3 benchmarks/ddp_step.py [--json FILE]                 # 1 GPU
    PYTHONPATH=. torchrun --nproc-per-node=N benchmarks/ddp_step.py [--json FILE]

Models are MLPs (Linear+ReLU, float32, MSE loss, AdamW). The eager baseline is the
usual loop (plain DDP, AdamW with capturable=False as users run it); "eager
capturable" is the same loop with the optimizer the graph needs
(AdamW(capturable=True)), which separates the optimizer's own cost from the
graph's gain; "graphed" is cluster_kit.ddp's captured step. Each optimizer is run
in its multi-tensor ("foreach") and single-kernel ("fused") form. Each figure is
the median over ``--repeats`` runs of ``--steps`` back-to-back steps, wall clock
with the GPU synchronized at both ends, cycling over 8 distinct batches already
on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from cluster_kit import ddp

Batch = tuple[torch.Tensor, torch.Tensor]
StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Config:
    """One model: ``depth`` Linear layers of ``width``, batches of ``batch`` rows."""

    name: str
    width: int
    depth: int
    batch: int
    steps: int

    def flops_per_step(self) -> float:
        """Forward + backward matmul FLOPs (3 x 2 x batch x width^2 per layer)."""
        return 6.0 * self.batch * self.width * self.width * self.depth


CONFIGS = [
    Config("launch-bound w256", width=256, depth=8, batch=32, steps=200),
    Config("launch-bound w1024", width=1024, depth=8, batch=32, steps=200),
    Config("compute-bound w4096", width=4096, depth=4, batch=4096, steps=10),
]


def init_group(tmpdir: str) -> torch.device:
    """NCCL from torchrun's environment, or a one-rank group on a local file store."""
    ddp.prepare_process_group_env(enabled=True)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    if "RANK" in os.environ:
        dist.init_process_group("nccl", device_id=device)
    else:
        store = f"file://{tmpdir}/store"
        dist.init_process_group(
            "nccl", init_method=store, rank=0, world_size=1, device_id=device
        )
    return device


def make_model(cfg: Config, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(cfg.depth - 1):
        layers += [nn.Linear(cfg.width, cfg.width), nn.ReLU()]
    layers.append(nn.Linear(cfg.width, cfg.width))
    return nn.Sequential(*layers).to(device)


def make_batches(
    cfg: Config, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator(device=device).manual_seed(1 + dist.get_rank())
    shape = (cfg.batch, cfg.width)
    return [
        (
            torch.randn(shape, device=device, generator=gen),
            torch.randn(shape, device=device, generator=gen),
        )
        for _ in range(8)
    ]


def make_optimizer(
    model: nn.Module, impl: str, capturable: bool
) -> torch.optim.Optimizer:
    """AdamW with its multi-tensor ("foreach") or single-kernel ("fused") update."""
    fused = impl == "fused"
    return torch.optim.AdamW(
        model.parameters(),
        lr=1e-4,
        capturable=capturable,
        fused=fused,
        foreach=not fused,
    )


def eager_step(
    cfg: Config, device: torch.device, impl: str, capturable: bool
) -> StepFn:
    """The usual eager DDP loop body (plain DDP on the current stream)."""
    model = ddp.wrap_ddp(make_model(cfg, device), for_capture=False)
    opt = make_optimizer(model, impl, capturable)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def graphed_step(
    cfg: Config, device: torch.device, impl: str, example: Batch
) -> StepFn:
    model = ddp.wrap_ddp(make_model(cfg, device), for_capture=True)
    step = ddp.GraphedStep(
        model, make_optimizer(model, impl, True), F.mse_loss, example
    )
    if not step.graphed:
        raise SystemExit(f"{cfg.name}: capture failed: {step.reason}")
    return step


def time_steps(
    step: StepFn, batches: list[Batch], steps: int, repeats: int
) -> list[float]:
    """Milliseconds per step for each repeat (after 5 untimed steps)."""
    for i in range(5):
        step(*batches[i % len(batches)])
    results = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(steps):
            step(*batches[i % len(batches)])
        torch.cuda.synchronize()
        results.append((time.perf_counter() - start) * 1e3 / steps)
    return results


def bench_config(
    cfg: Config, impl: str, device: torch.device, repeats: int
) -> dict[str, Any]:
    """Eager (capturable off, as users run it), eager capturable, graphed: one row."""
    batches = make_batches(cfg, device)
    runs = {
        "eager": eager_step(cfg, device, impl, capturable=False),
        "eager_capturable": eager_step(cfg, device, impl, capturable=True),
        "graphed": graphed_step(cfg, device, impl, batches[0]),
    }
    times = {
        name: time_steps(fn, batches, cfg.steps, repeats) for name, fn in runs.items()
    }
    med = {name: statistics.median(t) for name, t in times.items()}
    return {
        **asdict(cfg),
        "optimizer": f"AdamW {impl}",
        **{f"{name}_ms": m for name, m in med.items()},
        **{f"{name}_ms_all": t for name, t in times.items()},
        "speedup": med["eager"] / med["graphed"],
        "speedup_same_optimizer": med["eager_capturable"] / med["graphed"],
        "graphed_tflops": cfg.flops_per_step() / (med["graphed"] * 1e-3) / 1e12,
    }


def facts(device: torch.device) -> dict[str, Any]:
    return {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
        "world_size": dist.get_world_size(),
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """Per model and optimizer: the three step times and the two ratios."""
    head = (
        f"{'model':<20} {'optimizer':<13} {'eager ms':>9} {'eager capt. ms':>14} "
        f"{'graphed ms':>10} {'speedup':>8} {'vs capt.':>8}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['name']:<20} {r['optimizer']:<13} {r['eager_ms']:>9.3f} "
            f"{r['eager_capturable_ms']:>14.3f} {r['graphed_ms']:>10.3f} "
            f"{r['speedup']:>7.2f}x {r['speedup_same_optimizer']:>7.2f}x"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        device = init_group(tmpdir)
        rows = [
            bench_config(cfg, impl, device, args.repeats)
            for cfg in CONFIGS
            for impl in ("foreach", "fused")
        ]
        if dist.get_rank() == 0:
            doc = {**facts(device), "rows": rows}
            print(json.dumps({k: v for k, v in doc.items() if k != "rows"}))
            print(format_table(rows))
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump(doc, fh, indent=2)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
