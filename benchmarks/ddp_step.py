"""A real DDP training loop on the GPU(s): eager vs cluster_kit.ddp's graph vs a hand-written graph.

    PYTHONPATH=. python3 benchmarks/ddp_step.py [--json FILE]                 # 1 GPU
    PYTHONPATH=. torchrun --nproc-per-node=N benchmarks/ddp_step.py [--json FILE]

Every step is what a real job runs: warm-up + cosine LR schedule (a LambdaLR
stepped after every step), forward and loss under bf16 autocast, gradients
clipped to norm 1.0, AdamW with weight decay, a new batch every step. Models: MLPs
of Linear+GELU (MSE loss) and small pre-norm transformers (embedding, blocks of
SDPA attention and MLP, cross-entropy on tokens). Three ways to run the same step:

* *eager*: the plain loop, with AdamW as users create it (``capturable=False``);
* *graphed*: ``cluster_kit.ddp.build_step`` with the same options;
* *eager same-work*: the plain loop doing exactly the graph's work
  (``capturable=True``, autocast without its cache), which separates what those
  settings cost from what the graph gains;
* *hand graph*: the same step captured by hand the way PyTorch's CUDA graphs notes
  show (side stream, 11 warm-up iterations, static tensors, lr as a tensor the
  scheduler fills), the reference for what a graph of this step can cost.

Each optimizer is run in its multi-tensor ("foreach") and single-kernel ("fused")
form. Each figure is the median over ``--repeats`` runs of ``steps`` back-to-back
steps, wall clock with the GPU synchronized at both ends, cycling over 8 distinct
batches already on the GPU. Ratios: *speedup* = eager / graphed, *vs hand* =
hand graph / graphed (1.00 = as fast as the hand-written graph).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
import warnings
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
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
MAX_GRAD_NORM = 1.0
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Config:
    """An MLP (``depth`` layers of ``width``) or a transformer (``depth`` blocks)."""

    name: str
    kind: str  # "mlp" or "transformer"
    width: int
    depth: int
    batch: int
    steps: int
    seq: int = 0
    vocab: int = 0

    def flops_per_step(self) -> float:
        """Forward + backward matmul FLOPs (attention scores included)."""
        if self.kind == "mlp":
            return 6.0 * self.batch * self.width * self.width * self.depth
        tokens = self.batch * self.seq
        per_block = 12 * self.width * self.width  # qkv + out + 4x MLP
        attention = 2 * self.seq * self.width  # QK^T and AV per token
        return (
            6.0
            * tokens
            * (self.depth * (per_block + attention) + self.width * self.vocab)
        )


CONFIGS = [
    Config("mlp w256", "mlp", width=256, depth=8, batch=32, steps=200),
    Config("mlp w1024", "mlp", width=1024, depth=8, batch=32, steps=200),
    Config("mlp w8192 (compute)", "mlp", width=8192, depth=4, batch=8192, steps=20),
    Config(
        "gpt d256 L4",
        "transformer",
        width=256,
        depth=4,
        batch=8,
        steps=100,
        seq=128,
        vocab=4096,
    ),
    Config(
        "gpt d2048 L8 (compute)",
        "transformer",
        width=2048,
        depth=8,
        batch=8,
        steps=10,
        seq=1024,
        vocab=8192,
    ),
]


class Block(nn.Module):
    """Pre-norm transformer block: causal SDPA attention, then a GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.out(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Parameter(torch.zeros(cfg.seq, cfg.width))
        self.blocks = nn.Sequential(
            *[Block(cfg.width, max(1, cfg.width // 64)) for _ in range(cfg.depth)]
        )
        self.norm = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(tokens) + self.pos)))


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def loss_for(cfg: Config) -> LossFn:
    return token_loss if cfg.kind == "transformer" else F.mse_loss


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
    if cfg.kind == "transformer":
        return Transformer(cfg).to(device)
    layers: list[nn.Module] = []
    for _ in range(cfg.depth - 1):
        layers += [nn.Linear(cfg.width, cfg.width), nn.GELU()]
    layers.append(nn.Linear(cfg.width, cfg.width))
    return nn.Sequential(*layers).to(device)


def make_batches(cfg: Config, device: torch.device) -> list[Batch]:
    gen = torch.Generator(device=device).manual_seed(1 + dist.get_rank())
    out = []
    for _ in range(8):
        if cfg.kind == "transformer":
            shape = (cfg.batch, cfg.seq)
            x = torch.randint(cfg.vocab, shape, device=device, generator=gen)
            y = torch.randint(cfg.vocab, shape, device=device, generator=gen)
        else:
            shape = (cfg.batch, cfg.width)
            x = torch.randn(shape, device=device, generator=gen)
            y = torch.randn(shape, device=device, generator=gen)
        out.append((x, y))
    return out


def make_optimizer(
    model: nn.Module, impl: str, capturable: bool
) -> torch.optim.Optimizer:
    fused = impl == "fused"
    return torch.optim.AdamW(
        model.parameters(),
        lr=3e-4,
        weight_decay=0.1,
        capturable=capturable,
        fused=fused,
        foreach=not fused,
    )


def warmup_cosine(optimizer: torch.optim.Optimizer, total: int = 1000) -> Any:
    def factor(i: int) -> float:
        if i < 50:
            return (i + 1) / 50
        return 0.5 * (1 + math.cos(math.pi * min(i - 50, total) / total))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def eager_step(
    cfg: Config, device: torch.device, impl: str, as_graphed: bool = False
) -> StepFn:
    """The plain loop: DDP, schedule, bf16 autocast, clipping, AdamW as users make it.

    ``as_graphed``: the same loop doing exactly the graph's work, eagerly: AdamW
    with ``capturable=True`` and autocast without its weight-cast cache.
    """
    model = ddp.wrap_ddp(make_model(cfg, device), for_capture=False)
    opt = make_optimizer(model, impl, capturable=as_graphed)
    sched, loss_fn = warmup_cosine(opt), loss_for(cfg)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=DTYPE, cache_enabled=not as_graphed):
            loss = loss_fn(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return loss.detach()

    return step


def graphed_step(
    cfg: Config, device: torch.device, impl: str, example: Batch
) -> StepFn:
    model = ddp.wrap_ddp(make_model(cfg, device), for_capture=True)
    opt = make_optimizer(model, impl, capturable=False)
    sched = warmup_cosine(opt)
    step = ddp.build_step(
        model,
        opt,
        loss_for(cfg),
        example,
        enabled=True,
        autocast_dtype=DTYPE,
        max_grad_norm=MAX_GRAD_NORM,
    )
    if not step.graphed:
        raise SystemExit(f"{cfg.name}: not graphed: {step.reason}")

    def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = step(x, y)
        sched.step()
        return loss

    return run


def hand_graph_step(
    cfg: Config, device: torch.device, impl: str, example: Batch
) -> StepFn:
    """The same step captured by hand, as in PyTorch's CUDA graphs notes."""
    model = ddp.wrap_ddp(make_model(cfg, device), for_capture=True)
    opt = make_optimizer(model, impl, capturable=True)
    sched, loss_fn = warmup_cosine(opt), loss_for(cfg)
    for group in opt.param_groups:  # the scheduler fill_()s a tensor lr in place
        group["lr"] = torch.tensor(group["lr"], device=device)
    static_x, static_y = (t.clone() for t in example)

    def body() -> torch.Tensor:
        with torch.autocast("cuda", dtype=DTYPE, cache_enabled=False):
            loss = loss_fn(model(static_x), static_y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        return loss.detach()

    side = ddp.capture_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(ddp.DDP_MIN_WARMUP):
            opt.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream(device).wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        static_loss = body()

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        static_x.copy_(x, non_blocking=True)
        static_y.copy_(y, non_blocking=True)
        graph.replay()
        sched.step()
        return static_loss.clone()

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
    """Eager, graphed and hand graph of one model and optimizer: one row."""
    batches = make_batches(cfg, device)
    runs = {
        "eager": eager_step(cfg, device, impl),
        "eager_as_graphed": eager_step(cfg, device, impl, as_graphed=True),
        "graphed": graphed_step(cfg, device, impl, batches[0]),
        "hand": hand_graph_step(cfg, device, impl, batches[0]),
    }
    times = {
        name: time_steps(fn, batches, cfg.steps, repeats) for name, fn in runs.items()
    }
    del runs
    torch.cuda.empty_cache()
    med = {name: statistics.median(t) for name, t in times.items()}
    return {
        **asdict(cfg),
        "optimizer": f"AdamW {impl}",
        **{f"{name}_ms": m for name, m in med.items()},
        **{f"{name}_ms_all": t for name, t in times.items()},
        "speedup": med["eager"] / med["graphed"],
        "vs_hand": med["hand"] / med["graphed"],
        "vs_same_work": med["eager_as_graphed"] / med["graphed"],
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
        f"{'model':<24} {'optimizer':<13} {'eager ms':>9} {'graphed ms':>10} "
        f"{'hand ms':>9} {'speedup':>8} {'vs hand':>8} {'TFLOP/s':>8} "
        f"{'eager same-work ms':>18}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['name']:<24} {r['optimizer']:<13} {r['eager_ms']:>9.3f} "
            f"{r['graphed_ms']:>10.3f} {r['hand_ms']:>9.3f} {r['speedup']:>7.2f}x "
            f"{r['vs_hand']:>8.3f} {r['graphed_tflops']:>8.1f} "
            f"{r['eager_as_graphed_ms']:>18.3f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", help="run only the models whose name contains this")
    args = parser.parse_args()
    # The hand-written graph never calls opt.step() after capture, which LambdaLR
    # warns about; the warning says nothing about this benchmark.
    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler")
    configs = [c for c in CONFIGS if not args.only or args.only in c.name]
    with tempfile.TemporaryDirectory() as tmpdir:
        device = init_group(tmpdir)
        rows = []
        for cfg in configs:
            for impl in ("foreach", "fused"):
                rows.append(bench_config(cfg, impl, device, args.repeats))
                if dist.get_rank() == 0:
                    print(format_table(rows[-1:]).splitlines()[-1], flush=True)
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
