"""Inductor's kernels inside the step: what a compiled step hands Inductor, each repeated
block compiled once, and a compile cache folder nobody else can write."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cluster_kit.trainer.process_group import is_ddp, log_once
from cluster_kit.trainer.step.loop import Batch, PlainLoop
from cluster_kit.trainer.step.snapshot import RngState
from cluster_kit.trainer.step.trial import all_ranks_agree, first_line
from cluster_kit.trainer.trust import problem

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def private_compile_cache(environ: Any = None, default: str | None = None) -> str | None:
    """Make sure Inductor compiles into a folder nobody else can write; a warning, or None.

    Inductor loads the code it compiled from its cache folder, ``TORCHINDUCTOR_CACHE_DIR``
    or else ``/tmp/torchinductor_<user>``: on a node shared with other users, whoever
    made that folder first, or can write it, would have the job run their code. That
    folder is used only when it is a real folder of this user that group and others
    cannot write (made so, mode 0700, when missing). Otherwise a new private folder in
    the temporary folder takes its place, starting empty, and the returned warning
    says why and what to do. Either way the folder used is exported in
    ``TORCHINDUCTOR_CACHE_DIR`` (of ``environ``, default ``os.environ``), which
    Inductor reads whenever it compiles; Triton's kernels go inside it unless
    ``TRITON_CACHE_DIR`` says otherwise.
    """
    import getpass
    import tempfile

    env = os.environ if environ is None else environ
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid without an account, as torch names it then
        user = f"uid_{os.getuid()}"
    path = os.path.abspath(env.get(INDUCTOR_CACHE_ENV) or default
                           or os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"))
    try:
        try:
            os.makedirs(path, mode=0o700)
        except FileExistsError:
            pass
        why = problem(os.lstat(path), "folder")
    except OSError as exc:
        why = f"cannot be made or read ({exc.strerror})"
    if why is None:
        env[INDUCTOR_CACHE_ENV] = path
        return None
    env[INDUCTOR_CACHE_ENV] = tempfile.mkdtemp(prefix=f"torchinductor_{user}_")
    return (
        f"Inductor's cache folder {path} {why}: compiling into the new private folder "
        f"{env[INDUCTOR_CACHE_ENV]} instead (it starts empty, so this compile takes its full "
        f"time); remove {path} (or have its owner remove it), or set {INDUCTOR_CACHE_ENV} "
        "to a folder only you can write"
    )


def compile_target(model: nn.Module) -> nn.Module:
    """What a compiled step hands Inductor: ``model``, or on one rank the module DDP wraps.

    DDP over a process group of one rank all-reduces every gradient with itself and
    divides it by 1: two passes over all gradients that change nothing. Compiled, it
    costs more: dynamo splits the model at DDP's buckets so that each bucket's
    all-reduce can start while backward goes on, which stops Inductor's fusion at
    every split and compiles one graph per bucket, with no other rank to overlap
    with. So on one rank the step compiles and runs ``model.module`` (calling it
    directly leaves DDP's gradient hooks idle), unless the DDP has a communication
    hook or DDP's mixed precision: those change the gradients even on one rank.
    """
    if not is_ddp(model):
        return model
    group = getattr(model, "process_group", None)
    if group is None or group.size() != 1 or getattr(model, "mixed_precision", None) is not None:
        return model
    try:
        hooked = bool(getattr(model, "_comm_hooks", None)) or bool(
            model._get_ddp_logging_data().get("comm_hook")  # type: ignore[operator]
        )
    except Exception:  # noqa: BLE001 - a DDP this torch describes otherwise: keep it
        hooked = True
    return model if hooked else model.module  # type: ignore[return-value]


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The longest run of blocks of one class in one ``nn.ModuleList`` or ``nn.Sequential``.

    Blocks are modules with modules of their own (a transformer's layers, not a
    Sequential's Linear layers); fewer than two: none (``[]``).
    """
    best: list[nn.Module] = []
    for module in model.modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.children())
        kind = type(children[0]) if children else None
        if (len(children) >= 2 and len(children) > len(best)
                and all(type(child) is kind for child in children)
                and not isinstance(children[0], (nn.ModuleList, nn.Sequential))
                and next(children[0].children(), None) is not None):
            best = children
    return best


class Regions:
    """Each repeated block's forward compiled once, opaque to the compile around it.

    Inside the context every block's ``forward`` is the compiled one behind
    ``torch.compiler.disable``: the compiled model around the blocks breaks its
    graph at each of them instead of tracing all of them again, and dynamo reuses
    one compiled block for all (their code is the same; the parameters are inputs).
    The same function objects come back every time, so dynamo's guards on them hold.
    Outside it the model is as it was (a copy of it, or a call outside the step,
    runs its own forward).
    """

    def __init__(self, blocks: list[nn.Module], options: dict[str, Any]) -> None:
        self.forwards: dict[nn.Module, Callable[..., Any]] = {}
        for block in blocks:
            compiled = torch.compile(block.forward, **options)

            def forward(*args: Any, _compiled: Callable[..., Any] = compiled, **kwargs: Any) -> Any:
                return _compiled(*args, **kwargs)

            self.forwards[block] = torch.compiler.disable(forward, recursive=False)
        # Per entry, what each block had as a forward of its own (not its class's),
        # put back on exit; a stack, so that an entry inside another undoes only itself.
        self._saved: list[dict[nn.Module, Any]] = []

    def __enter__(self) -> None:
        self._saved.append({block: vars(block).get("forward") for block in self.forwards})
        for block, forward in self.forwards.items():
            block.forward = forward  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        for block, own in self._saved.pop().items():
            if own is None:
                vars(block).pop("forward", None)
            else:
                block.forward = own  # type: ignore[method-assign]


def compile_model(model: nn.Module, **options: Any) -> Callable[..., Any]:
    """The model as a compiled step runs it: Inductor's kernels for all of it, each block compiled once.

    Compiles :func:`compile_target` (``model``, or on one rank the module DDP
    wraps) with ``torch.compile(**options)``. Where the model repeats a block
    (:func:`repeated_blocks`: a transformer's layers) the block is compiled once and
    used for all of them, and the rest of the model is compiled around them: what
    is compiled does not grow with the number of blocks, and a captured step
    replays the graph breaks at the blocks at no cost. ``fullgraph=True``
    compiles the model as one graph (a graph break is then an error). The plain
    loop that a compiled step computes exactly calls this in the model's place.
    """
    target = compile_target(model)
    compiled = torch.compile(target, **options)
    blocks = [] if options.get("fullgraph") else repeated_blocks(target)
    if not blocks:
        return compiled
    regions = Regions(blocks, options)

    def forward(*args: Any, **kwargs: Any) -> Any:
        with regions:
            return compiled(*args, **kwargs)

    return forward


def compile_loop(loop: PlainLoop, example_batch: Batch, options: dict[str, Any]) -> str | None:
    """Compile the loop's model and loss with Inductor and run them once; None, or why not.

    Compiling happens at the first call, so a failure shows here, before warm-up,
    and every rank learns whether all compiled: all run the same kernels' kind.
    """
    loop.compiled = True  # the first pass compiles under the autocast of compiled steps
    error: str | None = None
    warning = private_compile_cache()
    if warning:
        log_once(logging.WARNING, warning)
    try:
        loop.forward = compile_model(loop.model, **options)
        loop.loss = torch.compile(loop.loss_fn, **options)
        first_compiled_pass(loop, example_batch)
    except Exception as exc:  # noqa: BLE001 - any compile failure means: the model's own kernels
        error = f"torch.compile failed: {type(exc).__name__}: {first_line(exc)}"
    if all_ranks_agree(error is None, loop.device):
        return None
    loop.compiled = False
    loop.forward, loop.loss = loop.model, loop.loss_fn
    reason = f"{error or 'torch.compile failed on another rank'}; steps run the model's own kernels"
    log_once(logging.WARNING, f"Inductor off: {reason}")
    return reason


def first_compiled_pass(loop: PlainLoop, example_batch: Batch) -> None:
    """Forward, loss and backward of one micro-batch, undone: Inductor compiles here.

    Under DDP ``no_sync()``, so no all-reduce waits on a rank whose compile
    failed. Gradients, buffers (BatchNorm's statistics) and random number
    generators are put back as they were.
    """
    inputs, targets = (t.to(loop.device) for t in example_batch)
    if loop.options.accumulation_steps > 1:
        inputs, targets = inputs[0], targets[0]
    grads = [p.grad for p in loop.params]
    buffers = [(b, b.detach().clone()) for b in loop.model.buffers()]
    rng = RngState(loop.device)
    try:
        with loop.on_eager_stream(), loop.no_sync():
            with loop.autocast():
                loss = loop.loss(loop.forward(inputs), targets)
            loss.backward()
    finally:
        with torch.no_grad():
            for param, grad in zip(loop.params, grads):
                param.grad = grad
            for buffer, saved in buffers:
                buffer.copy_(saved)
        rng.restore()
