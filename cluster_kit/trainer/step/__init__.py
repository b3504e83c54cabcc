"""The training step: :func:`build_step` and what it returns.

A small DDP model spends most of a step launching kernels from Python; replaying a
captured graph launches the whole step at once. The parts, each of one concern:

* :mod:`.plan`: the options checked, and why a step runs eagerly (the pure plan);
* :mod:`.loop`: the plain loop's step (micro-batches, autocast, scaler, clipping);
* :mod:`.compile`: the model and loss compiled by Inductor (repeated blocks once);
* :mod:`.capture`: the step captured as one CUDA graph and replayed;
* :mod:`.trial`: the keep-faster trial, and what every rank decides alike;
* :mod:`.hyperparams`, :mod:`.snapshot`: lr between replays; state put back after warm-up;
* :mod:`.graphed`: :class:`GraphedStep`, which puts them together into one outcome.

Warm-up runs real optimizer steps on the example batch; the model's parameters,
buffers and optimizer state are put back afterwards, so the first real step starts
from the state the caller handed in. On a CPU model, when graphs are not requested,
or when capture fails, the step runs eagerly and says why in ``reason`` (logged
once). Every step reports itself to a supervised job's supervisor.
"""
from __future__ import annotations

import atexit
from typing import Any, Protocol

import torch
from torch import nn

from cluster_kit.trainer.compile_options import compile_options, options_from_env
from cluster_kit.trainer.process_group import graphs_requested
from cluster_kit.trainer.profiler import StepProfiler, recording
from cluster_kit.trainer.step.graphed import GraphedStep, StepOutcome
from cluster_kit.trainer.step.loop import Batch, LossFn
from cluster_kit.trainer.step.plan import DDP_MIN_WARMUP
from cluster_kit.trainer.supervision import enable_supervision, finish_at_exit

__all__ = ["Batch", "GraphedStep", "LossFn", "ProfiledStep", "StepOutcome", "TrainingStep", "build_step"]


class TrainingStep(Protocol):
    """What :func:`build_step` returns: a :class:`GraphedStep`, itself or feeding a profiler.

    ``step(inputs, targets)`` (or ``step.step``) runs one training step and returns
    its loss; ``graphed``, ``compiled``, ``reason``, ``trial_ms`` and
    ``last_grad_norm`` are :class:`GraphedStep`'s.
    """

    @property
    def model(self) -> nn.Module: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    @property
    def graphed(self) -> bool: ...

    @property
    def compiled(self) -> bool: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def trial_ms(self) -> dict[str, float] | None: ...

    @property
    def last_grad_norm(self) -> torch.Tensor | None: ...

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...


class ProfiledStep:
    """A step from build_step that feeds a StepProfiler; its attributes pass through."""

    def __init__(self, step: GraphedStep, profiler: StepProfiler) -> None:
        self._step = step
        self._profiler = profiler

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if not recording():  # a script's own StepProfiler around the loop wins
            self._profiler.__enter__()
        loss = self._step(inputs, targets)
        self._profiler.step()
        return loss

    step = __call__

    @property
    def model(self) -> nn.Module:
        return self._step.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._step.optimizer

    @property
    def graphed(self) -> bool:
        return self._step.graphed

    @property
    def compiled(self) -> bool:
        return self._step.compiled

    @property
    def reason(self) -> str | None:
        return self._step.reason

    @property
    def trial_ms(self) -> dict[str, float] | None:
        return self._step.trial_ms

    @property
    def last_grad_norm(self) -> torch.Tensor | None:
        return self._step.last_grad_norm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._step, name)


def build_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    example_batch: Batch,
    *,
    warmup: int = DDP_MIN_WARMUP,
    enabled: bool | None = None,
    autocast_dtype: torch.dtype | None = None,
    max_grad_norm: float | None = None,
    accumulation_steps: int = 1,
    grad_scaler: Any | None = None,
    keep_faster: bool = True,
    compile: bool | str | dict[str, Any] | None = None,
) -> TrainingStep:
    """A training step, graphed when ``enabled`` (default: ``CLUSTERKIT_CUDA_GRAPHS=1``).

    See :class:`GraphedStep` for the options; ``step.graphed`` and ``step.reason``
    say whether it replays a graph and why not. With ``keep_faster`` (the default)
    the graph is kept only where it beats the eager step, timed on the example batch.
    With ``CLUSTERKIT_PROFILE_STEPS`` set (``bench ddp``) the step also feeds a
    :class:`StepProfiler` of its own.

    ``compile``: the model and the loss compiled by Inductor, their kernels then
    captured with the rest of the step in the one graph. True or ``"default"``:
    ``torch.compile``'s defaults; ``"max-autotune-no-cudagraphs"``: that mode; a
    dict: ``torch.compile`` arguments (``mode``, ``fullgraph``, ``dynamic``,
    ``options``); False: not compiled; None (the default): what
    ``CLUSTERKIT_CUDA_GRAPHS_COMPILE`` says (a job file's ``cuda_graphs: {compile:
    ...}`` exports it), else not compiled. Modes that record CUDA graphs of their
    own are refused (ValueError). A compile that fails leaves the model's own
    kernels, with the reason in ``step.reason``; ``step.compiled`` says which ran.
    """
    enable_supervision()  # a hang in warm-up or capture is diagnosed too
    finish_at_exit()  # a run whose loop ends without a stop asked is done
    wanted = graphs_requested() if enabled is None else enabled
    options = options_from_env() if compile is None else compile_options(compile)
    step = GraphedStep(
        model,
        optimizer,
        loss_fn,
        example_batch,
        warmup=warmup,
        enabled=wanted,
        autocast_dtype=autocast_dtype,
        max_grad_norm=max_grad_norm,
        accumulation_steps=accumulation_steps,
        grad_scaler=grad_scaler,
        keep_faster=keep_faster,
        compile_options=options,
    )
    profiler = StepProfiler()
    if not profiler.enabled:
        return step
    atexit.register(profiler.close)
    return ProfiledStep(step, profiler)
