"""The whole step captured as one CUDA graph, replayed on each batch of the captured shape.

Following PyTorch's CUDA graphs notes: ``warmup`` eager iterations first, on the same
side stream DDP was built on and the graph is captured on; gradients set to ``None``
before capture, so the captured backward writes them fresh on every replay; every
batch ``copy_``-ed into static tensors and the loss read from a static output; Adam-
style optimizers made ``capturable`` (their step counts moved onto the device).
"""
from __future__ import annotations

from typing import Any

import torch

from cluster_kit.trainer.process_group import capture_stream
from cluster_kit.trainer.step.hyperparams import HyperParams
from cluster_kit.trainer.step.loop import Batch, PlainLoop
from cluster_kit.trainer.step.snapshot import steps_onto_devices


class Capture:
    """The graph of one :class:`PlainLoop` step, its static tensors, and what capture changed."""

    def __init__(self, loop: PlainLoop) -> None:
        self.loop = loop
        self.hyper = HyperParams(loop.optimizer, loop.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: torch.Tensor | None = None
        self.static_targets: torch.Tensor | None = None
        self.static_loss: torch.Tensor | None = None
        self.static_grad_norm: torch.Tensor | None = None  # what the graph writes
        self._made_capturable: list[dict[str, Any]] = []
        self._moved_steps: list[tuple[dict[str, Any], torch.Tensor]] = []

    def record(self, example_batch: Batch) -> None:
        """Make the optimizer capturable and capture the step, its lr read from tensors
        (:class:`HyperParams`); raises what capture raised."""
        try:
            self._prepare_optimizer()
            self.hyper.install()
            with self.hyper.plain_loop_division():
                self._capture(example_batch)
        finally:
            self.hyper.uninstall()

    def _prepare_optimizer(self) -> None:
        """Adam-style optimizers keep their step count on the GPU only when capturable.

        State an Adam/AdamW already has (``load_state_dict`` of a checkpoint saved
        by a plain optimizer) keeps its step counts on the host: they move onto
        their parameter's device, as a capturable Adam keeps them.
        """
        optimizer = self.loop.optimizer
        for group in optimizer.param_groups:
            if "capturable" in group and not group["capturable"]:
                if optimizer.state and not isinstance(optimizer, torch.optim.Adam):
                    raise RuntimeError(
                        "the optimizer has state and capturable=False; create it with "
                        "capturable=True (e.g. AdamW(..., capturable=True))"
                    )
                self._moved_steps += steps_onto_devices(optimizer, group)
                group["capturable"] = True
                self._made_capturable.append(group)

    def _capture(self, example_batch: Batch) -> None:
        loop, device = self.loop, self.loop.device
        inputs, targets = example_batch
        self.static_inputs = inputs.detach().to(device, copy=True)
        self.static_targets = targets.detach().to(device, copy=True)
        side = capture_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        loop.capturing = True
        try:
            with torch.cuda.stream(side):
                for _ in range(loop.options.warmup):
                    loop.optimizer.zero_grad(set_to_none=True)
                    loop.train_step(self.static_inputs, self.static_targets)
            torch.cuda.current_stream(device).wait_stream(side)
            # Grads must be None so that the captured backward allocates and writes them.
            loop.optimizer.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                self.static_loss = loop.train_step(self.static_inputs, self.static_targets)
            self.static_grad_norm = loop.grad_norm
        finally:
            loop.capturing = False
        self.graph = graph

    def drop(self) -> None:
        """Back to the optimizer and tensors of the plain loop; the graph's memory goes."""
        self.graph = None
        self.static_inputs = self.static_targets = self.static_loss = None
        self.loop.grad_norm = self.static_grad_norm = None
        for group in self._made_capturable:
            group["capturable"] = False
        self._made_capturable = []
        for state, host_step in self._moved_steps:
            host_step.copy_(state["step"])
            state["step"] = host_step
        self._moved_steps = []
        self.loop.optimizer.zero_grad(set_to_none=True)

    def fits(self, inputs: torch.Tensor, targets: torch.Tensor) -> bool:
        """Whether the batch has the captured shapes."""
        assert self.static_inputs is not None and self.static_targets is not None
        return inputs.shape == self.static_inputs.shape and targets.shape == self.static_targets.shape

    def replay(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One step from the graph on this batch: its loss (a new tensor)."""
        assert self.graph is not None and self.static_loss is not None
        assert self.static_inputs is not None and self.static_targets is not None
        self.hyper.apply()
        self.static_inputs.copy_(inputs, non_blocking=True)
        self.static_targets.copy_(targets, non_blocking=True)
        self.loop.grad_norm = self.static_grad_norm
        self.graph.replay()
        # A replay is an optimizer step: LR schedulers look for one before theirs.
        self.loop.optimizer._opt_called = True  # type: ignore[attr-defined]
        return self.static_loss.clone()
