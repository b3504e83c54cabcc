"""What a checkpoint costs a training loop: a blocking save against an asynchronous one.

    python benchmarks/checkpoint_save.py [--device cuda] [--size large] [--reps 3] [--dir FOLDER] [--json]
    python benchmarks/checkpoint_save.py --device cpu --size small      # a quick check anywhere

One process, no process group: a model of ``--size`` (large: 4 Linear layers of
8192 x 8192 in float32, 268 M parameters, about 1.07 GB; small: 512 wide, 4 MB)
trained with SGD on random batches, and cluster_kit.checkpoint saving the model
(``--optimizer adamw`` adds AdamW and its two moments: three times the bytes). Per
way of saving, ``--reps`` times after one untimed save:

* blocking (``save(step, ...)``): the step stall is the whole save (write, fsync,
  digest, commit);
* asynchronous (``save(step, async_=True, ...)``): the stall is the copy to (pinned,
  on CUDA) host memory; the write runs behind, and steps run meanwhile; its time is
  the background write; the steps it overlaps are timed against steps without.

Printed: the mean step time, each way's stall and save time (median, and the first
asynchronous save, which allocates the pinned buffers), the ratio of the stalls, and
how much slower steps run while a write is in flight. The folder (``--dir``, default
a temporary one) decides the write speed: give the job's checkpoint storage.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster_kit.checkpoint import Checkpointer

SIZES = {"large": 8192, "small": 512}
LAYERS = 4
BATCH = 64


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="large")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed steps without a save in flight")
    parser.add_argument("--dir", type=Path, help="where to save (default: a temporary folder)")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


class Training:
    """The model, its optimizer and one step on a fixed random batch."""

    def __init__(self, args: argparse.Namespace) -> None:
        width = SIZES[args.size]
        self.device = torch.device(args.device)
        self.model = nn.Sequential(*[nn.Linear(width, width) for _ in range(LAYERS)]).to(self.device)
        optimizer = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.SGD
        self.optimizer = optimizer(self.model.parameters(), lr=1e-4)
        self.batch = torch.randn(BATCH, width, device=self.device)

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.model(self.batch).square().mean().backward()
        self.optimizer.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def bytes(self) -> int:
        tensors = list(self.model.state_dict().values())
        tensors += [v for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        return sum(t.numel() * t.element_size() for t in tensors)


def step_time(training: Training, steps: int) -> float:
    """Mean seconds of a step, on the device's clock (synchronized before and after)."""
    training.sync()
    start = time.perf_counter()
    for _ in range(steps):
        training.step()
    training.sync()
    return (time.perf_counter() - start) / steps


def blocking_save(training: Training, saver: Checkpointer, step: int) -> dict[str, float]:
    training.sync()
    start = time.perf_counter()
    saver.save(step, **training.state())
    stall = time.perf_counter() - start
    return {"stall_s": stall, "save_s": stall}


def async_save(training: Training, saver: Checkpointer, step: int) -> dict[str, float]:
    """Stall, background write, and the mean step time while the write was in flight."""
    training.sync()
    start = time.perf_counter()
    saver.save(step, async_=True, **training.state())
    stall = time.perf_counter() - start
    overlapped, began = 0, time.perf_counter()
    while saver.in_flight:
        training.step()
        training.sync()
        overlapped += 1
    during = (time.perf_counter() - began) / overlapped if overlapped else float("nan")
    saver.wait()
    assert saver.write_s is not None
    return {"stall_s": stall, "save_s": saver.write_s, "step_during_s": during, "steps_during": overlapped}


def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    training = Training(args)
    for _ in range(3):
        training.step()  # warm-up; AdamW's state exists from here on
    saver = Checkpointer(str(folder), keep=2, environ={})
    step = 1
    runs: dict[str, list[dict[str, float]]] = {"blocking": [], "async": []}
    blocking_save(training, saver, step)  # untimed: first writes into a new folder
    for _ in range(args.reps):
        for way, save in (("blocking", blocking_save), ("async", async_save)):
            training.step()
            step += 1
            runs[way].append(save(training, saver, step))
    return {"device": str(training.device), "gpu": _gpu_name(training.device), "size": args.size,
            "optimizer": args.optimizer, "checkpoint_bytes": training.bytes(),
            "step_s": step_time(training, args.steps), "runs": runs, "folder": str(folder)}


def summary(result: dict[str, Any]) -> dict[str, float]:
    runs = result["runs"]
    blocking = statistics.median(r["stall_s"] for r in runs["blocking"])
    async_stalls = [r["stall_s"] for r in runs["async"]]
    steady = statistics.median(async_stalls[1:] or async_stalls)
    during = [r["step_during_s"] for r in runs["async"] if r["steps_during"]]
    return {
        "blocking_stall_s": blocking,
        "async_stall_s": steady,
        "async_first_stall_s": async_stalls[0],
        "async_write_s": statistics.median(r["save_s"] for r in runs["async"]),
        "stall_ratio": blocking / steady if steady else float("inf"),
        "step_slowdown_during_write": (statistics.median(during) / result["step_s"] - 1) if during else float("nan"),
    }


def _gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else ""


def report(result: dict[str, Any], figures: dict[str, float]) -> str:
    size = result["checkpoint_bytes"]
    shown = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
    return "\n".join([
        f"{result['size']} model + {result['optimizer']} on {result['device']} {result['gpu']}".rstrip()
        + f": {shown} a checkpoint, step {result['step_s'] * 1e3:.1f} ms, into {result['folder']}",
        f"blocking save:      step stall {figures['blocking_stall_s']:.3f} s (= the save)",
        (f"asynchronous save:  step stall {figures['async_stall_s']:.3f} s (the first, which allocates"
        f" the host buffers: {figures['async_first_stall_s']:.3f} s), background write {figures['async_write_s']:.3f} s"),
        f"stall ratio blocking / asynchronous: {figures['stall_ratio']:.1f}x",
        f"steps during the background write: {figures['step_slowdown_during_write'] * 100:+.1f} % step time",
    ])


def main(argv: list[str]) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir=args.dir) as folder:
        result = measure(args, Path(folder))
    figures = summary(result)
    print(json.dumps({**result, "summary": figures}, indent=1) if args.json else report(result, figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
