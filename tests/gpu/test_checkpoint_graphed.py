"""A run resumed through cluster_kit.checkpoint stays graphed and ends where the uninterrupted run does.

One graphed run (``build_step``, AdamW, a LambdaLR schedule) trains 30 steps and
saves a checkpoint at step 15 through cluster_kit.checkpoint (blocking, or
asynchronous: the copy to pinned host memory happens in the step while the replays
go on changing the weights). A fresh model and optimizer then load that checkpoint,
``build_step`` must capture again (the loaded step counts moved onto the GPU), and the
last 15 steps must end on the uninterrupted run's weights bit for bit.
World size 1 NCCL process group on localhost (file store). Skipped without CUDA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.nn.functional as F
from torch import nn

from cluster_kit import ddp
from cluster_kit.checkpoint import Checkpointer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STEPS = 30
SAVED_AT = 15
Batch = tuple[torch.Tensor, torch.Tensor]


def make_batches(n: int = STEPS) -> list[Batch]:
    gen = torch.Generator(device="cuda").manual_seed(1)
    return [(torch.randn(16, 32, device="cuda", generator=gen), torch.randn(16, 8, device="cuda", generator=gen))
            for _ in range(n)]


def make_run(impl: str) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """A fresh model, a plain AdamW (build_step makes it capturable) and its schedule."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()
    model = ddp.wrap_ddp(net, for_capture=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, **{impl: True})
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + 0.05 * s))
    return model, optimizer, scheduler


def graphed_step(model: nn.Module, optimizer: torch.optim.Optimizer, example: Batch) -> Any:
    step = ddp.build_step(model, optimizer, F.mse_loss, example, enabled=True, keep_faster=False)
    assert step.graphed is True and step.reason is None, step.reason
    return step


def train(step: Any, scheduler: Any, batches: list[Batch]) -> None:
    for batch in batches:
        step(*batch)
        scheduler.step()


@pytest.mark.parametrize("impl", ["fused", "foreach"])
@pytest.mark.parametrize("async_", [False, True])
def test_a_resumed_graphed_run_ends_bit_identical(tmp_path: Path, impl: str, async_: bool) -> None:
    data = make_batches()
    model, optimizer, scheduler = make_run(impl)
    step = graphed_step(model, optimizer, data[0])
    train(step, scheduler, data[:SAVED_AT])
    saver = Checkpointer(str(tmp_path), environ={})
    saver.save(SAVED_AT, async_=async_, model=model, optimizer=optimizer, scheduler=scheduler)
    train(step, scheduler, data[SAVED_AT:])  # replays change the weights while a write may run
    saver.wait()
    torch.cuda.synchronize()
    want = [p.detach().clone() for p in model.parameters()]

    model, optimizer, scheduler = make_run(impl)
    loaded = Checkpointer(str(tmp_path), environ={"CLUSTERKIT_ATTEMPT": "1"}).load(
        model=model, optimizer=optimizer, scheduler=scheduler)
    assert loaded is not None and loaded.step == SAVED_AT
    step = graphed_step(model, optimizer, data[SAVED_AT])
    assert all(s["step"].is_cuda for s in optimizer.state.values())
    train(step, scheduler, data[SAVED_AT:])
    torch.cuda.synchronize()
    got = [p.detach() for p in model.parameters()]
    worst = max(float((a - b).abs().max()) for a, b in zip(got, want))
    print(f"{impl} {'async' if async_ else 'blocking'}: max |resumed - uninterrupted| = {worst:.3g}")
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_capturable_optimizer_keeps_its_form_through_a_checkpoint(tmp_path: Path) -> None:
    """A checkpoint of a graphed run loads into a plain optimizer and back: the loading one's flags win."""
    data = make_batches(4)
    model, optimizer, scheduler = make_run("fused")
    train(graphed_step(model, optimizer, data[0]), scheduler, data)
    assert optimizer.param_groups[0]["capturable"] is True
    Checkpointer(str(tmp_path), environ={}).save(4, model=model, optimizer=optimizer)
    plain_model, plain = make_run("foreach")[:2]
    Checkpointer(str(tmp_path), environ={}).load(model=plain_model, optimizer=plain)
    group = plain.param_groups[0]
    assert (group["capturable"], group["foreach"], group["fused"]) == (False, True, None)
    assert all(not s["step"].is_cuda for s in plain.state.values())  # a plain AdamW keeps them on the host
