"""The data position (checkpoint.DataPosition): a resume goes on with the next batch, mid-epoch."""
from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    RandomSampler,
    TensorDataset,
)

from cluster_kit.checkpoint import DataPosition

DATASET = TensorDataset(torch.arange(22))


def loader_of(position: DataPosition, batch_size: int = 4) -> DataLoader[Any]:
    return DataLoader(DATASET, batch_size=batch_size, sampler=position)


def run(position: DataPosition, epochs: int, stop_after: int | None = None) -> tuple[list[list[int]], dict[str, int]]:
    """The batches seen (as lists of indices) and the position after ``stop_after`` of them."""
    seen: list[list[int]] = []
    loader = loader_of(position)
    for _ in position.epochs(epochs):
        for (batch,) in position.batches(loader):
            seen.append(batch.tolist())
            if len(seen) == stop_after:
                return seen, position.state_dict()
    return seen, position.state_dict()


@pytest.mark.parametrize("stop_after", [1, 3, 5, 6, 7, 11])
def test_a_resume_mid_epoch_goes_on_with_the_next_batch(stop_after: int) -> None:
    def sampler() -> DistributedSampler[Any]:
        return DistributedSampler(DATASET, num_replicas=2, rank=1, shuffle=True, seed=3)

    clean, end = run(DataPosition(sampler()), epochs=3)
    assert len(clean) == 3 * 3 and end == {"epoch": 3, "index": 0}  # 11 samples a rank: batches 4, 4, 3
    first, saved = run(DataPosition(sampler()), epochs=3, stop_after=stop_after)
    resumed = DataPosition(sampler())
    resumed.load_state_dict(saved)
    rest, _ = run(resumed, epochs=3)
    assert first + rest == clean


def test_the_position_counts_what_the_loop_received_not_what_the_loader_fetched() -> None:
    position = DataPosition(DistributedSampler(DATASET, num_replicas=1, rank=0, shuffle=False))
    loader = DataLoader(DATASET, batch_size=4, sampler=position, num_workers=1, prefetch_factor=4)
    batches = position.batches(loader)
    next(batches)
    assert position.state_dict() == {"epoch": 0, "index": 4}
    next(batches)
    assert position.state_dict() == {"epoch": 0, "index": 8}
    batches.close()


def test_an_epoch_read_to_its_end_resumes_at_the_next_one() -> None:
    position = DataPosition(DistributedSampler(DATASET, num_replicas=1, rank=0, shuffle=True), batch_size=4)
    _, state = run(position, epochs=2, stop_after=6)  # the last batch of epoch 0 (22 = 5 * 4 + 2)
    assert state == {"epoch": 0, "index": 22}
    resumed = DataPosition(DistributedSampler(DATASET, num_replicas=1, rank=0, shuffle=True))
    resumed.load_state_dict(state)
    rest, _ = run(resumed, epochs=2)
    assert len(rest) == 6 and sorted(i for b in rest for i in b) == list(range(22))


def test_a_random_sampler_gets_an_order_per_epoch_without_moving_trainings_generator() -> None:
    torch.manual_seed(0)
    expected_draw = torch.rand(1)
    torch.manual_seed(0)
    first, _ = run(DataPosition(RandomSampler(DATASET), seed=1), epochs=2)
    assert torch.equal(torch.rand(1), expected_draw)  # dropout would draw exactly as without the loader
    torch.manual_seed(12345)
    second, _ = run(DataPosition(RandomSampler(DATASET), seed=1), epochs=2)
    assert first == second and first[:6] != first[6:]  # the same orders, another one per epoch


def test_a_loader_without_a_batch_size_needs_one_given() -> None:
    position = DataPosition(range(8))
    loader = DataLoader(DATASET, batch_sampler=[[0, 1], [2, 3]])
    with pytest.raises(ValueError, match=r"DataPosition\(sampler, batch_size=N\)"):
        next(position.batches(loader))
    sized = DataPosition(range(8), batch_size=2)
    assert [b[0].tolist() for b in sized.batches(loader)] == [[0, 1], [2, 3]]
    assert sized.state_dict() == {"epoch": 1, "index": 0}
