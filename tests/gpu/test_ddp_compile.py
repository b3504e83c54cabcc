"""build_step(..., compile=True) on a real GPU: Inductor's kernels inside the one graph.

Each test trains a small causal transformer (embedding, SDPA attention, LayerNorm,
GELU MLP, cross-entropy) for 40 steps of a real loop: warm-up + cosine LR schedule,
bf16 autocast, clipping, 2 micro-batches a step, fused AdamW. On one rank the step
compiles the module DDP wraps (``ddp.compile_target``: DDP's sync is the identity
there). With a communication hook (here DDP's built-in all-reduce) it compiles the
DDP model, whose buckets are tiny, so dynamo splits the compiled model at bucket
boundaries and the captured backward holds several all-reduces, as a large
model's does on several ranks. The reference is the plain loop of SPEC
"cluster_kit.ddp" with the same compiled module (``ddp.compile_model``: the
model compiled around its two blocks, compiled once for both) and
``torch.compile(loss_fn)`` in their places, run eagerly; graphed and compiled must equal it bit for bit. Both run with ``torch.use_deterministic_algorithms(True)``:
without it the backward of the embedding (Inductor's atomic adds) and of the
attention add in a varying order, and no two runs of the plain loop agree either;
with it Inductor also picks its reduction kernels without timing them. World size
1 NCCL process group (conftest.py). Skipped without CUDA.
"""

from __future__ import annotations

import contextlib
import copy
import math
import multiprocessing
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cluster_kit import ddp

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.filterwarnings("error:Detected call of `lr_scheduler"),
]

STEPS = 40
K = 2  # micro-batches a step
BATCH, SEQ, VOCAB, WIDTH = 4, 32, 512, 128
MAX_NORM = 0.5
# The model's 2.1 MB of gradients span 3 buckets. Dynamo splits the compiled model
# at DDP's buckets only where the first (1 MB, DDP's own) is no larger than the rest.
BUCKET_MB = 1
Batch = tuple[torch.Tensor, torch.Tensor]
Record = tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]


# Deterministic cuBLAS (read when torch.use_deterministic_algorithms is on); set
# before the first matrix product of this process.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture(autouse=True)
def deterministic_and_fresh() -> Iterator[None]:
    """Deterministic kernels, and each test compiles anew (one test's cached frames
    stay out of the next); both undone afterwards."""
    torch._dynamo.reset()
    # warn_only: an op without a deterministic form warns (naming itself), not raises
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(False)
    torch._dynamo.reset()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, 2, c // 2).unbind(2)  # 2 heads
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True)
        x = x + self.out(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(tokens))))


class SyncingGPT(TinyGPT):
    """Reads a value back to the host in its forward: compiles (with a graph break),
    but no CUDA graph can be captured of it."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = super().forward(tokens)
        return logits * 2.0 if float(logits.abs().max()) > 1e6 else logits


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def make_net(cls: type[TinyGPT] = TinyGPT) -> nn.Module:
    torch.manual_seed(0)
    return cls().cuda()


def make_batches(short: tuple[int, ...] = ()) -> list[Batch]:
    """STEPS batches of K micro-batches; those at the `short` indices have 3 sequences, not 4."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    data = []
    for i in range(STEPS):
        shape = (K, 3 if i in short else BATCH, SEQ)
        data.append((torch.randint(VOCAB, shape, device="cuda", generator=gen),
                     torch.randint(VOCAB, shape, device="cuda", generator=gen)))
    return data


def make_optimizer(model: nn.Module, capturable: bool = True) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=True,
                             capturable=capturable)


def warmup_cosine(optimizer: torch.optim.Optimizer) -> Any:
    def factor(i: int) -> float:
        return (i + 1) / 5 if i < 5 else 0.5 * (1 + math.cos(math.pi * (i - 5) / STEPS))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def record(loss: torch.Tensor, norm: torch.Tensor | None, model: nn.Module) -> Record:
    assert norm is not None
    return loss.clone(), norm.clone(), [p.detach().clone() for p in model.parameters()]


class PlainLoop:
    """SPEC's plain loop as a user writes it, with `forward` and `loss_fn` (compiled or not)."""

    def __init__(self, model: DistributedDataParallel, forward: Callable[..., Any],
                 loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer) -> None:
        self.model, self.forward, self.loss_fn, self.optimizer = model, forward, loss_fn, optimizer

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> Record:
        total = torch.zeros((), device="cuda")
        for i in range(K):
            sync = self.model.no_sync() if i < K - 1 else contextlib.nullcontext()
            with sync:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = self.loss_fn(self.forward(inputs[i]), targets[i]) / K
                loss.backward()
            total = total + loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_NORM)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return record(total, norm, self.model)


def plain_ddp(net: nn.Module) -> DistributedDataParallel:
    return DistributedDataParallel(net, device_ids=[0], bucket_cap_mb=BUCKET_MB)


def hook_all_reduce(model: DistributedDataParallel) -> DistributedDataParallel:
    """DDP's built-in all-reduce as a communication hook: the step keeps DDP on one rank."""
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    return model


def compiled_module(model: DistributedDataParallel, hooked: bool) -> Callable[..., Any]:
    """What the user's plain loop compiles: DDP with a hook, else on one rank the module it wraps,
    each of its two blocks by one compiled block (ddp.compile_model)."""
    assert ddp.compile_target(model) is (model if hooked else model.module)
    return ddp.compile_model(model)


def run_reference(data: list[Batch], compiled: bool = True, cls: type[TinyGPT] = TinyGPT,
                  hooked: bool = False) -> list[Record]:
    model = plain_ddp(make_net(cls))
    if hooked:
        hook_all_reduce(model)
    opt = make_optimizer(model)
    sched = warmup_cosine(opt)
    forward, loss_fn = (compiled_module(model, hooked), torch.compile(token_loss)) if compiled else (model, token_loss)
    loop = PlainLoop(model, forward, loss_fn, opt)
    out = []
    for batch in data:
        out.append(loop(*batch))
        sched.step()
    return out


def run_built(data: list[Batch], cls: type[TinyGPT] = TinyGPT, hooked: bool = False,
              **kwargs: Any) -> tuple[ddp.TrainingStep, list[Record]]:
    model = ddp.wrap_ddp(make_net(cls), for_capture=True, bucket_cap_mb=BUCKET_MB)
    if hooked:
        hook_all_reduce(model)
    opt = make_optimizer(model)
    sched = warmup_cosine(opt)
    step = ddp.build_step(model, opt, token_loss, data[0], enabled=True, autocast_dtype=torch.bfloat16,
                          max_grad_norm=MAX_NORM, accumulation_steps=K, compile=True, **kwargs)
    out = []
    for batch in data:
        out.append(record(step(*batch), step.last_grad_norm, model))
        sched.step()
    return step, out


def difference(got: list[Record], want: list[Record]) -> float:
    """The largest difference in loss, grad norm or any parameter over every step."""
    assert len(got) == len(want)
    worst = 0.0
    for a, b in zip(got, want):
        pairs = [(a[0], b[0]), (a[1], b[1]), *zip(a[2], b[2])]
        worst = max(worst, *(float((p.float() - q.float()).abs().max()) for p, q in pairs))
    return worst


@pytest.mark.parametrize("hooked", [False, True], ids=["one-rank-module", "ddp-with-hook"])
def test_compiled_and_graphed_equals_the_compiled_loop_run_eagerly(hooked: bool) -> None:
    data = make_batches()
    want = run_reference(data, hooked=hooked)
    plain = run_reference(data, compiled=False)
    step, got = run_built(data, hooked=hooked, keep_faster=False)
    assert step.graphed is True and step.compiled is True and step.reason is None, step.reason
    apart = difference(plain, want)
    print(f"{'DDP with a hook' if hooked else 'one rank'}: "
          f"compiled+graphed vs compiled eager: {difference(got, want):.3g}; "
          f"plain eager vs compiled eager: {apart:.3g}")
    assert apart > 0  # Inductor's kernels round otherwise: the comparison below can tell
    assert difference(got, want) == 0.0


def test_the_step_a_job_gets_keeps_what_its_trial_found_faster_and_stays_exact() -> None:
    data = make_batches()
    want = run_reference(data)
    step, got = run_built(data)  # keep_faster=True, the default
    assert step.compiled is True and step.trial_ms is not None
    print(f"compiled trial: {step.trial_ms}, kept {'graph' if step.graphed else 'eager'}")
    assert step.graphed is (step.trial_ms["graphed"] <= step.trial_ms["eager"])
    assert difference(got, want) == 0.0


def test_short_batches_run_the_compiled_model_eagerly_and_the_graph_replays_after() -> None:
    data = make_batches(short=(20, STEPS - 1))
    want = run_reference(data)
    step, got = run_built(data, keep_faster=False)
    assert step.graphed is True and step.compiled is True
    assert any(not torch.equal(p, q) for p, q in zip(got[20][2], got[21][2]))
    assert difference(got, want) == 0.0


def test_a_run_resumed_from_a_plain_checkpoint_is_compiled_graphed_and_equal() -> None:
    """10 steps of the compiled loop with AdamW as users create it (capturable=False),
    saved; then 30 more steps, resumed graphed and resumed by the same plain loop."""
    data = make_batches()
    model = plain_ddp(make_net())
    opt = make_optimizer(model, capturable=False)
    loop = PlainLoop(model, compiled_module(model, False), torch.compile(token_loss), opt)
    for batch in data[:10]:
        loop(*batch)
    weights, state = copy.deepcopy(model.module.state_dict()), copy.deepcopy(opt.state_dict())
    records = []
    for graphed in (False, True):
        net = make_net()
        net.load_state_dict(weights)
        if graphed:
            model = ddp.wrap_ddp(net, for_capture=True, bucket_cap_mb=BUCKET_MB)
        else:
            model = plain_ddp(net)
        opt = make_optimizer(model, capturable=False)
        opt.load_state_dict(copy.deepcopy(state))
        if graphed:
            step = ddp.build_step(model, opt, token_loss, data[10], enabled=True, autocast_dtype=torch.bfloat16,
                                  max_grad_norm=MAX_NORM, accumulation_steps=K, compile=True,
                                  keep_faster=False)
            assert step.graphed is True and step.compiled is True, step.reason
            records.append([record(step(*batch), step.last_grad_norm, model) for batch in data[10:]])
        else:
            loop = PlainLoop(model, compiled_module(model, False), torch.compile(token_loss), opt)
            records.append([loop(*batch) for batch in data[10:]])
    print(f"resumed: max |compiled+graphed - compiled eager| = {difference(records[1], records[0]):.3g}")
    assert difference(records[1], records[0]) == 0.0


def capture_failure_in_own_process(store: str) -> None:
    """The check below, in a spawned process with its own CUDA context and process group."""
    ddp.prepare_process_group_env(enabled=True)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        data = make_batches()[:12]
        want = run_reference(data, cls=SyncingGPT)
        step, got = run_built(data, cls=SyncingGPT, keep_faster=False)
        assert step.graphed is False and step.compiled is True
        assert str(step.reason).startswith("capture failed: "), step.reason
        assert difference(got, want) == 0.0
    finally:
        dist.destroy_process_group()


def test_a_step_that_cannot_be_captured_runs_compiled_and_eagerly_with_the_reason(tmp_path: Path) -> None:
    # A failed capture could upset CUDA for what runs after it: a process of its own.
    child = multiprocessing.get_context("spawn").Process(
        target=capture_failure_in_own_process, args=(str(tmp_path / "store"),))
    child.start()
    child.join(300)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0, f"the capture-failure check failed in its process (exit {child.exitcode}; see stderr)"
