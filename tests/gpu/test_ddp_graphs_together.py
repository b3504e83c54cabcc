"""Several captured graphs in one process: each graphed step stays its plain loop.

A job may hold more than one graph (two models, or a graph of its own beside
build_step's). Each DDP model here has tiny buckets, so every captured backward
holds several all-reduces on the one NCCL communicator, as a large model's does.
World size 1 NCCL process group (tests/gpu/conftest.py). Skipped without CUDA.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch
import torch.nn.functional as F
from test_ddp_loop import (
    EVERYTHING_BF16,
    Batch,
    Record,
    adamw,
    assert_same_training,
    make_batches,
    make_net,
    record,
    run_plain,
    scheduled,
)

from cluster_kit import ddp

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TINY_BUCKETS_MB = 0.01  # 10 kB: the MLP's 27 kB of gradients span several buckets


def hand_graph(data: list[Batch]) -> tuple[torch.cuda.CUDAGraph, object]:
    """A plain step captured by hand, as PyTorch's CUDA graphs notes show, and what
    it writes into (the model, its DDP buckets, the optimizer, the static batch),
    which must live as long as the graph."""
    model = ddp.wrap_ddp(make_net(), for_capture=True, bucket_cap_mb=TINY_BUCKETS_MB)
    opt = adamw("fused")(model)
    x, y = (t.clone() for t in data[0])
    current, side = torch.cuda.current_stream(), ddp.capture_stream(torch.device("cuda", 0))
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(ddp.DDP_MIN_WARMUP):
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x), y).backward()
            opt.step()
    current.wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        F.mse_loss(model(x), y).backward()
        opt.step()
    return graph, (model, opt, x, y)


@pytest.mark.parametrize("first", ["build_step", "hand graph"])
def test_graphs_taking_turns_each_train_as_their_plain_loop(first: str) -> None:
    runs = [make_batches(), make_batches()[::-1]]
    want = [run_plain(EVERYTHING_BF16, scheduled, data, adamw("fused")) for data in runs]
    other, _kept = hand_graph(runs[0]) if first == "hand graph" else (None, None)
    steps = []
    for data in runs:  # the job's default: keep_faster, whose trial runs beside the graphs
        model = ddp.wrap_ddp(make_net(), for_capture=True, bucket_cap_mb=TINY_BUCKETS_MB)
        step = ddp.build_step(model, adamw("fused")(model), F.mse_loss, data[0], enabled=True,
                              **EVERYTHING_BF16)
        assert step.graphed is True, step.reason
        steps.append((step, model))
    got: list[list[Record]] = [[], []]
    for i in range(len(runs[0])):
        for (step, model), data, out in zip(steps, runs, got):
            scheduled(i, step.optimizer)
            out.append(record(step(*data[i]), step.last_grad_norm, None, model))
            if other is not None:
                other.replay()
    torch.cuda.synchronize()
    for mine, plain in zip(got, want):
        assert_same_training(mine, plain, 0.0)
