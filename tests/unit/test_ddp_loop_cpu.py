"""The training-loop options of build_step on the CPU (gloo), and what it refuses.

Eager steps must equal the plain loop of SPEC "cluster_kit.ddp" bit for bit:
LR schedules and lr assignment, bf16 autocast, clipping, accumulation, GradScaler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from cluster_kit import ddp
from cluster_kit.trainer.step.snapshot import steps_onto_devices

Batch = tuple[torch.Tensor, torch.Tensor]
STEPS = 12


@pytest.fixture(scope="module", autouse=True)
def process_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def make_model() -> DistributedDataParallel:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )
    return DistributedDataParallel(net)


def make_batches(n: int, k: int = 1) -> list[Batch]:
    gen = torch.Generator().manual_seed(1)
    lead = (k,) if k > 1 else ()
    return [
        (
            3 * torch.randn(*lead, 5, 8, generator=gen),
            torch.randn(*lead, 5, 4, generator=gen),
        )
        for _ in range(n)
    ]


def warmup_cosine(optimizer: torch.optim.Optimizer) -> Any:
    def factor(i: int) -> float:
        if i < 3:
            return (i + 1) / 3
        return 0.5 * (1 + math.cos(math.pi * (i - 3) / STEPS))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def plain_loop(
    model: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    k: int,
    autocast_dtype: torch.dtype | None,
    max_grad_norm: float | None,
    scaler: Any | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SPEC's plain loop, written out as a user would: (mean loss, grad norm)."""
    total = torch.zeros(())
    norm = None
    for i in range(k):
        sync = model.no_sync() if i < k - 1 else contextlib.nullcontext()
        x, y = (inputs[i], targets[i]) if k > 1 else (inputs, targets)
        with sync:
            cast = (
                torch.autocast("cpu", dtype=autocast_dtype)
                if autocast_dtype
                else contextlib.nullcontext()
            )
            with cast:
                loss = F.mse_loss(model(x), y)
                loss_i = loss / k if k > 1 else loss
            (scaler.scale(loss_i) if scaler else loss_i).backward()
        total = loss_i.detach() if i == 0 else total + loss_i.detach()
    if max_grad_norm:
        if scaler:
            scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, norm


Hook = Callable[[int, torch.optim.Optimizer], None]


def run_both(
    opts: dict[str, Any],
    hook: Hook,
    data: list[Batch],
    make_opt: Callable[[torch.nn.Module], torch.optim.Optimizer],
    make_scaler: Callable[[], Any] | None = None,
) -> tuple[list[Any], list[Any]]:
    """The same steps through build_step and through the plain loop: per-step records."""
    records: list[list[Any]] = [[], []]
    for which in (0, 1):
        model = make_model()
        opt = make_opt(model)
        scaler = make_scaler() if make_scaler else None
        if which == 0:
            step = ddp.build_step(
                model,
                opt,
                F.mse_loss,
                data[0],
                enabled=False,
                grad_scaler=scaler,
                **opts,
            )
        for i, (x, y) in enumerate(data):
            hook(i, opt)
            if which == 0:
                loss, norm = step(x, y), step.last_grad_norm
            else:
                loss, norm = plain_loop(
                    model,
                    opt,
                    x,
                    y,
                    opts.get("accumulation_steps", 1),
                    opts.get("autocast_dtype"),
                    opts.get("max_grad_norm"),
                    scaler,
                )
            scale = scaler.get_scale() if scaler else None
            records[which].append(
                (
                    loss.clone(),
                    None if norm is None else norm.clone(),
                    scale,
                    [p.detach().clone() for p in model.parameters()],
                )
            )
    return records[0], records[1]


def same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Bit-equal, nan where the other is nan (an inf step's loss and norm)."""
    if a is None or b is None:
        return a is b
    return bool(
        torch.equal(a.isnan(), b.isnan())
        and torch.equal(a.nan_to_num(), b.nan_to_num())
    )


def assert_identical(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want) == STEPS
    for i, (a, b) in enumerate(zip(got, want)):
        assert same(a[0], b[0]), f"loss differs at step {i}"
        assert same(a[1], b[1]), f"grad norm differs at step {i}"
        assert a[2] == b[2], f"scale differs at step {i}"
        assert all(torch.equal(p, q) for p, q in zip(a[3], b[3])), f"step {i}"


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def schedule_then_zero(i: int, opt: torch.optim.Optimizer) -> None:
    """Warm-up + cosine from a scheduler; from step 5 on, lr assigned 0 by hand."""
    if i == 0:
        opt._test_sched = warmup_cosine(opt)  # type: ignore[attr-defined]
    elif i < 5:
        opt._test_sched.step()  # type: ignore[attr-defined]
    else:
        for group in opt.param_groups:
            group["lr"] = 0.0


def no_hook(i: int, opt: torch.optim.Optimizer) -> None:
    pass


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"autocast_dtype": torch.bfloat16},
        {"max_grad_norm": 0.5},
        {"accumulation_steps": 4},
        {
            "autocast_dtype": torch.bfloat16,
            "max_grad_norm": 0.5,
            "accumulation_steps": 4,
        },
    ],
    ids=["schedule", "bf16", "clip", "accumulate4", "all"],
)
def test_eager_step_equals_the_plain_loop(opts: dict[str, Any]) -> None:
    data = make_batches(STEPS, opts.get("accumulation_steps", 1))
    got, want = run_both(opts, schedule_then_zero, data, adamw)
    assert_identical(got, want)
    if "max_grad_norm" in opts:  # clipping really happened: norms above the cap
        assert max(float(r[1]) for r in got) > opts["max_grad_norm"]
    # lr 0 from step 5 on: weight decay and update stop, the parameters stay put
    assert all(torch.equal(p, q) for p, q in zip(got[5][3], got[-1][3]))
    assert not all(torch.equal(p, q) for p, q in zip(got[0][3], got[4][3]))


def test_accumulation_returns_the_mean_of_the_micro_batch_losses() -> None:
    ((x, y),) = make_batches(1, k=4)
    model = make_model()
    want = torch.stack([F.mse_loss(model(x[i]), y[i]) for i in range(4)]).mean()
    step = ddp.build_step(
        model, adamw(model), F.mse_loss, (x, y), enabled=False, accumulation_steps=4
    )
    torch.testing.assert_close(step(x, y), want.detach(), rtol=1e-6, atol=0)


def test_grad_scaler_skips_a_step_with_inf_like_the_plain_loop() -> None:
    data = make_batches(STEPS)
    data[4] = (torch.full_like(data[4][0], float("inf")), data[4][1])

    def scaler() -> Any:
        return torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)

    got, want = run_both({"max_grad_norm": 1.0}, no_hook, data, adamw, scaler)
    assert_identical(got, want)
    scales = [r[2] for r in got]
    assert scales[4] == scales[3] / 2  # the inf step halved the scale ...
    assert all(
        torch.equal(p, q) for p, q in zip(got[3][3], got[4][3])
    )  # ... and skipped
    assert max(scales) > scales[0]  # and it grows back every 3 good steps


def test_eager_step_without_a_process_group_wrapper_equals_plain_steps() -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 4)
    ref = torch.nn.Linear(8, 4)
    ref.load_state_dict(net.state_dict())
    x, y = make_batches(1)[0]
    step = ddp.build_step(net, adamw(net), F.mse_loss, (x, y), enabled=False)
    opt = adamw(ref)
    for _ in range(3):
        step(x, y)
        F.mse_loss(ref(x), y).backward()
        opt.step()
        opt.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), ref.parameters()))


def test_keep_faster_runs_no_trial_where_nothing_can_be_graphed() -> None:
    """On CPU there is no graph to time: no trial steps, the parameters untouched."""
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 4)
    before = [p.detach().clone() for p in net.parameters()]
    step = ddp.build_step(net, adamw(net), F.mse_loss, make_batches(1)[0],
                          enabled=True, keep_faster=True)
    assert step.graphed is False and step.trial_ms is None
    assert step.reason == "CUDA is not available"
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))


# --- what cannot be graphed, and why -------------------------------------------


def test_an_optimizer_without_a_capturable_mode_is_named_with_what_works() -> None:
    model = make_model()
    advice = ddp.optimizer_advice(torch.optim.LBFGS(model.parameters()))
    assert advice is not None
    assert advice.startswith("LBFGS has no capturable mode")
    assert "AdamW" in advice and "SGD" in advice
    assert ddp.optimizer_advice(torch.optim.SGD(model.parameters(), lr=0.1)) is None
    assert ddp.optimizer_advice(adamw(model)) is None


def test_host_side_state_is_refused_where_it_cannot_be_moved() -> None:
    model = make_model()
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    x, y = make_batches(1)[0]
    F.mse_loss(model(x), y).backward()
    opt.step()
    advice = ddp.optimizer_advice(opt)
    assert advice is not None and "RMSprop(..., capturable=True)" in advice


# --- resuming from a plain optimizer's checkpoint ------------------------------


def plain_checkpoint(steps: int) -> tuple[dict[str, Any], dict[str, Any], list[Batch]]:
    """Model and optimizer state after ``steps`` plain steps, and the batches after them."""
    data = make_batches(steps + STEPS)
    model = make_model()
    opt = adamw(model)
    for x, y in data[:steps]:
        plain_loop(model, opt, x, y, 1, None, None, None)
    return model.state_dict(), opt.state_dict(), data[steps:]


def resumed() -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    weights, state, _ = plain_checkpoint(4)
    model = make_model()
    model.load_state_dict(weights)
    opt = adamw(model)
    opt.load_state_dict(state)
    return model, opt


def test_adam_resumed_from_a_plain_checkpoint_can_be_graphed() -> None:
    _, opt = resumed()
    assert opt.state and not opt.param_groups[0]["capturable"]
    assert ddp.optimizer_advice(opt) is None
    assert ddp.why_eager_for(opt) is None


def test_a_resumed_eager_step_equals_the_plain_resumed_loop() -> None:
    _, _, data = plain_checkpoint(4)
    records = []
    for through_step in (True, False):
        model, opt = resumed()
        step = ddp.build_step(model, opt, F.mse_loss, data[0], enabled=False)
        for x, y in data:
            if through_step:
                step(x, y)
            else:
                plain_loop(model, opt, x, y, 1, None, None, None)
        records.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(p, q) for p, q in zip(*records))


def test_host_step_counts_move_to_the_parameters_device_and_back() -> None:
    """What build_step does to a resumed Adam before capture, and undoes on fallback."""
    param = torch.nn.Parameter(torch.zeros(3, device="meta"))
    opt = torch.optim.AdamW([param], lr=1e-2)
    host_step = torch.tensor(7.0)
    opt.state[param] = {"step": host_step, "exp_avg": torch.zeros(3, device="meta")}
    moved = steps_onto_devices(opt, opt.param_groups[0])
    assert opt.state[param]["step"].device.type == "meta"
    assert moved == [(opt.state[param], host_step)]


# --- a batch of another shape than the captured one ----------------------------


class NoReplay:
    """Stands for a captured graph on the CPU: a batch of another shape never replays it."""

    def replay(self) -> None:
        raise AssertionError("a batch of another shape replayed the graph")


def as_if_captured(step: Any, example: Batch) -> None:
    step.outcome = dataclasses.replace(step.outcome, graphed=True)
    step.captured.graph = NoReplay()
    step.captured.static_inputs, step.captured.static_targets = (t.clone() for t in example)
    step.captured.static_loss = torch.zeros(())


@pytest.mark.parametrize("opts", [{}, {"max_grad_norm": 0.5}], ids=["plain", "clip"])
def test_a_short_last_batch_runs_the_plain_loops_step(opts: dict[str, Any]) -> None:
    data = make_batches(STEPS)
    short = (data[-1][0][:3], data[-1][1][:3])
    records: list[list[Any]] = []
    for through_step in (True, False):
        model = make_model()
        opt = adamw(model)
        sched = warmup_cosine(opt)
        step = ddp.build_step(model, opt, F.mse_loss, data[0], enabled=False, **opts)
        for x, y in data[:-1]:  # full batches: the plain loop on both sides
            plain_loop(model, opt, x, y, 1, None, opts.get("max_grad_norm"), None)
            sched.step()
        grads = [torch.zeros_like(p) for p in step.loop.params]
        for p, g in zip(step.loop.params, grads):
            p.grad = g  # what a captured backward left behind
        if through_step:
            as_if_captured(step, data[0])
            loss, norm = step(*short), step.last_grad_norm
            assert all(p.grad is g for p, g in zip(step.loop.params, grads))
        else:
            opt.zero_grad(set_to_none=True)
            loss, norm = plain_loop(
                model, opt, *short, 1, None, opts.get("max_grad_norm"), None
            )
        records.append([loss, norm, [p.detach().clone() for p in model.parameters()]])
    (loss, norm, params), (want_loss, want_norm, want_params) = records
    assert same(loss, want_loss) and same(norm, want_norm)
    assert all(torch.equal(p, q) for p, q in zip(params, want_params))
    assert not any(torch.equal(p, q) for p, q in zip(params, make_model().parameters()))


def test_grad_scaler_needs_a_fused_optimizer_to_be_graphed() -> None:
    model = make_model()
    scaler = torch.amp.GradScaler("cpu")
    why = ddp.why_eager_for(adamw(model), scaler)
    assert why is not None
    assert "AdamW(foreach)" in why and "AdamW(..., fused=True, capturable=True)" in why
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    assert "SGD(..., fused=True))" in str(ddp.why_eager_for(sgd, scaler))
    fused = torch.optim.AdamW(model.parameters(), fused=True)
    assert ddp.why_eager_for(fused, scaler) is None
    off = torch.amp.GradScaler("cpu", enabled=False)
    assert ddp.why_eager_for(adamw(model), off) is None


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler")
def test_hyper_params_carry_a_changed_lr_into_the_captured_tensor() -> None:
    model = make_model()
    opt = adamw(model)
    hyper = ddp.HyperParams(opt, torch.device("cpu"))
    hyper.install()
    captured = opt.param_groups[0]["lr"]
    assert torch.is_tensor(captured) and float(captured) == pytest.approx(1e-2)
    hyper.uninstall()
    assert opt.param_groups[0]["lr"] == 1e-2  # the group holds its float again
    sched = warmup_cosine(opt)  # a scheduler made after capture adds initial_lr
    hyper.apply()
    assert float(captured) == pytest.approx(1e-2 / 3)
    sched.step()
    hyper.apply()
    assert float(captured) == pytest.approx(2e-2 / 3)
    opt.param_groups[0]["lr"] = 0.0
    hyper.apply()
    assert float(captured) == 0.0
    opt.param_groups[0]["lr"] = torch.tensor(0.25)
    hyper.apply()
    assert float(captured) == 0.25


def test_hyper_params_copy_a_tensor_lr_given_at_creation() -> None:
    model = make_model()
    own = torch.tensor(0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=own, capturable=True)
    hyper = ddp.HyperParams(opt, torch.device("cpu"))
    hyper.install()
    captured = opt.param_groups[0]["lr"]
    assert captured is not own and float(captured) == 0.5
    hyper.uninstall()
    assert opt.param_groups[0]["lr"] is own
    own.fill_(0.125)  # what a scheduler does to a tensor lr
    hyper.apply()
    assert float(captured) == 0.125


def test_hyper_params_refuse_what_a_replay_would_ignore() -> None:
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hyper = ddp.HyperParams(sgd, torch.device("cpu"))
    hyper.install()
    hyper.uninstall()
    assert sgd.param_groups[0]["lr"] == 0.1  # foreach SGD keeps a float lr
    hyper.apply()
    sgd.param_groups[0]["lr"] = 0.05
    with pytest.raises(ValueError) as lr_error:
        hyper.apply()
    assert "param_groups[0]['lr'] changed from 0.1 to 0.05" in str(lr_error.value)
    assert "SGD(..., fused=True)" in str(lr_error.value)
    sgd.param_groups[0]["lr"] = 0.1
    sgd.param_groups[0]["weight_decay"] = 0.01
    with pytest.raises(ValueError) as wd_error:
        hyper.apply()
    assert "param_groups[0]['weight_decay'] changed from 0 to 0.01" in str(
        wd_error.value
    )
    assert "build the step again" in str(wd_error.value)
    sgd.param_groups[0]["weight_decay"] = 0
    sgd.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    with pytest.raises(ValueError, match="2 param groups, the captured step 1"):
        hyper.apply()


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"accumulation_steps": 4}, r"shape \(5, 8\), but accumulation_steps=4"),
        ({"accumulation_steps": 0}, "accumulation_steps must be an integer >= 1"),
        ({"max_grad_norm": 0.0}, "max_grad_norm must be > 0"),
        ({"autocast_dtype": torch.float32}, "autocast_dtype must be torch.bfloat16"),
    ],
)
def test_bad_options_are_refused_with_the_fix(
    opts: dict[str, Any], message: str
) -> None:
    model = make_model()
    with pytest.raises(ValueError, match=message):
        ddp.build_step(model, adamw(model), F.mse_loss, make_batches(1)[0], **opts)


def test_an_eager_batch_without_the_micro_batch_dimension_is_refused() -> None:
    model = make_model()
    step = ddp.build_step(
        model,
        adamw(model),
        F.mse_loss,
        make_batches(1, k=2)[0],
        enabled=False,
        accumulation_steps=2,
    )
    with pytest.raises(ValueError, match="batch's inputs have shape"):
        step(*make_batches(1)[0])
