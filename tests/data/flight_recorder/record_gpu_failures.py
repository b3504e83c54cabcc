"""Record real failures of one supervised rank on a GPU machine (a developer tool).

    python tests/data/flight_recorder/record_gpu_failures.py SCENARIO

run with RANK=0, WORLD_SIZE=1, MASTER_ADDR/MASTER_PORT, CLUSTERKIT_CONTROL_DIR and
TORCH_FR_BUFFER_SIZE set, as the supervisor starts a rank, and with
TORCH_NCCL_DUMP_ON_TIMEOUT=1 and TORCH_FR_DUMP_TEMP_FILE=$CLUSTERKIT_CONTROL_DIR/nccl-dumps/rank-
(that folder made 0700 first). Scenarios:

* ``nccl-timeout``: an all-reduce queued behind about 30 s of GPU spin, with a
  process-group timeout of 5 s: NCCL's watchdog times it out, dumps the Flight
  Recorder where TORCH_FR_DUMP_TEMP_FILE says and aborts the process;
* ``cuda-oom``: a tensor larger than the GPU, from ``build_buffer``;
* ``device-assert``: an index out of range on the GPU, in ``gather_rows``.
"""
from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist

from cluster_kit.trainer import supervision


def wait_for_peer(x: torch.Tensor) -> None:
    torch.cuda._sleep(int(60e9))  # the GPU is busy: the all-reduce cannot start
    dist.all_reduce(x)
    torch.cuda.synchronize()


def build_buffer() -> torch.Tensor:
    total = torch.cuda.get_device_properties(0).total_memory
    return torch.empty(2 * total, dtype=torch.uint8, device="cuda")


def gather_rows(x: torch.Tensor) -> float:
    index = torch.tensor([x.shape[0] + 5], device="cuda")
    return float(x[index].sum().item())


def main(scenario: str) -> int:
    supervision.enable_supervision()
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=5), device_id=torch.device("cuda:0"))
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
        supervision.heartbeat()
    torch.cuda.synchronize()
    if scenario == "nccl-timeout":
        wait_for_peer(x)
    elif scenario == "cuda-oom":
        build_buffer()
    elif scenario == "device-assert":
        gather_rows(x)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
