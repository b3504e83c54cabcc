"""What every GPU test module shares: one NCCL process group of world size 1 on GPU 0."""
from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def nccl_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Set up for each module's tests (they skip before it without a CUDA GPU)."""
    import torch
    import torch.distributed as dist

    from cluster_kit import ddp

    ddp.prepare_process_group_env(enabled=True)
    torch.cuda.set_device(0)
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group(
        "nccl",
        init_method=f"file://{store}",
        rank=0,
        world_size=1,
        device_id=torch.device("cuda", 0),
    )
    yield
    dist.destroy_process_group()
