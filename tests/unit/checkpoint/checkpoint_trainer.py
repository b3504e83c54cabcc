"""A small training setup the checkpoint tests share: real torch on the CPU.

Imported by the test modules after their ``pytest.importorskip("torch")``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class Trainer:
    """A model with dropout, AdamW, a LambdaLR schedule and a GradScaler, trained on seeded batches."""

    model: Any
    optimizer: Any
    scheduler: Any
    scaler: Any

    def objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler,
                "scaler": self.scaler}

    def step(self, step: int) -> None:
        """One step on the batch of ``step`` (its own seed); dropout draws from the global generator."""
        generator = torch.Generator().manual_seed(1000 + step)
        inputs, targets = torch.randn(16, 8, generator=generator), torch.randn(16, 1, generator=generator)
        self.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(self.model(inputs), targets)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()

    def weights(self) -> list[Any]:
        return [p.detach().clone() for p in self.model.parameters()]


def make_trainer(seed: int = 0, **adam: Any) -> Trainer:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, **adam)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.9 ** s)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    return Trainer(model, optimizer, scheduler, scaler)
