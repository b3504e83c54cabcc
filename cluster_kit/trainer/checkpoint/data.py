"""Where the data loader is: the epoch and the index in it, so a resume goes on mid-epoch.

    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    position = checkpoint.DataPosition(sampler)
    loader = DataLoader(dataset, batch_size=32, sampler=position)
    checkpoint.load(model=model, optimizer=optimizer, data=position)
    for epoch in position.epochs(10):
        for x, y in position.batches(loader):
            ...                                        # one step
            checkpoint.save(step, model=model, optimizer=optimizer, data=position)

``DataPosition`` is itself the loader's sampler: each epoch it takes the wrapped
sampler's order (``set_epoch(epoch)`` first, as DistributedSampler wants) and yields
it from the saved index on. The index counts the samples of the batches the loop has
received through :meth:`DataPosition.batches` (not those a loader prefetched), so a
checkpoint saved after a step resumes with the next batch. Every rank of a DDP job
moves in step (DistributedSampler gives each the same number of batches), so rank 0's
position is saved and every rank loads it.

Two draws from torch's global generator would make a resumed run differ from one that
was not interrupted: a sampler without an epoch of its own (RandomSampler) drawing
its order, and the loader drawing its workers' base seed. Both happen here with that
generator forked and put back: the order is drawn from ``seed + epoch``, the same in
both runs, and training's random numbers (dropout) do not move.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch


class DataPosition(torch.utils.data.Sampler):  # type: ignore[type-arg]
    """A sampler that remembers the epoch and the samples consumed in it (``state_dict``)."""

    def __init__(self, sampler: Iterable[Any], batch_size: int | None = None, seed: int = 0) -> None:
        self.sampler = sampler
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.index = 0  # samples of this epoch the loop has received
        self._start = 0  # where this epoch's iteration begins (the loaded index)

    def __iter__(self) -> Iterator[Any]:
        if callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(self.epoch)  # type: ignore[attr-defined]
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(self.seed + self.epoch)  # the CPU one only
            order = list(self.sampler)
        start, self._start = self._start, 0
        return iter(order[start:])

    def __len__(self) -> int:
        total = len(self.sampler) if isinstance(self.sampler, Sized) else 0
        return max(0, total - self._start)

    def epochs(self, count: int) -> Iterator[int]:
        """The epochs still to run of ``count``, from the loaded one on."""
        while self.epoch < count:
            yield self.epoch

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The loader's batches of this epoch, each counted as consumed when the loop gets it.

        Once the loader is exhausted the position moves to the next epoch's start.
        """
        size = self.batch_size or getattr(loader, "batch_size", None)
        if not size:
            raise ValueError("DataPosition needs the batch size: DataPosition(sampler, batch_size=N) "
                             "when the loader has no batch_size of its own")
        self.index = self._start  # before iter(): a loader with workers takes the order at once
        with torch.random.fork_rng(devices=[]):
            iterator = iter(loader)  # draws the workers' base seed: not from training's stream
        epoch_length = len(self.sampler) if isinstance(self.sampler, Sized) else None
        for batch in iterator:
            self.index += size
            if epoch_length is not None:
                self.index = min(self.index, epoch_length)
            yield batch
        self.epoch += 1
        self.index = self._start = 0

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "index"}``: enough to go on with the next batch."""
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Go on from a saved position: the next epoch iterated starts at its index."""
        self.epoch = int(state["epoch"])
        self.index = self._start = int(state["index"])
