"""The plain loop of SPEC "cluster_kit.ddp", as one step runs it eagerly, in warm-up and in capture.

Micro-batches (DDP ``no_sync()`` on all but the last), forward and loss under
autocast, backward through the GradScaler, clipping, the optimizer's update. What a
step calls for the model and the loss are the model and the loss, or Inductor's
compilations of them (:func:`cluster_kit.trainer.step.compile.compile_loop`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from cluster_kit.trainer.process_group import (
    built_on_capture_stream,
    capture_stream,
    is_ddp,
)
from cluster_kit.trainer.step.plan import StepOptions

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]


class PlainLoop:
    """One step of the plain loop over a model, an optimizer and a loss."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                 options: StepOptions, device: torch.device) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.options = options
        self.device = device
        # What a step calls: the model and loss, or Inductor's compilations of them.
        self.forward: Callable[..., Any] = model
        self.loss: Callable[..., Any] = loss_fn
        self.compiled = False
        self.capturing = False  # autocast keeps its cache except for the graph's steps
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grad_norm: torch.Tensor | None = None
        # Eager steps of a DDP built on the capture stream run there too: its
        # AccumulateGrad nodes live on that stream, and autograd would join the two
        # streams at every gradient otherwise.
        self.eager_stream = capture_stream(device) if built_on_capture_stream(model) else None

    def eager_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """zero_grad, then the step: the loss (a new tensor)."""
        with self.on_eager_stream():
            self.optimizer.zero_grad(set_to_none=True)
            return self.train_step(inputs, targets)

    @contextlib.contextmanager
    def on_eager_stream(self) -> Iterator[None]:
        """Eager work on the capture stream when DDP was built there (else as it comes)."""
        stream = self.eager_stream
        if stream is None:
            yield
            return
        current = torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            yield
        current.wait_stream(stream)

    def autocast(self) -> Any:
        if self.options.autocast_dtype is None:
            return contextlib.nullcontext()
        # A graph must not keep autocast's cache of cast weights from capture time;
        # eager steps keep it, as the plain loop does. Compiled steps never use it
        # (Inductor's kernels cast by themselves) and keep one setting throughout:
        # dynamo guards on it and would compile the model again for the other.
        cache = not self.capturing and not self.compiled
        return torch.autocast(self.device.type, dtype=self.options.autocast_dtype, cache_enabled=cache)

    def no_sync(self) -> Any:
        """DDP ``no_sync()``: backward without the all-reduce (nothing without DDP)."""
        if is_ddp(self.model):
            return self.model.no_sync()  # type: ignore[operator]
        return contextlib.nullcontext()

    def micro_batch_context(self, index: int) -> Any:
        """DDP ``no_sync()`` on every micro-batch but the last."""
        if index < self.options.accumulation_steps - 1:
            return self.no_sync()
        return contextlib.nullcontext()

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The plain loop of SPEC "cluster_kit.ddp", minus zero_grad: the mean loss."""
        k = self.options.accumulation_steps
        total: torch.Tensor | None = None
        for index in range(k):
            x, y = (inputs, targets) if k == 1 else (inputs[index], targets[index])
            with self.micro_batch_context(index):
                with self.autocast():
                    loss = self.loss(self.forward(x), y)
                    if k > 1:
                        loss = loss / k
                scaler = self.options.grad_scaler
                (scaler.scale(loss) if scaler is not None else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        self.clip_and_update()
        assert total is not None
        return total

    def clip_and_update(self) -> None:
        scaler = self.options.grad_scaler
        if self.options.max_grad_norm:
            if scaler is not None:
                scaler.unscale_(self.optimizer)
            # error_if_nonfinite stays off: checking it reads the norm on the host.
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.options.max_grad_norm)
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
