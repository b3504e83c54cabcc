"""The optimizer hyper-parameters a captured step reads, kept honest between replays."""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from cluster_kit.trainer.step.plan import (
    GRAPHABLE_ADVICE,
    describe,
    lr_dtype,
    reads_tensor_lr,
)

# Keys that LR schedulers keep for themselves: no optimizer update reads them.
SCHEDULER_KEYS = frozenset(
    {
        "params",
        "lr",
        "initial_lr",
        "max_lr",
        "min_lr",
        "base_lr",
        "base_momentum",
        "max_momentum",
        "name",
    }
)


class HyperParams:
    """The optimizer hyper-parameters a captured step reads, kept honest between replays.

    :meth:`install` (before warm-up) turns each group's ``lr`` into a 0-dim device
    tensor where the update reads lr from a tensor, so the captured kernels read
    whatever it holds; :meth:`uninstall` (after capture) puts the group's own
    value back, so LR schedulers and logging see floats as always. :meth:`apply`
    (before each replay) copies the group's current lr into that tensor: an LR
    scheduler's ``step()`` and ``group["lr"] = x`` both take effect on the next
    step. Every other hyper-parameter is baked into the captured kernels; a
    change to one (or to an lr held as a Python number) is refused with a
    ValueError that says what to do, never silently ignored.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.device = device
        self._tensors: list[torch.Tensor | None] = []
        self._own: list[Any] = []
        self._last: list[Any] = []
        self._frozen: list[list[tuple[str, Any]]] = []
        self._reciprocals: list[torch.Tensor | None] = []

    def install(self) -> None:
        """Give every group whose update can read it a device tensor lr."""
        for group in self.optimizer.param_groups:
            lr = group["lr"]
            tensor = None
            if reads_tensor_lr(self.optimizer, group):
                if torch.is_tensor(lr):  # the dtype the plain loop computes with
                    tensor = lr.detach().to(self.device, copy=True)
                else:
                    tensor = torch.tensor(
                        float(lr),
                        dtype=lr_dtype(self.optimizer, group),
                        device=self.device,
                    )
                group["lr"] = tensor
            self._tensors.append(tensor)
            self._reciprocals.append(
                None
                if tensor is None or torch.is_tensor(lr) or tensor.dtype != torch.float64
                else torch.tensor(1.0 / float(lr), dtype=torch.float32, device=self.device)
            )
            self._own.append(lr)
            self._last.append(lr)
            self._frozen.append(
                [(k, v) for k, v in group.items() if k not in SCHEDULER_KEYS]
            )

    def uninstall(self) -> None:
        """Put each group's own lr back (the graph keeps reading its tensor)."""
        for group, own in zip(self.optimizer.param_groups, self._own):
            group["lr"] = own

    def apply(self) -> None:
        """Bring the captured lr tensors up to date; refuse changes a replay would ignore."""
        groups = self.optimizer.param_groups
        if len(groups) != len(self._tensors):
            raise ValueError(
                f"the optimizer has {len(groups)} param groups, the captured step "
                f"{len(self._tensors)}; add param groups before build_step, or build "
                "the step again"
            )
        for index, group in enumerate(groups):
            self._apply_lr(index, group)
            for key, captured in self._frozen[index]:
                now = group.get(key)
                if now is not captured and not same_value(now, captured):
                    raise ValueError(self._frozen_message(index, key, captured, now))

    def _apply_lr(self, index: int, group: dict[str, Any]) -> None:
        lr, tensor = group["lr"], self._tensors[index]
        if torch.is_tensor(lr):
            if tensor is None:
                raise ValueError(self._float_lr_message(index, self._last[index], lr))
            if lr is not tensor:
                tensor.copy_(lr)
                self._fill_reciprocal(index, 1.0 / lr)
            return
        last = self._last[index]
        if not torch.is_tensor(last) and lr == last:
            return
        if tensor is None:
            raise ValueError(self._float_lr_message(index, last, lr))
        tensor.fill_(lr)
        self._fill_reciprocal(index, 1.0 / lr if lr else float("inf"))
        self._last[index] = lr

    def _fill_reciprocal(self, index: int, value: Any) -> None:
        reciprocal = self._reciprocals[index]
        if reciprocal is not None:
            if torch.is_tensor(value):
                reciprocal.copy_(value)
            else:
                reciprocal.fill_(value)

    @contextlib.contextmanager
    def plain_loop_division(self) -> Any:
        """While capturing: foreach Adam's division by lr, done as the plain loop does it.

        With a Python float lr, capturable foreach Adam's ``_foreach_div_(x, lr)``
        computes ``x * float32(1 / lr)``; with a tensor lr it divides, which differs in
        the last bit. Adam turns such bits into lr-sized steps of parameters whose
        gradient is noise (a bias before BatchNorm), so the graph multiplies by a
        float32 reciprocal kept beside the lr tensor instead.
        """
        pairs = {
            id(t): r for t, r in zip(self._tensors, self._reciprocals) if r is not None
        }
        real = torch._foreach_div_

        def divide(tensors: Any, other: Any, *args: Any, **kwargs: Any) -> Any:
            reciprocal = pairs.get(id(other)) if torch.is_tensor(other) else None
            if reciprocal is None or args or kwargs:
                return real(tensors, other, *args, **kwargs)
            return torch._foreach_mul_(tensors, reciprocal)

        torch._foreach_div_ = divide  # type: ignore[assignment]
        try:
            yield
        finally:
            torch._foreach_div_ = real  # type: ignore[assignment]

    def _float_lr_message(self, index: int, old: Any, new: Any) -> str:
        name = describe(self.optimizer)
        fix = (
            "create it with SGD(..., fused=True), whose update reads lr from a tensor"
            if isinstance(self.optimizer, torch.optim.SGD)
            else GRAPHABLE_ADVICE
        )
        return (
            f"param_groups[{index}]['lr'] changed from {old} to {new} after capture, "
            f"but {name} reads lr as a Python number inside the captured step, so a "
            f"replay would keep {old}; {fix}, or build the step with enabled=False"
        )

    @staticmethod
    def _frozen_message(index: int, key: str, old: Any, new: Any) -> str:
        return (
            f"param_groups[{index}][{key!r}] changed from {old!r} to {new!r} after "
            f"capture; the captured step keeps {old!r} (only lr follows changes "
            "between replays): set it before build_step, or build the step again "
            "after changing it"
        )


def same_value(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values are different values
        return False
