"""A graphed training loop equals the plain eager loop, option by option, on a real GPU.

Each test runs 50 steps from the same seed and batches twice: through
``build_step(..., enabled=True, keep_faster=False)`` (asserted to replay a graph)
and through the plain loop of SPEC "cluster_kit.ddp" written out by hand, and
compares the loss, the gradient norm, the GradScaler's scale and the parameters
after every step. The keep_faster tests at the end run build_step's own trial and
check what it keeps, graph or eager, against the same plain loop.
World size 1 NCCL process group on localhost (file store). Skipped without CUDA.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cluster_kit import ddp
from cluster_kit.trainer.step import graphed as graphed_step
from cluster_kit.trainer.step import hyperparams

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    # a replay counts as the optimizer step an LR scheduler checks for
    pytest.mark.filterwarnings("error:Detected call of `lr_scheduler"),
]

STEPS = 50
INF_STEP = 7
Batch = tuple[torch.Tensor, torch.Tensor]
Hook = Callable[[int, torch.optim.Optimizer], None]
Record = tuple[torch.Tensor, torch.Tensor | None, float | None, list[torch.Tensor]]




def make_net(dropout: float = 0.0) -> nn.Module:
    """A small MLP; with ``dropout`` its random numbers must match between the loops."""
    torch.manual_seed(0)
    layers = [nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8)]
    if dropout:
        layers.insert(2, nn.Dropout(dropout))
    return nn.Sequential(*layers).cuda()


def make_batches(k: int = 1, inf: bool = False) -> list[Batch]:
    gen = torch.Generator(device="cuda").manual_seed(1)
    lead = (k,) if k > 1 else ()
    data = [
        (
            3 * torch.randn(*lead, 16, 32, device="cuda", generator=gen),
            torch.randn(*lead, 16, 8, device="cuda", generator=gen),
        )
        for _ in range(STEPS)
    ]
    if inf:  # one micro-batch of one step overflows: the scaler must skip that step
        x = data[INF_STEP][0].clone()
        x.view(-1, 32)[0, 0] = float("inf")
        data[INF_STEP] = (x, data[INF_STEP][1])
    return data


def adamw(impl: str, capturable: bool = True) -> Callable[[nn.Module], torch.optim.Optimizer]:
    def make(model: nn.Module) -> torch.optim.Optimizer:
        fused = impl == "fused"
        return torch.optim.AdamW(
            model.parameters(),
            lr=3e-3,
            weight_decay=0.1,
            capturable=capturable,
            fused=fused,
            foreach=not fused,
        )

    return make


def warmup_cosine(optimizer: torch.optim.Optimizer) -> Any:
    def factor(i: int) -> float:
        if i < 5:
            return (i + 1) / 5
        return 0.5 * (1 + math.cos(math.pi * (i - 5) / STEPS))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def scheduled(i: int, opt: torch.optim.Optimizer) -> None:
    """Warm-up + cosine, the scheduler stepped after every optimizer step."""
    if i == 0:
        opt._test_sched = warmup_cosine(opt)  # type: ignore[attr-defined]
    else:
        opt._test_sched.step()  # type: ignore[attr-defined]


def scheduled_then_zero(i: int, opt: torch.optim.Optimizer) -> None:
    """The schedule for 5 steps, then ``group["lr"] = 0`` by hand."""
    if i < 5:
        scheduled(i, opt)
    else:
        for group in opt.param_groups:
            group["lr"] = 0.0


def no_hook(i: int, opt: torch.optim.Optimizer) -> None:
    pass


def plain_step(
    model: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    opts: dict[str, Any],
    scaler: Any | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SPEC's plain loop for one step, as a user writes it: (mean loss, grad norm)."""
    inputs, targets = batch
    k = opts.get("accumulation_steps", 1)
    dtype, max_norm = opts.get("autocast_dtype"), opts.get("max_grad_norm")
    total, norm = None, None
    for i in range(k):
        x, y = (inputs[i], targets[i]) if k > 1 else (inputs, targets)
        sync = model.no_sync() if i < k - 1 else contextlib.nullcontext()
        cast = (
            torch.autocast("cuda", dtype=dtype) if dtype else contextlib.nullcontext()
        )
        with sync:
            with cast:
                loss = F.mse_loss(model(x), y)
                loss_i = loss / k if k > 1 else loss
            (scaler.scale(loss_i) if scaler else loss_i).backward()
        total = loss_i.detach() if total is None else total + loss_i.detach()
    if max_norm:
        if scaler:
            scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert total is not None
    return total, norm


def record(
    loss: torch.Tensor, norm: torch.Tensor | None, scaler: Any, model: nn.Module
) -> Record:
    return (
        loss.clone(),
        None if norm is None else norm.clone(),
        scaler.get_scale() if scaler else None,
        [p.detach().clone() for p in model.parameters()],
    )


def scaler_factory(opts: dict[str, Any]) -> Any | None:
    if not opts.get("grad_scaler"):
        return None
    return torch.amp.GradScaler("cuda", init_scale=2.0**14, growth_interval=5)


def run_graphed(
    opts: dict[str, Any],
    hook: Hook,
    data: list[Batch],
    make_opt: Callable[[nn.Module], torch.optim.Optimizer],
    keep_faster: bool = False,
    dropout: float = 0.0,
) -> tuple[ddp.TrainingStep, list[Record]]:
    model = ddp.wrap_ddp(make_net(dropout), for_capture=True)
    opt, scaler = make_opt(model), scaler_factory(opts)
    kwargs = {k: v for k, v in opts.items() if k != "grad_scaler"}
    step = ddp.build_step(
        model, opt, F.mse_loss, data[0], enabled=True, grad_scaler=scaler,
        keep_faster=keep_faster, **kwargs
    )
    out = []
    for i, batch in enumerate(data):
        hook(i, opt)
        out.append(record(step(*batch), step.last_grad_norm, scaler, model))
    return step, out


def run_plain(
    opts: dict[str, Any],
    hook: Hook,
    data: list[Batch],
    make_opt: Callable[[nn.Module], torch.optim.Optimizer],
    dropout: float = 0.0,
) -> list[Record]:
    model = DistributedDataParallel(make_net(dropout), device_ids=[0])
    opt, scaler = make_opt(model), scaler_factory(opts)
    out = []
    for i, batch in enumerate(data):
        hook(i, opt)
        out.append(record(*plain_step(model, opt, batch, opts, scaler), scaler, model))
    return out


def assert_same_training(got: list[Record], want: list[Record], atol: float) -> None:
    """Every step's loss, grad norm, scale and parameters agree (exactly when atol=0)."""
    assert len(got) == len(want) == STEPS
    for i, (a, b) in enumerate(zip(got, want)):
        msg = f"step {i}"
        torch.testing.assert_close(
            a[0], b[0], rtol=0, atol=atol, equal_nan=True, msg=msg
        )
        assert (a[1] is None) == (b[1] is None), msg
        if a[1] is not None:
            torch.testing.assert_close(
                a[1], b[1], rtol=0, atol=atol, equal_nan=True, msg=msg
            )
        assert a[2] == b[2], f"{msg}: scale {a[2]} != {b[2]}"
        for p, q in zip(a[3], b[3]):
            torch.testing.assert_close(p, q, rtol=0, atol=atol, msg=msg)


def max_difference(got: list[Record], want: list[Record]) -> float:
    return max(
        float((p - q).abs().max())
        for a, b in zip(got, want)
        for p, q in zip(a[3], b[3])
    )


def check(
    opts: dict[str, Any],
    hook: Hook = scheduled,
    impl: str = "fused",
    atol: float = 0.0,
) -> list[Record]:
    k = opts.get("accumulation_steps", 1)
    data = make_batches(k, inf=bool(opts.get("grad_scaler")))
    want = run_plain(opts, hook, data, adamw(impl))
    step, got = run_graphed(opts, hook, data, adamw(impl))
    assert step.graphed is True and step.reason is None, step.reason
    assert_same_training(got, want, atol)
    print(
        f"{opts} {impl} {hook.__name__}: max |graphed - eager| = {max_difference(got, want):.3g}"
    )
    return got


def changed(a: Record, b: Record) -> bool:
    return any(not torch.equal(p, q) for p, q in zip(a[3], b[3]))


# Foreach AdamW divides by a float lr as x * float32(1/lr): the captured step does
# the same (HyperParams.plain_loop_division), so foreach is exact too.
@pytest.mark.parametrize(("impl", "atol"), [("fused", 0.0), ("foreach", 1e-6)])
@pytest.mark.parametrize("hook", [scheduled, scheduled_then_zero])
def test_lr_schedule_and_assignment_reach_the_graph(
    impl: str, atol: float, hook: Hook
) -> None:
    got = check({}, hook=hook, impl=impl, atol=atol)
    if hook is scheduled_then_zero:  # lr 0 from step 5: nothing moves any more
        assert not changed(got[5], got[-1]) and changed(got[0], got[4])


def test_bf16_autocast() -> None:
    check({"autocast_dtype": torch.bfloat16})


def test_clipping_with_the_same_norms() -> None:
    got = check({"max_grad_norm": 0.5})
    assert sum(float(r[1]) > 0.5 for r in got) > 10  # clipping really happened  # type: ignore[arg-type]


def test_accumulation_over_four_micro_batches() -> None:
    check({"accumulation_steps": 4})


def test_fp16_grad_scaler_skips_the_inf_step_and_changes_scale() -> None:
    got = check({"autocast_dtype": torch.float16, "grad_scaler": True}, hook=no_hook)
    scales = [r[2] for r in got]
    assert scales[INF_STEP] == scales[INF_STEP - 1] / 2  # type: ignore[operator]
    assert not changed(got[INF_STEP - 1], got[INF_STEP])  # the inf step was skipped
    assert len(set(scales)) > 2  # and the scale grew back afterwards


def test_everything_together_bf16() -> None:
    check(
        {
            "autocast_dtype": torch.bfloat16,
            "max_grad_norm": 0.5,
            "accumulation_steps": 4,
        }
    )


def test_everything_together_fp16_scaler() -> None:
    got = check(
        {
            "autocast_dtype": torch.float16,
            "grad_scaler": True,
            "max_grad_norm": 0.5,
            "accumulation_steps": 4,
        }
    )
    assert not changed(got[INF_STEP - 1], got[INF_STEP])


def test_fused_sgd_follows_the_schedule() -> None:
    def sgd(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)

    data = make_batches()
    want = run_plain({}, scheduled, data, sgd)
    step, got = run_graphed({}, scheduled, data, sgd)
    assert step.graphed is True, step.reason
    assert_same_training(got, want, 0.0)


def test_grad_scaler_with_foreach_adamw_runs_eagerly_with_the_reason() -> None:
    opts = {"autocast_dtype": torch.float16, "grad_scaler": True}
    data = make_batches(inf=True)
    want = run_plain(opts, no_hook, data, adamw("foreach"))
    step, got = run_graphed(opts, no_hook, data, adamw("foreach"))
    assert step.graphed is False
    assert "AdamW(..., fused=True, capturable=True)" in str(step.reason)
    assert_same_training(got, want, 0.0)


def test_a_change_the_graph_cannot_follow_is_refused() -> None:
    model = ddp.wrap_ddp(make_net(), for_capture=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = make_batches()
    step = ddp.build_step(model, opt, F.mse_loss, data[0], enabled=True, keep_faster=False)
    assert step.graphed is True
    step(*data[1])
    opt.param_groups[0]["lr"] = 0.01
    with pytest.raises(ValueError, match=r"SGD\(..., fused=True\)"):
        step(*data[2])
    opt.param_groups[0]["lr"] = 0.05
    opt.param_groups[0]["momentum"] = 0.5
    with pytest.raises(ValueError, match=r"\['momentum'\] changed from 0.9 to 0.5"):
        step(*data[2])


# --- keep_faster: build_step's own trial of eager against graphed ---------------------

EVERYTHING_BF16 = {"autocast_dtype": torch.bfloat16, "max_grad_norm": 0.5}


def prefer(monkeypatch: pytest.MonkeyPatch, eager_ms: float, graphed_ms: float) -> None:
    """Make the trial's verdict known in advance; the trial itself still runs."""
    real = graphed_step.slowest_rank

    def verdict(values: list[float], device: torch.device) -> list[float]:
        real(values, device)
        return [eager_ms, graphed_ms]

    monkeypatch.setattr(graphed_step, "slowest_rank", verdict)


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_a_kept_eager_step_is_the_plain_loop_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, impl: str
) -> None:
    """AdamW as users create it (capturable=False), dropout, bf16, clipping, schedule."""
    prefer(monkeypatch, eager_ms=1.0, graphed_ms=2.0)
    data = make_batches()
    make_opt = adamw(impl, capturable=False)
    want = run_plain(EVERYTHING_BF16, scheduled, data, make_opt, dropout=0.1)
    step, got = run_graphed(
        EVERYTHING_BF16, scheduled, data, make_opt, keep_faster=True, dropout=0.1
    )
    assert step.graphed is False
    assert step.trial_ms == {"eager": 1.0, "graphed": 2.0}
    assert "eager steps were faster: 1.000 ms against 2.000 ms" in str(step.reason)
    assert "keep_faster=False" in str(step.reason)
    assert all(g["capturable"] is False for g in step.optimizer.param_groups)
    assert_same_training(got, want, 0.0)


def test_a_graph_kept_after_the_trial_is_the_plain_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trial's eager steps leave no trace: parameters, state and RNG put back."""
    prefer(monkeypatch, eager_ms=2.0, graphed_ms=1.0)
    data = make_batches()
    want = run_plain(EVERYTHING_BF16, scheduled, data, adamw("fused"))
    step, got = run_graphed(
        EVERYTHING_BF16, scheduled, data, adamw("fused"), keep_faster=True
    )
    assert step.graphed is True and step.reason is None
    assert_same_training(got, want, 0.0)


def test_keep_faster_keeps_the_graph_of_a_launch_bound_step() -> None:
    """A small MLP spends its step launching kernels: its graph is kept, by measurement."""
    data = make_batches()
    step, _ = run_graphed(EVERYTHING_BF16, scheduled, data, adamw("fused"), keep_faster=True)
    assert step.trial_ms is not None
    print(f"launch-bound trial: {step.trial_ms}")
    assert step.graphed is True, step.reason
    assert step.trial_ms["graphed"] * 2 < step.trial_ms["eager"]


def test_keep_faster_on_a_compute_bound_step_keeps_what_its_trial_found_faster() -> None:
    """Wide layers, big batches: graph and eager within a few per cent; the faster is kept."""
    torch.manual_seed(0)
    model = ddp.wrap_ddp(
        nn.Sequential(*(nn.Sequential(nn.Linear(4096, 4096), nn.GELU()) for _ in range(4))).cuda(),
        for_capture=True,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x, y = torch.randn(8192, 4096, device="cuda"), torch.randn(8192, 4096, device="cuda")
    step = ddp.build_step(
        model, opt, F.mse_loss, (x, y), enabled=True, autocast_dtype=torch.bfloat16,
        max_grad_norm=1.0,
    )
    trial = step.trial_ms
    assert trial is not None
    print(f"compute-bound trial: {trial}, kept {'graph' if step.graphed else 'eager'}")
    assert step.graphed is (trial["graphed"] <= trial["eager"])
    assert 0.5 < trial["graphed"] / trial["eager"] < 1.5  # neither way gains much here
    loss = step(x, y)
    assert torch.isfinite(loss)


# --- BatchNorm, resumed runs and batches of another shape -----------------------------


def make_bn_net() -> nn.Module:
    """Linear biases before BatchNorm get noise for gradients, which Adam turns into
    lr-sized steps: any difference in the last bit of an update shows up at once."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.BatchNorm1d(64), nn.GELU(),
        nn.Linear(64, 64), nn.BatchNorm1d(64), nn.GELU(), nn.Linear(64, 8),
    ).cuda()


def state_difference(a: nn.Module, b: nn.Module) -> tuple[float, int]:
    """The largest difference over parameters and buffers, and how many differ."""
    sa, sb = a.state_dict(), b.state_dict()
    diffs = [float((sa[k].double() - sb[k].double()).abs().max()) for k in sa]
    return max(diffs), sum(d > 0 for d in diffs)


def train_bn(graphed: bool, data: list[Batch]) -> nn.Module:
    net = make_bn_net()
    model: nn.Module
    if graphed:
        model = ddp.wrap_ddp(net, for_capture=True)
    else:
        model = DistributedDataParallel(net, device_ids=[0])
    opt = adamw("foreach")(model)
    step = None
    if graphed:
        step = ddp.build_step(
            model, opt, F.mse_loss, data[0], enabled=True, keep_faster=False
        )
        assert step.graphed is True, step.reason
    for i, batch in enumerate(data):
        scheduled(i, opt)
        if step is not None:
            step(*batch)
        else:
            plain_step(model, opt, batch, {}, None)  # type: ignore[arg-type]
    return net


def test_batchnorm_with_foreach_adamw_equals_the_plain_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = make_batches()
    want = train_bn(False, data)
    got = train_bn(True, data)
    worst, count = state_difference(got, want)
    with monkeypatch.context() as m:  # the lr tensor of earlier versions: float32
        m.setattr(hyperparams, "lr_dtype", lambda opt, group: torch.float32)
        old, old_count = state_difference(train_bn(True, data), want)
    print(f"batchnorm foreach: max {worst:.3g} over {count} tensors; "
          f"with a float32 lr tensor {old:.3g} over {old_count}")
    assert worst <= 1e-6


def plain_resume_point(impl: str, data: list[Batch], steps: int) -> tuple[Any, Any]:
    """A checkpoint of the plain loop (capturable=False AdamW) after ``steps`` steps."""
    model = DistributedDataParallel(make_net(), device_ids=[0])
    opt = adamw(impl, capturable=False)(model)
    for batch in data[:steps]:
        plain_step(model, opt, batch, {}, None)
    return model.module.state_dict(), opt.state_dict()


# The plain resumed loop runs non-capturable foreach AdamW, whose bias correction is
# computed on the host: ~4e-7 apart from the capturable form over 40 steps (H200).
@pytest.mark.parametrize(("impl", "atol"), [("fused", 0.0), ("foreach", 1e-5)])
def test_a_run_resumed_from_a_plain_checkpoint_is_graphed_and_equal(
    impl: str, atol: float
) -> None:
    data = make_batches()
    weights, state = plain_resume_point(impl, data, 10)
    rest = data[10:]
    records = []
    for graphed in (True, False):
        net = make_net()
        net.load_state_dict(weights)
        if graphed:
            model = ddp.wrap_ddp(net, for_capture=True)
        else:
            model = DistributedDataParallel(net, device_ids=[0])
        opt = adamw(impl, capturable=False)(model)
        opt.load_state_dict(copy.deepcopy(state))  # as torch.load gives it: a copy
        if graphed:
            step = ddp.build_step(
                model, opt, F.mse_loss, rest[0], enabled=True, keep_faster=False
            )
            assert step.graphed is True and step.reason is None, step.reason
            assert all(s["step"].is_cuda for s in opt.state.values())
        for batch in rest:
            if graphed:
                step(*batch)
            else:
                plain_step(model, opt, batch, {}, None)  # type: ignore[arg-type]
        records.append([p.detach().clone() for p in model.parameters()])
    worst = max(float((p - q).abs().max()) for p, q in zip(*records))
    print(f"resumed {impl}: max |graphed - plain| = {worst:.3g}")
    assert worst <= atol


@pytest.mark.parametrize(("impl", "atol"), [("fused", 0.0), ("foreach", 1e-6)])
def test_batches_of_another_shape_run_eagerly_and_the_graph_replays_after(
    impl: str, atol: float
) -> None:
    data = make_batches()
    for i in (20, STEPS - 1):  # a short batch mid-run and a short last batch
        data[i] = (data[i][0][:5], data[i][1][:5])
    opts = {"max_grad_norm": 0.5}
    want = run_plain(opts, scheduled, data, adamw(impl))
    step, got = run_graphed(opts, scheduled, data, adamw(impl))
    assert step.graphed is True
    assert_same_training(got, want, atol)
    assert changed(got[20], got[21])  # the replay after the short batch moved on
    print(f"short batches {impl}: max |graphed - eager| = {max_difference(got, want):.3g}")
