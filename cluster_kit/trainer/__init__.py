"""What a training script imports, and the one contract it shares with its supervisor.

Stdlib and torch only, and itself: on a node where clusterkit is not installed, the
checkout's (or the job's) folder on ``sys.path`` is all the trainer needs, and each
module, its state included, exists once however it is reached (``cluster_kit.ddp`` and
``cluster_kit.checkpoint``, the public import paths, only re-export it).

| module | what |
| --- | --- |
| :mod:`.contract` | the control folder's files and the environment the supervisor hands the ranks (stdlib) |
| :mod:`.supervision` | heartbeat, stop signal, dump responder, crash files (stdlib) |
| :mod:`.process_group` | DDP wrapping on the capture stream, the process group's settings |
| :mod:`.step` | ``build_step``: the plan, the plain loop, compile, capture, the keep-faster trial |
| :mod:`.profiler` | ``StepProfiler`` and the DDP variants of ``bench ddp`` |
| :mod:`.checkpoint` | checkpoints: whole, verified, fenced; its stdlib part read by the supervisor |
| :mod:`.compile_options`, :mod:`.trust` | ``compile=``'s rules; what is trusted on disk (stdlib) |

Importing this package imports nothing: the supervisor and the CLI reach the stdlib
modules without loading torch.
"""

__all__ = ["checkpoint", "compile_options", "contract", "process_group", "profiler", "step", "supervision",
           "trust"]
