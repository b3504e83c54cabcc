"""What a step will be, decided before anything runs: the options checked, and why a
step runs eagerly where a graph was asked for (the optimizer, the GradScaler, the device)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cluster_kit.trainer.process_group import ENV_FLAG, is_ddp

DDP_MIN_WARMUP = 11  # PyTorch's CUDA graphs notes: DDP needs 11 eager iterations first


def describe(optimizer: torch.optim.Optimizer) -> str:
    """``AdamW(foreach)``, ``SGD(fused)``: the class and the update form it runs."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if group.get("fused"):
        form = "fused"
    elif group.get("foreach") is False:
        form = "for-loop"
    else:
        form = "foreach"
    return f"{type(optimizer).__name__}({form})"


GRAPHABLE_ADVICE = (
    "graphed steps need torch.optim.AdamW or Adam (capturable=True, fused=True is "
    "fastest) or SGD"
)


def optimizer_advice(optimizer: torch.optim.Optimizer) -> str | None:
    """Why this optimizer's step cannot be captured, naming what would work; None if it can.

    Adam-style optimizers keep their step count on the GPU only with
    ``capturable=True``; it is switched on here while their state is still empty,
    and for Adam/AdamW also over state they already have (a resumed checkpoint):
    their step counts move onto the device. SGD keeps no step count. Any other optimizer without a capturable mode keeps
    Python-side state that a replayed graph would never update.
    """
    name = type(optimizer).__name__
    groups = optimizer.param_groups
    if any("capturable" in group for group in groups):
        if isinstance(optimizer, torch.optim.Adam):
            return None  # loaded or earlier state is moved onto the device by build_step
        if optimizer.state and not all(group["capturable"] for group in groups):
            return (
                f"{name} already has state and capturable=False, so its step count "
                f"lives on the host; create it with {name}(..., capturable=True) "
                "before its first step"
            )
        return None
    if isinstance(optimizer, torch.optim.SGD):
        return None
    return f"{name} has no capturable mode, so its step cannot be replayed; {GRAPHABLE_ADVICE}"


def why_eager_for(
    optimizer: torch.optim.Optimizer, grad_scaler: Any | None = None
) -> str | None:
    """Why this optimizer (with this GradScaler) must run eagerly; None if it can be graphed."""
    advice = optimizer_advice(optimizer)
    if advice is not None:
        return advice
    scaling = grad_scaler is not None and grad_scaler.is_enabled()
    if scaling and not getattr(optimizer, "_step_supports_amp_scaling", False):
        return (
            f"GradScaler.step reads the inf/nan check back to the host before "
            f"{describe(optimizer)}.step(), which a CUDA graph cannot replay; create "
            f"it with fused=True (e.g. {type(optimizer).__name__}(..., fused=True"
            f"{', capturable=True' if 'capturable' in optimizer.param_groups[0] else ''}"
            ")) so that skipping a step on inf/nan happens on the GPU"
        )
    return None


def lr_dtype(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> torch.dtype:
    """The dtype of a captured lr tensor: float32 where a kernel reads it (fused).

    Foreach Adam computes ``1 - lr * weight_decay`` from it: in float64 that rounds as
    the plain loop's Python float does (see :meth:`HyperParams.plain_loop_division`).
    """
    foreach_adam = isinstance(optimizer, torch.optim.Adam) and not group.get("fused")
    if foreach_adam and group.get("foreach") is not False:
        return torch.float64
    return torch.float32


def reads_tensor_lr(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    """Whether this group's update reads ``lr`` from a device tensor without a sync.

    Adam/AdamW do with capturable=True or fused=True; SGD only fused (its other
    forms turn a tensor lr into a Python number, a host sync).
    """
    if isinstance(optimizer, torch.optim.Adam):
        return True
    return isinstance(optimizer, torch.optim.SGD) and bool(group.get("fused"))


@dataclass(frozen=True)
class StepOptions:
    """What :func:`~cluster_kit.trainer.step.build_step` was asked for, checked once.

    ``warmup`` eager iterations before capture (at least 11 under DDP);
    ``autocast_dtype`` runs forward and loss under autocast; ``max_grad_norm`` clips
    the total gradient norm; ``accumulation_steps=k`` makes one step k micro-batches
    (a leading dimension of size k on inputs and targets); ``grad_scaler`` scales an
    fp16 loss; ``keep_faster`` keeps a graph only where it beats the eager step;
    ``compile_options`` are ``torch.compile``'s arguments (None: not compiled).
    """

    warmup: int = DDP_MIN_WARMUP
    autocast_dtype: torch.dtype | None = None
    max_grad_norm: float | None = None
    accumulation_steps: int = 1
    grad_scaler: Any | None = None
    keep_faster: bool = False
    compile_options: dict[str, Any] | None = None

    def check(self, model: nn.Module, example_batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        """ValueError naming the fix for an option the step cannot take."""
        if self.warmup < 1:
            raise ValueError("warmup must be at least 1 iteration")
        if is_ddp(model) and self.warmup < DDP_MIN_WARMUP:
            raise ValueError(
                f"DDP needs at least {DDP_MIN_WARMUP} eager warm-up iterations before "
                f"capture (got warmup={self.warmup}); use warmup={DDP_MIN_WARMUP}"
            )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(
                f"max_grad_norm must be > 0 (got {self.max_grad_norm}); "
                "max_grad_norm=None turns clipping off"
            )
        if self.autocast_dtype not in (None, torch.bfloat16, torch.float16):
            raise ValueError(
                f"autocast_dtype must be torch.bfloat16 or torch.float16 (got "
                f"{self.autocast_dtype})"
            )
        if not isinstance(self.accumulation_steps, int) or self.accumulation_steps < 1:
            raise ValueError(
                f"accumulation_steps must be an integer >= 1 (got {self.accumulation_steps!r})"
            )
        self.check_micro_batches(*example_batch, what="example_batch")

    def check_micro_batches(self, inputs: torch.Tensor, targets: torch.Tensor, what: str) -> None:
        k = self.accumulation_steps
        if k == 1:
            return
        for name, tensor in (("inputs", inputs), ("targets", targets)):
            if tensor.dim() == 0 or tensor.shape[0] != k:
                raise ValueError(
                    f"{what} {name} have shape {tuple(tensor.shape)}, but "
                    f"accumulation_steps={k} needs a leading micro-batch dimension of "
                    f"{k}: stack the micro-batches, e.g. x.view({k}, -1, *x.shape[1:])"
                )


def why_not_graphed(enabled: bool, device: torch.device, optimizer: torch.optim.Optimizer,
                    grad_scaler: Any | None) -> str | None:
    """Why the step runs eagerly although a graph may be asked for; None when it may be captured."""
    if not enabled:
        return f"CUDA graphs not requested ({ENV_FLAG} is not 1)"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if device.type != "cuda":
        return f"the model is on {device}, not on a CUDA device"
    return why_eager_for(optimizer, grad_scaler)
