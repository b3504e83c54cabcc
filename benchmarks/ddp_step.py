"""A real DDP training loop on the GPU(s): eager vs cluster_kit.ddp's graph vs a hand-written graph.

    PYTHONPATH=. python3 benchmarks/ddp_step.py [--json FILE]                 # 1 GPU
    PYTHONPATH=. torchrun --nproc-per-node=N benchmarks/ddp_step.py [--json FILE]

Every step is what a real job runs: warm-up + cosine LR schedule (a LambdaLR
stepped after every step), forward and loss under bf16 autocast, gradients
clipped to norm 1.0, AdamW with weight decay, a new batch every step. Models: MLPs
of Linear+GELU (MSE loss) and small pre-norm transformers (embedding, blocks of
SDPA attention and MLP, cross-entropy on tokens). The ways to run the same step:

* *eager*: the plain loop, with AdamW as users create it (``capturable=False``);
* *graphed*: ``cluster_kit.ddp.build_step`` with the same options and
  ``keep_faster=False``: the graph, whatever it costs;
* *build_step*: the same call as a job makes it (``keep_faster=True``, the
  default): its trial on the example batch keeps the graph or the eager step,
  whichever was faster (the ``kept`` column);
* *build_step_compiled*: the same with ``compile=True`` (a job's ``cuda_graphs:
  {compile: true}``): the model and loss compiled by Inductor (mode default),
  then the whole step captured as one graph; its trial compares the compiled
  step eagerly with its graph (``kept_compiled``);
* *build_step_blocks*: build_step_compiled with only the model's repeated
  blocks compiled, the embedding, last norm and head running their own kernels
  inside the graph: the layout ``ddp.compile_model`` does not take, measured
  beside the one it takes (the blocks compiled once and the rest compiled around
  them): fewer graphs to compile, more kernels to run;
* *eager same-work*: the plain loop doing exactly the graph's work
  (``capturable=True``, autocast without its cache), which separates what those
  settings cost from what the graph gains;
* *eager side*: the plain loop with DDP built and run on the capture stream, as
  build_step runs the eager steps it keeps (``--ways`` picks which ways run);
* *hand graph*: the same step captured by hand the way PyTorch's CUDA graphs notes
  show (side stream, 11 warm-up iterations, static tensors, lr as a tensor the
  scheduler fills), the reference for what a graph of this step can cost;
* *compile*: the plain loop through ``torch.compile(mode="reduce-overhead")``:
  the whole step (forward, loss, backward, clipping, AdamW with
  ``capturable=True`` and a tensor lr) if it compiles, else the model alone
  (the ``compiled`` column says which; ``--compile-scope model`` forces the
  latter). Only when named in ``--ways`` (compiling takes minutes). Its
  CUDA-graph trees end in an illegal memory access when other captured graphs
  replay between their calls (torch 2.11, H200), so it is timed after the other
  ways, taking turns with a plain loop of its own (``compile_eager``), which
  its speedup is measured against.

Set-up (``<way>_setup_s``, the ``set-up s`` columns): wall time from building a
way's step (build_step's capture and trial, the hand graph's warm-up and
capture, torch.compile's compiling and CUDA-graph recording) through its first
3 calls, synchronized at both ends; the first way built also pays one-time
CUDA library start-up, and the first way compiled the start of dynamo, Inductor
and Triton in the process (``--first-compile`` pays that first, apart; with
``--first-compile model`` also what a process pays once at its first compile of
a transformer, either way). Of it,
``<way>_compiler_s``: the time dynamo and Inductor report for compiling (forward
and backward, Triton's kernels included; from ``torch._dynamo.utils.compile_times``).

Roofline (``roofline_ms``, and ``<way>_x_roofline`` = the way's ms / it): the
model's matmul FLOPs (``Config.flops_per_step``) at the GPU's bf16 matrix rate,
plus the optimizer's bytes at its memory bandwidth: 40 bytes a parameter (fused
AdamW over float32 reads parameter, gradient and both moments and writes three
of them back, 28 B; clipping reads the gradients for their norm and reads and
writes them to scale them, 12 B). Activations' traffic is left out, so no step
can reach it. Both rates are measured at the start (an 8192^3 bf16 matmul;
a 1 GiB device-to-device copy, bytes read plus written) and printed with the
figures; ``--rates datasheet`` uses the H100/H200 SXM datasheet instead (989
TFLOP/s dense bf16; 3.35 / 4.8 TB/s). The models' names are ``--only`` friendly: ``gpt``,
``small gpt`` (the three sizes, d128 L4, d512 L4, d1024 L8, seq 256, batch 8),
``mlp``, ``compute``; ``--impls`` picks the AdamW forms.

Each optimizer is run in its multi-tensor ("foreach") and single-kernel ("fused")
form. Each figure is the median over ``--repeats`` runs of ``steps`` back-to-back
steps, wall clock with the GPU synchronized at both ends, cycling over 8 distinct
batches already on the GPU; the ways take turns within each repeat, in an order
rotated from one repeat to the next. Ratios: *speedup* = eager / graphed, *vs hand* =
hand graph / graphed (1.00 = as fast as the hand-written graph), *build_step vs
eager* = eager / build_step (>= 1.00: the step a job gets is no slower than eager).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from cluster_kit import ddp
from cluster_kit.trainer.step import compile as compiling

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
    # "small gpt": the three sizes the torch.compile comparison runs at.
    Config("small gpt d128 L4", "transformer", width=128, depth=4, batch=8,
           steps=100, seq=256, vocab=4096),
    Config("small gpt d512 L4", "transformer", width=512, depth=4, batch=8,
           steps=100, seq=256, vocab=4096),
    Config("small gpt d1024 L8", "transformer", width=1024, depth=8, batch=8,
           steps=50, seq=256, vocab=4096),
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
    cfg: Config, device: torch.device, impl: str, as_graphed: bool = False,
    on_capture_stream: bool = False,
) -> StepFn:
    """The plain loop: DDP, schedule, bf16 autocast, clipping, AdamW as users make it.

    ``as_graphed``: the same loop doing exactly the graph's work, eagerly: AdamW
    with ``capturable=True`` and autocast without its weight-cast cache.
    ``on_capture_stream``: the plain loop with DDP built and run on the capture
    stream, where build_step runs the eager steps it keeps.
    """
    model = ddp.wrap_ddp(make_model(cfg, device), for_capture=on_capture_stream)
    opt = make_optimizer(model, impl, capturable=as_graphed)
    sched, loss_fn = warmup_cosine(opt), loss_for(cfg)
    stream = ddp.capture_stream(device) if on_capture_stream else None

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=DTYPE, cache_enabled=not as_graphed):
            loss = loss_fn(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if stream is None:
            loss = body(x, y)
        else:
            current = torch.cuda.current_stream(device)
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                loss = body(x, y)
            current.wait_stream(stream)
        sched.step()
        return loss

    return step


def built_step(
    cfg: Config, device: torch.device, impl: str, example: Batch, keep_faster: bool,
    compile: bool = False,
) -> tuple[StepFn, ddp.TrainingStep]:
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
        keep_faster=keep_faster,
        compile=compile,
    )
    if compile and not step.compiled:
        print(f"{cfg.name} {impl}: not compiled: {step.reason}", flush=True)
    if not keep_faster and not step.graphed:
        raise SystemExit(f"{cfg.name}: not graphed: {step.reason}")

    def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = step(x, y)
        sched.step()
        return loss

    return run, step


@contextlib.contextmanager
def blocks_only() -> Iterator[None]:
    """``ddp.compile_model`` compiling only the model's repeated blocks, while building
    a step (build_step_blocks): the rest of the model runs its own kernels."""
    real = compiling.compile_model

    def compile_blocks(model: nn.Module, **options: Any) -> Callable[..., Any]:
        target = ddp.compile_target(model)
        regions = compiling.Regions(ddp.repeated_blocks(target), options)

        def forward(*args: Any, **kwargs: Any) -> Any:
            with regions:
                return target(*args, **kwargs)

        return forward

    compiling.compile_model = compile_blocks  # what build_step's compile calls
    try:
        yield
    finally:
        compiling.compile_model = real


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

    # The graph writes into DDP's buckets, which live as long as the model: without
    # this reference the model went with this frame, and the replays wrote into
    # memory the next way's allocations had taken (an illegal memory access at d1024).
    step.keep_alive = (model, opt)  # type: ignore[attr-defined]
    return step


def compiled_step(
    cfg: Config, device: torch.device, impl: str, example: Batch, scope: str = "auto"
) -> tuple[StepFn, str]:
    """The plain loop through ``torch.compile(mode="reduce-overhead")``.

    First the whole step (forward, loss, backward, clipping, AdamW) as one
    compiled function; if that fails on the example batch, the model alone is
    compiled and the rest of the step runs eagerly. Returns the step and what
    was compiled ("step" or "model"). The whole step needs what any graph of
    it needs: AdamW ``capturable=True`` and the lr as a tensor the scheduler
    fills, else every new lr would recompile. ``scope`` "model" skips the
    whole-step attempt (a failure that kills the process cannot fall back).

    On one rank the compiled model is not wrapped in DDP: with DDP, the
    reduce-overhead step ended in an illegal memory access in NCCL's all-reduce
    on torch 2.11 (H200, one rank). Its all-reduce of one rank moves no data.
    """
    if scope == "model":
        return _compiled(cfg, device, impl, whole=False), "model"
    try:
        step = _compiled(cfg, device, impl, whole=True)
        for i in range(3):  # compile, then CUDA-graph warm-up and recording
            step(*example)
        torch.cuda.synchronize(device)
        return step, "step"
    except Exception as exc:  # noqa: BLE001 - any failure falls back to the model
        print(f"{cfg.name} {impl}: whole-step compile failed ({type(exc).__name__}: "
              f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); compiling the model only",
              flush=True)
        torch._dynamo.reset()
    step = _compiled(cfg, device, impl, whole=False)
    return step, "model"


def _compiled(cfg: Config, device: torch.device, impl: str, whole: bool) -> StepFn:
    model = make_model(cfg, device)
    if dist.get_world_size() > 1:
        model = ddp.wrap_ddp(model, for_capture=False)
    opt = make_optimizer(model, impl, capturable=whole)
    sched, loss_fn = warmup_cosine(opt), loss_for(cfg)
    if whole:
        for group in opt.param_groups:
            group["lr"] = torch.tensor(group["lr"], device=device)
    forward = model if whole else torch.compile(model, mode="reduce-overhead")

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=DTYPE):
            loss = loss_fn(forward(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    run = torch.compile(body, mode="reduce-overhead") if whole else body

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        loss = run(x, y).clone()
        sched.step()
        return loss

    return step


SETUP_CALLS = 3  # set-up: building the step and its first calls, synchronized
# compile_times' outermost timers: a frame's compile (forward, Inductor's included), a backward's.
COMPILER_TIMERS = ("_compile.compile_inner", "backward._backward_impl")


# --first-compile model: a one-block transformer of sizes no benchmarked model has, so
# none of its graphs or kernels is found again in a cache by the way timed after it.
FIRST_COMPILE_MODEL = Config("first compile", "transformer", width=48, depth=1, batch=2,
                             steps=1, seq=40, vocab=96)


def first_compile(device: torch.device, what: str = "function") -> float:
    """Seconds of the process's first torch.compile, forward and backward, paid apart
    from every way's set-up (``--first-compile``): it starts dynamo, Inductor, Triton
    and Inductor's compile workers, whichever way compiles first.

    ``function``: a small function (a few kernels). ``model``: a one-block
    transformer and its loss under bf16 autocast (FIRST_COMPILE_MODEL), which also
    pays what a process does once at its first compile of such a model, for either
    way alike: Inductor's lowerings and graph passes for matmul, attention, norms,
    the embedding and the loss, and a first kernel in more of the compile workers.
    """
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    if what == "model":
        cfg = FIRST_COMPILE_MODEL
        model = make_model(cfg, device)
        tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq), device=device)
        with torch.autocast("cuda", dtype=DTYPE):
            loss = torch.compile(lambda t: token_loss(model(t), t))(tokens)
        loss.backward()
    else:
        x = torch.randn(1024, 1024, device=device, requires_grad=True)
        torch.compile(lambda t: (t.sin() * t.cos()).sum(dim=1).mean())(x).backward()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    torch._dynamo.reset()
    return seconds


def compiler_seconds() -> float:
    """Seconds dynamo and Inductor have spent compiling in this process so far."""
    names, values = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
    return sum(float(v) for n, v in zip(names, values) if n in COMPILER_TIMERS)


def time_steps(
    runs: dict[str, StepFn], batches: list[Batch], steps: int, repeats: int
) -> dict[str, list[float]]:
    """Milliseconds per step of each run, one repeat of each in turn (after 5 untimed steps).

    The runs take turns, in an order rotated every repeat, so that a GPU that slows
    down as it warms up over the minutes of a row slows all of them alike.
    """
    for step in runs.values():
        for i in range(5):
            step(*batches[i % len(batches)])
    names = list(runs)
    results: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            torch.cuda.synchronize()
            start = time.perf_counter()
            for i in range(steps):
                runs[name](*batches[i % len(batches)])
            torch.cuda.synchronize()
            results[name].append((time.perf_counter() - start) * 1e3 / steps)
    return results


WAYS = ("eager", "eager_as_graphed", "graphed", "hand", "build_step", "build_step_compiled",
        "build_step_blocks", "compile", "eager_side")
DEFAULT_WAYS = ("eager", "eager_as_graphed", "graphed", "hand", "build_step")
RATIOS = {  # name: (numerator way, denominator way)
    "speedup": ("eager", "graphed"),
    "vs_hand": ("hand", "graphed"),
    "vs_same_work": ("eager_as_graphed", "graphed"),
    "build_step_vs_eager": ("eager", "build_step"),
    "compile_speedup": ("compile_eager", "compile"),
    "build_step_vs_compile": ("compile", "build_step"),
    "compiled_vs_compile": ("compile", "build_step_compiled"),
    "compiled_vs_build_step": ("build_step", "build_step_compiled"),
    "blocks_vs_compile": ("compile", "build_step_blocks"),
    "compiled_vs_blocks": ("build_step_blocks", "build_step_compiled"),
}
SETUP_RATIOS = {  # name: the compiled build_step way whose set-up compile's is divided by
    "setup_vs_compile": "build_step_compiled",
    "blocks_setup_vs_compile": "build_step_blocks",
}
OPTIMIZER_BYTES_PER_PARAM = 28 + 12  # fused AdamW over float32 + clipping (see the docstring)
DATASHEET = {"H100": (989e12, 3.35e12), "H200": (989e12, 4.8e12)}  # dense bf16 FLOP/s, bytes/s


def measure_rates(device: torch.device) -> tuple[float, float]:
    """(bf16 matmul FLOP/s, device memory bytes/s read + written), measured here."""
    flops, bandwidth = _matmul_rate(device), _copy_bandwidth(device)
    torch.cuda.empty_cache()
    return flops, bandwidth


def _seconds_per_call(run: Callable[[], Any], device: torch.device, reps: int = 10) -> float:
    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) * 1e-3 / reps


def _matmul_rate(device: torch.device, n: int = 8192) -> float:
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    return 2 * n**3 / _seconds_per_call(lambda: a @ b, device)


def _copy_bandwidth(device: torch.device) -> float:
    src = torch.randn(2**28, device=device)  # 1 GiB of float32
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / _seconds_per_call(lambda: dst.copy_(src), device)


def datasheet_rates(device: torch.device) -> tuple[float, float]:
    name = torch.cuda.get_device_name(device)
    for chip, rates in DATASHEET.items():
        if chip in name:
            return rates
    raise SystemExit(f"--rates datasheet: no datasheet figures for {name!r}; use --rates measured")


def roofline_ms(cfg: Config, params: int, rates: tuple[float, float]) -> float:
    """Model FLOPs at the bf16 rate + the optimizer's bytes at the memory bandwidth, in ms."""
    flops, bandwidth = rates
    return (cfg.flops_per_step() / flops + params * OPTIMIZER_BYTES_PER_PARAM / bandwidth) * 1e3


def bench_config(
    cfg: Config, impl: str, device: torch.device, repeats: int, ways: list[str],
    compile_scope: str = "auto", rates: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The chosen ways of running one model and optimizer's step: one row."""
    batches = make_batches(cfg, device)
    example = batches[0]
    kept_step = None
    kept_compiled = None
    compiled = None
    setup_s: dict[str, float] = {}
    compiler_s: dict[str, float] = {}

    def build(way: str) -> StepFn:
        nonlocal kept_step, kept_compiled, compiled
        torch.cuda.synchronize(device)
        start, compiled_before = time.perf_counter(), compiler_seconds()
        if way == "compile":
            step, compiled = compiled_step(cfg, device, impl, example, compile_scope)
        elif way == "build_step":
            step, kept_step = built_step(cfg, device, impl, example, keep_faster=True)
        elif way == "build_step_compiled":
            step, kept_compiled = built_step(cfg, device, impl, example, keep_faster=True, compile=True)
        elif way == "build_step_blocks":
            with blocks_only():
                step = built_step(cfg, device, impl, example, keep_faster=True, compile=True)[0]
        elif way == "graphed":
            step = built_step(cfg, device, impl, example, keep_faster=False)[0]
        elif way == "hand":
            step = hand_graph_step(cfg, device, impl, example)
        else:
            step = eager_step(cfg, device, impl, as_graphed=way == "eager_as_graphed",
                              on_capture_stream=way == "eager_side")
        for i in range(SETUP_CALLS):
            step(*batches[i % len(batches)])
        torch.cuda.synchronize(device)
        setup_s.setdefault(way, time.perf_counter() - start)
        compiler_s.setdefault(way, compiler_seconds() - compiled_before)
        return step

    runs = {way: build(way) for way in ways if way != "compile"}
    times = time_steps(runs, batches, cfg.steps, repeats) if repeats else {}
    del runs
    torch.cuda.empty_cache()
    if "compile" in ways:
        # torch.compile's CUDA-graph trees end in an illegal memory access when
        # other captured graphs replay between their calls (torch 2.11), so the
        # compiled step takes turns with a plain loop of its own, after the
        # graphs above are gone: "compile_eager" is that loop's time.
        second = {"compile_eager": build("eager"), "compile": build("compile")}
        if repeats:
            times.update(time_steps(second, batches, cfg.steps, repeats))
        del second
        torch._dynamo.reset()  # drop the compiled graphs and their CUDA-graph pools
        torch.cuda.empty_cache()
    med = {name: statistics.median(t) for name, t in times.items()}
    row: dict[str, Any] = {
        **asdict(cfg),
        "optimizer": f"AdamW {impl}",
        **{f"{name}_ms": m for name, m in med.items()},
        **{f"{name}_ms_all": t for name, t in times.items()},
        **{f"{name}_setup_s": t for name, t in setup_s.items()},
        **{f"{name}_compiler_s": t for name, t in compiler_s.items() if t},
        **{name: med[a] / med[b] for name, (a, b) in RATIOS.items() if a in med and b in med},
    }
    if kept_step is not None:
        row["kept"] = "graph" if kept_step.graphed else "eager"
        row["trial_ms"] = kept_step.trial_ms
    if kept_compiled is not None:
        row["kept_compiled"] = ("graph" if kept_compiled.graphed else "eager") + (
            "" if kept_compiled.compiled else " (not compiled)")
        row["compiled_trial_ms"] = kept_compiled.trial_ms
        row["compiled_reason"] = kept_compiled.reason
    if compiled is not None:
        row["compiled"] = compiled
    for name, way in SETUP_RATIOS.items():
        if "compile_setup_s" in row and f"{way}_setup_s" in row:
            row[name] = row["compile_setup_s"] / row[f"{way}_setup_s"]
    if "graphed" in med:
        row["graphed_tflops"] = cfg.flops_per_step() / (med["graphed"] * 1e-3) / 1e12
    if rates is not None:
        params = sum(p.numel() for p in make_model(cfg, device).parameters())
        row["params"] = params
        row["roofline_ms"] = roofline_ms(cfg, params, rates)
        for name, ms in med.items():
            row[f"{name}_x_roofline"] = ms / row["roofline_ms"]
    return row


def facts(device: torch.device, rates: tuple[float, float] | None = None,
          rates_from: str = "") -> dict[str, Any]:
    extra = {} if rates is None else {"roofline_rates": rates_from, "bf16_tflops": rates[0] / 1e12,
                                      "memory_tbps": rates[1] / 1e12}
    return {
        **extra,
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
        "world_size": dist.get_world_size(),
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """Per model and optimizer: each way's step time, then the ratios the ways allow."""
    ways = [w for w in (*WAYS, "compile_eager") if f"{w}_ms" in rows[0]]
    built = [w for w in (*WAYS, "compile_eager") if f"{w}_setup_s" in rows[0]]
    ratios = [r for r in (*RATIOS, *SETUP_RATIOS) if r in rows[0]]
    extra = [k for k in ("kept", "kept_compiled", "compiled") if k in rows[0]]
    roofline = ["roofline_ms"] if "roofline_ms" in rows[0] else []
    multiples = [f"{w}_x_roofline" for w in ways if f"{w}_x_roofline" in rows[0]]
    cols = ([f"{w} ms" for w in ways] + extra + ratios + [f"{w} set-up s" for w in built]
            + [c.replace("_", " ") for c in roofline + multiples])
    lines = [f"{'model':<24} {'optimizer':<13} " + " ".join(f"{c:>{max(8, len(c))}}" for c in cols)]
    for r in rows:
        cells = [f"{r[f'{w}_ms']:.3f}" for w in ways]
        cells += [str(r.get(k, "-")) for k in extra]
        cells += [f"{r[name]:.3f}" if name in r else "-" for name in ratios]
        cells += [f"{r[f'{w}_setup_s']:.2f}" if f"{w}_setup_s" in r else "-" for w in built]
        cells += [f"{r[name]:.3f}" if name in r else "-" for name in roofline + multiples]
        lines.append(f"{r['name']:<24} {r['optimizer']:<13} "
                     + " ".join(f"{c:>{max(8, len(h))}}" for c, h in zip(cells, cols)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed runs of each way (0: build each way and time its set-up only)")
    parser.add_argument("--only", help="run only the models whose name contains this "
                        "(comma-separated: any of them), e.g. 'gpt', 'small gpt', 'mlp'")
    parser.add_argument("--ways", help=f"comma-separated, of: {', '.join(WAYS)} (default: "
                        f"{','.join(DEFAULT_WAYS)}; compile only when named: see the docstring)")
    parser.add_argument("--impls", default="foreach,fused",
                        help="AdamW forms to run, comma-separated: foreach, fused")
    parser.add_argument("--compile-scope", choices=("auto", "model"), default="auto",
                        help="compile way: the whole step, falling back to the model "
                        "(auto), or the model alone")
    parser.add_argument("--first-compile", nargs="?", const="function", choices=("function", "model"),
                        help="compile a small function (or with 'model' a one-block transformer of "
                        "other sizes) before the models: the process's first torch.compile, out "
                        "of every way's set-up; its seconds: first_compile_s")
    parser.add_argument("--rates", choices=("measured", "datasheet", "none"), default="measured",
                        help="the bf16 matmul rate and memory bandwidth of the roofline column: "
                        "measured here at the start, the datasheet's, or no roofline")
    args = parser.parse_args()
    ways = [w for w in (args.ways or "").split(",") if w]
    if unknown := sorted(set(ways) - set(WAYS)):
        parser.error(f"unknown way {', '.join(unknown)}; choose from {', '.join(WAYS)}")
    impls = [i for i in args.impls.split(",") if i]
    if unknown := sorted(set(impls) - {"foreach", "fused"}):
        parser.error(f"unknown AdamW form {', '.join(unknown)}; choose foreach or fused")
    # The hand-written graph never calls opt.step() after capture, which LambdaLR
    # warns about; the warning says nothing about this benchmark.
    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler")
    wanted = [w for w in (args.only or "").split(",") if w]
    configs = [c for c in CONFIGS if not wanted or any(w in c.name for w in wanted)]
    if not configs:
        parser.error(f"--only {args.only!r} names no model; the models: "
                     + "; ".join(c.name for c in CONFIGS))
    with tempfile.TemporaryDirectory() as tmpdir:
        device = init_group(tmpdir)
        rates = None
        if args.rates != "none":
            rates = measure_rates(device) if args.rates == "measured" else datasheet_rates(device)
            if dist.get_rank() == 0:
                print(f"roofline rates ({args.rates}): bf16 {rates[0] / 1e12:.0f} TFLOP/s, "
                      f"memory {rates[1] / 1e12:.2f} TB/s", flush=True)
        about = facts(device, rates, args.rates)
        if args.first_compile:
            about["first_compile_s"] = first_compile(device, args.first_compile)
            about["first_compile"] = args.first_compile
        rows = []
        for cfg in configs:
            cfg_ways = ways or list(DEFAULT_WAYS)
            for impl in impls:
                rows.append(bench_config(cfg, impl, device, args.repeats, cfg_ways,
                                         args.compile_scope, rates))
                if dist.get_rank() == 0:
                    print(format_table(rows[-1:]).splitlines()[-1], flush=True)
                    if args.json:  # each row as it comes: a crash keeps the rows before it
                        with open(args.json, "w") as fh:
                            json.dump({**about, "rows": rows}, fh, indent=2)
        if dist.get_rank() == 0:
            doc = {**about, "rows": rows}
            print(json.dumps({k: v for k, v in doc.items() if k != "rows"}))
            print(format_table(rows))
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump(doc, fh, indent=2)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
