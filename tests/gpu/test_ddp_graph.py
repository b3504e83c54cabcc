"""The graphed DDP step on a real GPU: same training as eager, on every new batch.

World size 1 NCCL process group on localhost (file store). Skipped without CUDA.
"""

from __future__ import annotations

import logging
import multiprocessing
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from cluster_kit import ddp

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"
)

STEPS = 20
Batch = tuple[torch.Tensor, torch.Tensor]




def make_net(seed: int = 0, width: int = 64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(32, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 8),
    ).cuda()


def make_opt(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    return torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)


def make_batches(n: int, seed: int = 1) -> list[Batch]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [
        (
            torch.randn(16, 32, device="cuda", generator=gen),
            torch.randn(16, 8, device="cuda", generator=gen),
        )
        for _ in range(n)
    ]


def plain_ddp(kind: str, data: list[Batch]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The reference: a hand-written eager DDP loop."""
    model = torch.nn.parallel.DistributedDataParallel(make_net(), device_ids=[0])
    opt = make_opt(kind, model)
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    return torch.stack(losses).cpu(), [p.detach().cpu() for p in model.parameters()]


def graphed(
    kind: str, data: list[Batch], net: nn.Module | None = None
) -> tuple[ddp.GraphedStep, torch.Tensor, list[torch.Tensor]]:
    model = ddp.wrap_ddp(net if net is not None else make_net(), for_capture=True)
    step = ddp.GraphedStep(model, make_opt(kind, model), F.mse_loss, data[0])
    losses = torch.stack([step(x, y) for x, y in data])
    torch.cuda.synchronize()
    return step, losses.cpu(), [p.detach().cpu() for p in model.parameters()]


def assert_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_graphed_steps_match_eager_ddp(kind: str) -> None:
    data = make_batches(STEPS)
    want_losses, want_params = plain_ddp(kind, data)
    step, losses, params = graphed(kind, data)
    assert step.graphed is True and step.reason is None
    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-6)
    assert_close(params, want_params)


def test_graph_consumes_each_new_batch() -> None:
    data = make_batches(STEPS)
    _, losses_new, params_new = graphed("adamw", data)
    _, losses_same, params_same = graphed("adamw", [data[0]] * STEPS)
    assert torch.equal(losses_new[0], losses_same[0])  # same first batch, same start
    assert not torch.allclose(losses_new[1:], losses_same[1:])
    assert any(not torch.allclose(a, b) for a, b in zip(params_new, params_same))
    assert (
        len(set(losses_new.tolist())) == STEPS
    )  # each returned loss is its own tensor


def test_warmup_leaves_the_model_as_it_was_given() -> None:
    net = make_net()
    before = [p.detach().clone() for p in net.parameters()]
    model = ddp.wrap_ddp(net, for_capture=True)
    opt = make_opt("adamw", model)
    step = ddp.GraphedStep(model, opt, F.mse_loss, make_batches(1)[0])
    assert step.graphed
    assert_close([p.detach() for p in model.parameters()], before)
    for state in opt.state.values():
        assert (
            float(state["exp_avg"].abs().sum()) == 0.0 and float(state["step"]) == 0.0
        )


def test_ddp_build_warmup_and_capture_share_one_stream() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step, _, _ = graphed("adamw", make_batches(3))
    assert step.graphed
    assert not [w for w in caught if "AccumulateGrad" in str(w.message)]


def test_build_step_graphs_when_the_environment_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ddp.ENV_FLAG, "1")
    model = ddp.wrap_ddp(make_net())
    step = ddp.build_step(
        model, make_opt("adamw", model), F.mse_loss, make_batches(1)[0]
    )
    assert step.graphed is True


def test_a_batch_of_another_shape_runs_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    step, _, _ = graphed("sgd", make_batches(2))
    x, y = make_batches(1)[0]
    with caplog.at_level(logging.INFO, logger="cluster_kit.ddp"):
        loss = step(x[:3], y[:3])
    assert torch.isfinite(loss) and step.graphed
    assert "(3, 32) (captured: (16, 32)) ran eagerly" in caplog.text


class HostSyncNet(nn.Module):
    """Reads a value back to the host in forward: legal eagerly, not capturable."""

    def __init__(self) -> None:
        super().__init__()
        self.body = make_net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out * 2 if out.sum().item() > 1e30 else out


def capture_failure_in_own_process(store: str) -> None:
    """The check below, in a spawned process with its own CUDA context and process group."""
    ddp.prepare_process_group_env(enabled=True)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        data = make_batches(5)
        want_losses, want_params = plain_ddp("sgd", data)
        step, losses, params = graphed("sgd", data, net=HostSyncNet())
        assert step.graphed is False
        assert step.reason is not None and step.reason.startswith("capture failed"), step.reason
        torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-6)
        assert_close(params, want_params)
    finally:
        dist.destroy_process_group()


def test_capture_failure_falls_back_to_eager_from_the_same_start(tmp_path: Path) -> None:
    # A failed capture is the one thing here that could upset CUDA for what runs after
    # it in the same process: it gets a process of its own, so no test depends on order.
    child = multiprocessing.get_context("spawn").Process(
        target=capture_failure_in_own_process, args=(str(tmp_path / "store"),))
    child.start()
    child.join(300)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0, f"the capture-failure check failed in its process (exit {child.exitcode}; see stderr)"
