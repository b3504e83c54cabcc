"""The public import path of training scripts: ``from cluster_kit import ddp``.

Every name is the trainer's own (:mod:`cluster_kit.trainer`), re-exported: a whole DDP
training step from one CUDA graph (:func:`build_step`, with Inductor's kernels inside
it when asked), DDP built for capture (:func:`wrap_ddp`), the step profiler of
``bench ddp``, and the calls a supervised job's ranks make (:func:`heartbeat`,
:func:`stop_requested`, :func:`paused`, :func:`finished`). Guides: docs/guide-cuda-graphs.md
and docs/guide-resilience.md.
"""
from __future__ import annotations

from cluster_kit.trainer.compile_options import ENV_COMPILE, compile_options
from cluster_kit.trainer.compile_options import options_from_env as compile_requested
from cluster_kit.trainer.process_group import (
    ENV_FLAG,
    capture_stream,
    graphs_requested,
    module_device,
    prepare_process_group_env,
    wrap_ddp,
)
from cluster_kit.trainer.profiler import (
    MAX_PROFILE_STEPS,
    PROFILE_DIR_ENV,
    PROFILE_STEPS_ENV,
    PROFILE_WAIT,
    PROFILE_WARMUP,
    VARIANT_ENV,
    StepProfiler,
    profile_steps,
    trace_file_name,
    variant_kwargs,
)
from cluster_kit.trainer.step import (
    Batch,
    GraphedStep,
    LossFn,
    TrainingStep,
    build_step,
)
from cluster_kit.trainer.step.compile import (
    INDUCTOR_CACHE_ENV,
    compile_model,
    compile_target,
    private_compile_cache,
    repeated_blocks,
)
from cluster_kit.trainer.step.hyperparams import SCHEDULER_KEYS, HyperParams
from cluster_kit.trainer.step.plan import (
    DDP_MIN_WARMUP,
    GRAPHABLE_ADVICE,
    optimizer_advice,
    why_eager_for,
)
from cluster_kit.trainer.step.trial import TRIAL_STEPS, TRIAL_WARMUP
from cluster_kit.trainer.supervision import (
    enable_supervision,
    finished,
    heartbeat,
    paused,
    stop_requested,
)

__all__ = ["DDP_MIN_WARMUP", "ENV_COMPILE", "ENV_FLAG", "GRAPHABLE_ADVICE", "INDUCTOR_CACHE_ENV", "MAX_PROFILE_STEPS",
           "PROFILE_DIR_ENV", "PROFILE_STEPS_ENV", "PROFILE_WAIT", "PROFILE_WARMUP", "SCHEDULER_KEYS", "TRIAL_STEPS",
           "TRIAL_WARMUP", "VARIANT_ENV", "Batch", "GraphedStep", "HyperParams", "LossFn", "StepProfiler",
           "TrainingStep", "build_step", "capture_stream", "compile_model", "compile_options", "compile_requested",
           "compile_target", "enable_supervision", "finished", "graphs_requested", "heartbeat", "module_device",
           "optimizer_advice", "paused", "prepare_process_group_env", "private_compile_cache", "profile_steps",
           "repeated_blocks", "stop_requested", "trace_file_name", "variant_kwargs", "why_eager_for", "wrap_ddp"]
