"""One DDP training step, replayed from a CUDA graph when it can be: the plan, the compile,
the capture and the keep-faster trial put together, their outcome decided once."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn

from cluster_kit.trainer.process_group import log_once, module_device
from cluster_kit.trainer.step.capture import Capture
from cluster_kit.trainer.step.compile import compile_loop
from cluster_kit.trainer.step.loop import Batch, LossFn, PlainLoop
from cluster_kit.trainer.step.plan import DDP_MIN_WARMUP, StepOptions, why_not_graphed
from cluster_kit.trainer.step.snapshot import (
    RngState,
    Snapshot,
    restore_scaler,
    save_scaler,
)
from cluster_kit.trainer.step.trial import all_ranks_agree, slowest_rank, time_ms
from cluster_kit.trainer.supervision import heartbeat


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """What the step turned out to be: ``graphed`` (it replays a graph), ``compiled`` (it
    runs Inductor's kernels), ``reason`` (why it is not all that was asked for; None when
    it is) and ``trial_ms`` (the keep-faster trial's figures, when it ran)."""

    graphed: bool = False
    compiled: bool = False
    reason: str | None = None
    trial_ms: dict[str, float] | None = None


class GraphedStep:
    """One DDP training step, replayed from a CUDA graph when it can be.

    ``model`` is the (DDP-wrapped) module, ``optimizer`` steps its parameters,
    ``loss_fn(output, targets)`` returns a scalar loss, and ``example_batch`` is an
    ``(inputs, targets)`` pair with the shapes and dtypes of the later batches (a
    batch of another shape, e.g. a short last batch, runs the plain loop's step
    eagerly on the same state, logged once; the next batch of the captured shape
    replays the graph again). ``warmup`` eager
    iterations run before capture (at least 11 for DDP).

    ``autocast_dtype`` runs forward and loss under autocast; ``max_grad_norm``
    clips the total gradient norm (kept in :attr:`last_grad_norm`);
    ``accumulation_steps=k`` makes one step k micro-batches (a leading dimension
    of size k on inputs and targets, DDP ``no_sync()`` on all but the last);
    ``grad_scaler`` scales an fp16 loss. Graphed or eager, a step computes what
    the plain loop in SPEC "cluster_kit.ddp" computes.

    ``keep_faster`` times the plain eager step and the replayed graph on the
    example batch (TRIAL_STEPS each, the slowest rank's figure) and keeps the graph
    only if it is faster: a compute-bound step gains nothing from a graph and pays
    for what capture needs (``capturable`` optimizer state, autocast without its
    cache). ``trial_ms`` holds both figures. Trial steps, like warm-up, are undone.

    ``compile_options`` (``torch.compile`` keyword arguments, see
    :func:`cluster_kit.trainer.compile_options.compile_options`; None: not compiled) compiles the model and the loss
    with Inductor before anything else runs; the whole step, Inductor's kernels
    included, is then captured as one graph, so a replay runs them without
    launches or torch.compile's guards. Graphed or eager, a compiled step computes
    what the plain loop computes with ``compile_model(model, **options)`` and
    ``torch.compile(loss_fn, **options)`` in their places: the model, or on one
    rank the module DDP wraps (:func:`compile_target`), each repeated block
    compiled once (:func:`compile_model`). With
    several ranks dynamo splits the compiled model at DDP's buckets and the graph
    holds every bucket's all-reduce where backward starts it. Autocast then runs
    without its cast cache in every step (a compiled graph casts by itself, and
    dynamo would compile again for each setting of the cache).

    After construction ``graphed`` says whether steps replay a graph,
    ``compiled`` whether they run Inductor's kernels, and ``reason`` why the
    step is not all that was asked for (None when it is): not graphed, or a
    compile that failed (the model's own kernels then run, graphed or not).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        example_batch: Batch,
        warmup: int = DDP_MIN_WARMUP,
        enabled: bool = True,
        *,
        autocast_dtype: torch.dtype | None = None,
        max_grad_norm: float | None = None,
        accumulation_steps: int = 1,
        grad_scaler: Any | None = None,
        keep_faster: bool = False,
        compile_options: dict[str, Any] | None = None,
    ) -> None:
        self.options = StepOptions(warmup, autocast_dtype, max_grad_norm, accumulation_steps, grad_scaler,
                                   keep_faster, compile_options)
        self.options.check(model, example_batch)
        self.model = model
        self.optimizer = optimizer
        self.device = module_device(model)
        self.loop = PlainLoop(model, optimizer, loss_fn, self.options, self.device)
        self.captured = Capture(self.loop)
        self.outcome = self._build(example_batch, enabled)

    @property
    def graphed(self) -> bool:
        return self.outcome.graphed

    @property
    def compiled(self) -> bool:
        return self.outcome.compiled

    @property
    def reason(self) -> str | None:
        return self.outcome.reason

    @property
    def trial_ms(self) -> dict[str, float] | None:
        return self.outcome.trial_ms

    @property
    def last_grad_norm(self) -> torch.Tensor | None:
        """Total gradient norm of the last step (before clipping); None without clipping."""
        norm = self.loop.grad_norm
        if norm is None or norm is not self.captured.static_grad_norm:
            return norm
        return norm.clone()  # the graph overwrites it on the next replay

    # --- what the step is, decided once ----------------------------------------------
    def _build(self, example_batch: Batch, enabled: bool) -> StepOutcome:
        options = self.options.compile_options
        compile_reason = compile_loop(self.loop, example_batch, options) if options is not None else None
        outcome = StepOutcome(reason=why_not_graphed(enabled, self.device, self.optimizer,
                                                     self.options.grad_scaler))
        if outcome.reason is None:
            outcome = self._capture_or_fall_back(example_batch)
        elif enabled:
            log_once(logging.WARNING, f"CUDA graphs off, training steps run eagerly: {outcome.reason}")
        reason = "; ".join(r for r in (outcome.reason, compile_reason) if r) or None
        return dataclasses.replace(outcome, compiled=self.loop.compiled, reason=reason)

    def _capture_or_fall_back(self, example_batch: Batch) -> StepOutcome:
        """Capture (after the keep-faster trial's eager steps), every rank alike; the
        model, optimizer, scaler and random numbers as the caller handed them in."""
        snapshot = Snapshot.take(self.model, self.optimizer)
        scaler_state = save_scaler(self.options.grad_scaler)
        rng = RngState(self.device)
        eager_ms = None
        if self.options.keep_faster:
            eager_ms = self._time_eager(example_batch)
            snapshot.restore(self.model, self.optimizer, keep_new_state=False)
            restore_scaler(self.options.grad_scaler, scaler_state)
            rng.restore()
        error: str | None = None
        try:
            self.captured.record(example_batch)
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            error = f"capture failed: {type(exc).__name__}: {exc}".strip()
        if all_ranks_agree(error is None, self.device):
            outcome = self._keep_faster(eager_ms) if eager_ms is not None else StepOutcome(graphed=True)
        else:
            outcome = StepOutcome(reason=error or "capture failed on another rank")
            log_once(logging.WARNING, f"CUDA graphs off, training steps run eagerly: {outcome.reason}")
        if not outcome.graphed:
            self.captured.drop()
        snapshot.restore(self.model, self.optimizer, keep_new_state=outcome.graphed)
        restore_scaler(self.options.grad_scaler, scaler_state)
        if not outcome.graphed and eager_ms is not None:
            rng.restore()  # eager from here: the plain loop's random numbers
        torch.cuda.synchronize(self.device)
        return outcome

    def _time_eager(self, example_batch: Batch) -> float:
        """The plain loop's step on the example batch, in ms (the optimizer as given)."""
        inputs, targets = (t.to(self.device) for t in example_batch)
        return time_ms(lambda: self.loop.eager_step(inputs, targets), self.device)

    def _keep_faster(self, eager_ms: float) -> StepOutcome:
        """Replay the graph as long as the trial's eager steps took; keep the faster."""
        graph = self.captured.graph
        assert graph is not None
        graphed_ms = time_ms(graph.replay, self.device)
        eager_ms, graphed_ms = slowest_rank([eager_ms, graphed_ms], self.device)
        trial = {"eager": eager_ms, "graphed": graphed_ms}
        if graphed_ms <= eager_ms:
            return StepOutcome(graphed=True, trial_ms=trial)
        reason = (f"eager steps were faster: {eager_ms:.3f} ms against {graphed_ms:.3f} ms "
                  "replayed (a compute-bound step); keep_faster=False keeps the graph")
        log_once(logging.INFO, f"CUDA graph not kept: {reason}")
        return StepOutcome(reason=reason, trial_ms=trial)

    # --- each step ---------------------------------------------------------------------
    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Run one training step on this batch and return its loss (a new tensor).

        Each step is reported to a supervised job's supervisor (``heartbeat``).
        """
        loss = self._run_step(inputs, targets)
        heartbeat()
        return loss

    __call__ = step

    def _run_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if not self.graphed:
            self.options.check_micro_batches(inputs, targets, what="the batch's")
            return self.loop.eager_step(inputs, targets)
        if not self.captured.fits(inputs, targets):
            return self._odd_batch_step(inputs, targets)
        return self.captured.replay(inputs, targets)

    def _odd_batch_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """A batch of another shape (a short last batch): the plain loop's step, eagerly.

        It reads and updates the same parameters, buffers and optimizer state as the
        graph, with the optimizer's own hyper-parameters (lr from its group, as the
        plain loop); the graph's gradient tensors are put back for the next replay.
        """
        assert self.captured.static_inputs is not None
        self.options.check_micro_batches(inputs, targets, what="the batch's")
        log_once(
            logging.INFO,
            f"a batch of shape {tuple(inputs.shape)} (captured: "
            f"{tuple(self.captured.static_inputs.shape)}) ran eagerly; the graph replays the "
            "next batch of the captured shape",
        )
        graph_grads = [p.grad for p in self.loop.params]
        loss = self.loop.eager_step(inputs.to(self.device), targets.to(self.device))
        for param, grad in zip(self.loop.params, graph_grads):
            param.grad = grad
        return loss
