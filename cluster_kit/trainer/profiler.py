"""Step profiling and DDP variants (`clusterkit bench ddp`): what build_step and wrap_ddp
read from the environment that bench ddp's job sets."""
from __future__ import annotations

import os
from typing import Any

import torch

PROFILE_STEPS_ENV = "CLUSTERKIT_PROFILE_STEPS"
PROFILE_DIR_ENV = "CLUSTERKIT_PROFILE_DIR"
VARIANT_ENV = "CLUSTERKIT_DDP_VARIANT"
PROFILE_WAIT = 2  # DDP rebuilds its buckets after the first step: skip the first ones
PROFILE_WARMUP = 1
MAX_PROFILE_STEPS = 1000  # a trace of every step of a long run would fill the disk
_RUNNING: list[Any] = []  # the StepProfiler recording now (torch allows one per thread)


def profile_steps(environ: dict[str, str] | None = None) -> int:
    """The number of steps to record: ``CLUSTERKIT_PROFILE_STEPS`` (0 when unset)."""
    env = os.environ if environ is None else environ
    text = env.get(PROFILE_STEPS_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(
            f"{PROFILE_STEPS_ENV}={text!r} is not a number of steps; set it to e.g. 20"
        )
    return min(int(text), MAX_PROFILE_STEPS)


def trace_file_name(environ: dict[str, str] | None = None, host: str | None = None) -> str:
    """``trace-rank<R>@<host>.json``, the variant first when ``CLUSTERKIT_DDP_VARIANT`` is set.

    The host is in the name because not every PyTorch release writes it into the trace.
    """
    import socket

    env = os.environ if environ is None else environ
    rank = env.get("RANK", "0")
    node = _safe(host or env.get("SLURMD_NODENAME") or socket.gethostname())
    variant = _safe(env.get(VARIANT_ENV, "").strip())
    name = f"trace-rank{rank}@{node}.json"
    return f"{variant}.{name}" if variant else name


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-=," else "_" for c in text)


class StepProfiler:
    """Record a bounded window of training steps with the PyTorch profiler.

    ``with StepProfiler() as prof:`` around the training loop and ``prof.step()``
    after each step. With ``CLUSTERKIT_PROFILE_STEPS=N`` it skips ``wait`` steps,
    warms up for ``warmup``, records ``N`` and writes one Chrome trace per rank to
    ``CLUSTERKIT_PROFILE_DIR`` (default: the working directory); unset, it records
    nothing and costs nothing. ``path`` is the trace written (None before).
    """

    def __init__(
        self,
        steps: int | None = None,
        out_dir: str | None = None,
        wait: int = PROFILE_WAIT,
        warmup: int = PROFILE_WARMUP,
    ) -> None:
        self.steps = profile_steps() if steps is None else steps
        self.out_dir = out_dir or os.environ.get(PROFILE_DIR_ENV) or "."
        self.wait = wait
        self.warmup = warmup
        self.path: str | None = None
        self._prof: Any = None
        self._started = False  # one window per profiler

    @property
    def enabled(self) -> bool:
        return self.steps > 0

    def __enter__(self) -> StepProfiler:  # noqa: PYI034 - typing.Self needs Python 3.11
        if self.enabled and self._prof is None and not self._started:
            self._started = True
            self._prof = self._make_profiler()
            self._prof.__enter__()
            _RUNNING.append(self)
        return self

    def _make_profiler(self) -> Any:
        from torch import profiler

        activities = [profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(profiler.ProfilerActivity.CUDA)
        schedule = profiler.schedule(
            wait=self.wait, warmup=self.warmup, active=self.steps, repeat=1
        )
        return profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=self._write,
            record_shapes=True,  # collective sizes come from their input shapes
        )

    def _write(self, prof: Any) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, trace_file_name())
        prof.export_chrome_trace(path)
        self.path = path

    def step(self) -> None:
        """Mark the end of one training step; stops by itself once the trace is out."""
        if self._prof is None:
            return
        self._prof.step()
        if self.path is not None:
            self.close()

    def close(self) -> None:
        """Stop profiling (writing what a shorter run recorded)."""
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.__exit__(None, None, None)
            _RUNNING.remove(self)

    def __exit__(self, *exc: object) -> None:
        self.close()


def recording() -> bool:
    """Whether a StepProfiler records now (a script's own one around the loop wins over build_step's)."""
    return bool(_RUNNING)


def variant_kwargs(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """DDP keyword arguments of ``CLUSTERKIT_DDP_VARIANT`` (``bench ddp --sweep``).

    ``bucket_cap_mb=25``, ``gradient_as_bucket_view``, ``static_graph`` (joined with
    ``,``); ``as-is`` and ``cuda_graphs=on|off`` change no DDP argument (the job
    script sets ``CLUSTERKIT_CUDA_GRAPHS`` for the latter).
    """
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in env.get(VARIANT_ENV, "").split(","))):
        key, _, value = part.partition("=")
        if key == "bucket_cap_mb":
            try:
                out[key] = float(value) if "." in value else int(value)
            except ValueError:
                raise ValueError(f"{VARIANT_ENV}: {part!r}: bucket_cap_mb takes a number of MiB, "
                                 "e.g. bucket_cap_mb=25") from None
        elif key in ("gradient_as_bucket_view", "static_graph"):
            out[key] = value.lower() not in ("0", "false", "off")
        elif part not in ("as-is", "cuda_graphs=on", "cuda_graphs=off"):
            raise ValueError(f"{VARIANT_ENV}: unknown variant {part!r}; valid: as-is, bucket_cap_mb=N, "
                             "gradient_as_bucket_view, static_graph, cuda_graphs=on, cuda_graphs=off")
    return out
