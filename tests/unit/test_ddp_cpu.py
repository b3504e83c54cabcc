"""The DDP step helper on the CPU: an eager step, with the reason, equal to plain DDP."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist

from cluster_kit import ddp
from cluster_kit.trainer import process_group as process_group_module
from cluster_kit.trainer.step.snapshot import Snapshot

DDP_PY = Path(ddp.__file__)


@pytest.fixture(scope="module")
def process_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen))
        for _ in range(n)
    ]


def plain_ddp_losses(
    data: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[list[float], torch.nn.Module]:
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_cpu_falls_back_to_eager_with_a_reason(
    process_group: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_group_module, "_LOGGED", set())  # what earlier tests logged is logged again
    data = batches(1)
    model = ddp.wrap_ddp(make_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with caplog.at_level(logging.WARNING, logger="cluster_kit.ddp"):
        step = ddp.GraphedStep(model, opt, torch.nn.functional.mse_loss, data[0])
        ddp.GraphedStep(model, opt, torch.nn.functional.mse_loss, data[0])
    assert step.graphed is False
    assert step.reason in (
        "CUDA is not available",
        "the model is on cpu, not on a CUDA device",
    )
    assert (
        len([r for r in caplog.records if step.reason in r.getMessage()]) == 1
    )  # logged once


def test_eager_steps_match_a_plain_ddp_loop(process_group: None) -> None:
    data = batches(6)
    expected_losses, expected_model = plain_ddp_losses(data)
    model = ddp.wrap_ddp(make_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = ddp.GraphedStep(model, opt, torch.nn.functional.mse_loss, data[0])
    losses = [step(x, y).item() for x, y in data]
    assert losses == expected_losses
    for got, want in zip(model.parameters(), expected_model.parameters()):
        assert torch.equal(got, want)


def test_building_the_step_on_cpu_changes_nothing(process_group: None) -> None:
    model = ddp.wrap_ddp(make_model())
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ddp.GraphedStep(model, opt, torch.nn.functional.mse_loss, batches(1)[0])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(opt.state) == 0


def test_build_step_follows_the_environment(
    process_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ddp.wrap_ddp(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monkeypatch.delenv(ddp.ENV_FLAG, raising=False)
    off = ddp.build_step(model, opt, torch.nn.functional.mse_loss, batches(1)[0])
    assert off.graphed is False and ddp.ENV_FLAG in str(off.reason)
    monkeypatch.setenv(ddp.ENV_FLAG, "1")
    on = ddp.build_step(model, opt, torch.nn.functional.mse_loss, batches(1)[0])
    assert on.graphed is False and ddp.ENV_FLAG not in str(on.reason)


def test_ddp_needs_eleven_warmup_iterations(process_group: None) -> None:
    model = ddp.wrap_ddp(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="at least 11"):
        ddp.GraphedStep(
            model, opt, torch.nn.functional.mse_loss, batches(1)[0], warmup=3
        )


def test_prepare_env_only_when_graphs_are_wanted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    assert ddp.prepare_process_group_env(enabled=False) is False
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ
    assert ddp.prepare_process_group_env(enabled=True) is True
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def test_snapshot_puts_weights_and_optimizer_state_back() -> None:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-1)
    before = [p.detach().clone() for p in model.parameters()]
    snap = Snapshot.take(model, opt)
    for x, y in batches(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    live_state = [s["exp_avg"] for s in opt.state.values()]
    snap.restore(
        model, opt, keep_new_state=True
    )  # a graph points at this state: zero it
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(t.abs().sum() == 0 for t in live_state)
    assert all(s["exp_avg"] is t for s, t in zip(opt.state.values(), live_state))
    snap.restore(model, opt, keep_new_state=False)  # eager: state is made afresh
    assert len(opt.state) == 0


def test_the_trainer_imports_from_the_checkout_without_clusterkits_dependencies() -> None:
    """A node where clusterkit is not installed: the checkout's folder on sys.path, and
    none of click, jinja2, yaml, paramiko or packaging; each module exists once."""
    code = (
        "import sys\n"
        "for name in ('click', 'jinja2', 'yaml', 'paramiko', 'packaging'):\n"
        "    sys.modules[name] = None  # importing it raises ImportError\n"
        f"sys.path.insert(0, {str(DDP_PY.parents[1])!r})\n"
        "from cluster_kit import checkpoint, ddp\n"
        "from cluster_kit.trainer import supervision\n"
        "assert callable(ddp.build_step) and callable(ddp.wrap_ddp) and callable(checkpoint.save)\n"
        "ddp.heartbeat(); assert ddp.stop_requested() is False\n"
        "assert ddp.heartbeat is supervision.heartbeat and ddp.paused is supervision.paused\n"
        "assert ddp.compile_options(True) == {} and ddp.ENV_COMPILE == 'CLUSTERKIT_CUDA_GRAPHS_COMPILE'\n"
        "assert checkpoint.Checkpointer.__module__ == 'cluster_kit.trainer.checkpoint.checkpointer'\n"
        "print(sorted(k for k in sys.modules if k.startswith('cluster_kit.') and not k.startswith(\n"
        "    ('cluster_kit.trainer', 'cluster_kit.ddp', 'cluster_kit.checkpoint'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
