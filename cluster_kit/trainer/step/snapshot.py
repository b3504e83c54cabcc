"""What warm-up, capture and the keep-faster trial change, taken before and put back after:
the model's and optimizer's state, the GradScaler, the random number generators, and
Adam's step counts moved onto the device for capture."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Snapshot:
    """Model and optimizer state taken before warm-up, restored in place after it."""

    def __init__(
        self, model: dict[str, torch.Tensor], optimizer: dict[int, dict[str, Any]]
    ) -> None:
        self.model = model
        self.optimizer = optimizer

    @classmethod
    def take(cls, model: nn.Module, optimizer: torch.optim.Optimizer) -> Snapshot:
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        state = {
            id(p): {
                k: v.detach().clone() if torch.is_tensor(v) else v for k, v in s.items()
            }
            for p, s in optimizer.state.items()
        }
        return cls(weights, state)

    def restore(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, keep_new_state: bool
    ) -> None:
        """Copy the saved values back into the live tensors.

        State that warm-up created lazily is zeroed in place when a captured graph
        points at it (``keep_new_state``): Adam's and momentum SGD's fresh state is
        zeros. Otherwise it is dropped, so eager steps re-create it as usual.
        """
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                tensor.copy_(self.model[name])
            for param in list(optimizer.state.keys()):
                self._restore_param_state(optimizer, param, keep_new_state)

    def _restore_param_state(
        self, optimizer: torch.optim.Optimizer, param: Any, keep_new_state: bool
    ) -> None:
        live = optimizer.state[param]
        saved = self.optimizer.get(id(param))
        if saved is None and not keep_new_state:
            del optimizer.state[param]
            return
        for key, value in live.items():
            old = None if saved is None else saved.get(key)
            if torch.is_tensor(value) and old is not None:
                value.copy_(old)
            elif torch.is_tensor(value):
                value.zero_()
            elif saved is not None and key in saved:
                live[key] = old


def save_scaler(scaler: Any | None) -> dict[str, torch.Tensor] | None:
    """A GradScaler's scale and growth tracker, if it has made them yet."""
    if scaler is None or getattr(scaler, "_scale", None) is None:
        return None
    return {
        "_scale": scaler._scale.detach().clone(),
        "_growth_tracker": scaler._growth_tracker.detach().clone(),
    }


def restore_scaler(scaler: Any | None, saved: dict[str, torch.Tensor] | None) -> None:
    """Undo what warm-up did to the scaler, in place (a graph points at its tensors)."""
    if scaler is None or getattr(scaler, "_scale", None) is None:
        return
    with torch.no_grad():
        if saved is not None:
            scaler._scale.copy_(saved["_scale"])
            scaler._growth_tracker.copy_(saved["_growth_tracker"])
        else:
            scaler._scale.fill_(scaler._init_scale)
            scaler._growth_tracker.fill_(scaler._init_growth_tracker)


class RngState:
    """The CPU and the device's random number generators, put back after trial steps."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def steps_onto_devices(
    optimizer: torch.optim.Optimizer, group: dict[str, Any]
) -> list[tuple[dict[str, Any], torch.Tensor]]:
    """Move each host-side ``step`` of this group's state onto its parameter's device.

    Returns (state, host tensor) pairs, so that dropping the graph can put them back.
    """
    moved = []
    for param in group["params"]:
        state = optimizer.state.get(param, {})
        step = state.get("step")
        if torch.is_tensor(step) and step.device != param.device:
            state["step"] = step.to(param.device, copy=True)
            moved.append((state, step))
        elif step is not None and not torch.is_tensor(step):
            state["step"] = torch.tensor(float(step), device=param.device)
    return moved
