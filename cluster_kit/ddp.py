"""Capture a whole DDP training step (forward, backward, optimizer step) in a CUDA graph.

A small DDP model spends most of a step launching kernels from Python; replaying a
captured graph launches the whole step at once. This module follows the "whole
network capture" and "Usage with DistributedDataParallel" parts of PyTorch's CUDA
graphs notes:

* DDP is built on a side stream (:func:`wrap_ddp`), and DDP's async error handling
  is off before the process group starts (:func:`prepare_process_group_env`; PyTorch
  >= 2.1 also keeps graph-captured collectives away from the NCCL watchdog by itself).
* at least 11 DDP-enabled eager iterations run before capture, on the same side
  stream (:func:`capture_stream`) that DDP was built and the graph is captured on;
* gradients are set to ``None`` before capture, so the captured backward writes them
  fresh on every replay instead of accumulating;
* every new batch is ``copy_``-ed into static input/target tensors and the loss is
  read from a static output;
* Adam-style optimizers need ``capturable=True`` (set here when their state is
  still empty; Adam/AdamW state loaded from a plain optimizer's checkpoint has its
  step counts moved onto the device).

Warm-up runs real optimizer steps on the example batch; the model's parameters,
buffers and optimizer state are put back afterwards, so the first real step starts
from the state the caller handed in.

On a CPU model, when graphs are not requested, or when capture fails, the helper
runs the same step eagerly and says why in ``reason`` (logged once).

With ``compile=`` (or ``CLUSTERKIT_CUDA_GRAPHS_COMPILE``, from a job file's
``cuda_graphs: {compile: ...}``) the model and the loss are compiled by Inductor
first (:func:`compile_model`: a model's repeated blocks compiled once) and their
kernels captured with the rest of the step; the options' rules
are the stdlib-only sibling ``compile_options.py``'s, which the job file's
validator shares.

Every step also reports itself to a supervised job's supervisor (:func:`heartbeat`,
:func:`stop_requested`, :func:`enable_supervision`, from the stdlib-only sibling
``supervision.py``; no-ops outside a ``resilience:`` job).

Before compiling, Inductor's cache folder is made one nobody else can write
(:func:`private_compile_cache`, by the rule of the stdlib-only ``trust.py``):
Inductor loads the code it compiled from there.

torch is imported here and nowhere else in clusterkit. The module imports no other
clusterkit modules than those three stdlib-only ones, so a trainer on a node without
clusterkit installed can load it by file path (``importlib.util.spec_from_file_location``):
they are then loaded by path as well.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import logging
import os
import sys
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn


def _load_sibling(name: str) -> ModuleType:
    """``cluster_kit.<name>``, or the file beside this one when this one was loaded by path."""
    if __package__:
        from . import compile_options, supervision, trust

        return {"supervision": supervision, "compile_options": compile_options, "trust": trust}[name]
    alias = f"_clusterkit_{name}"  # not cluster_kit.*: an installed clusterkit stays untouched
    if alias not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(alias, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[alias] = module
        spec.loader.exec_module(module)
    return sys.modules[alias]


_supervision = _load_sibling("supervision")
_compile = _load_sibling("compile_options")
_trust = _load_sibling("trust")
heartbeat: Callable[[], None] = _supervision.heartbeat
stop_requested: Callable[[], bool] = _supervision.stop_requested
enable_supervision: Callable[[], Any] = _supervision.enable_supervision
paused: Callable[..., Any] = _supervision.paused
finished: Callable[[], None] = _supervision.finished
compile_options: Callable[[Any], dict[str, Any] | None] = _compile.compile_options
compile_requested: Callable[..., dict[str, Any] | None] = _compile.options_from_env

ENV_FLAG = "CLUSTERKIT_CUDA_GRAPHS"
ENV_COMPILE: str = _compile.ENV_COMPILE
DDP_MIN_WARMUP = 11  # PyTorch's CUDA graphs notes: DDP needs 11 eager iterations first
TRIAL_WARMUP = 2  # untimed steps before each timed run of keep_faster's trial
TRIAL_STEPS = 5  # timed steps of each way; the same on every rank (eager steps all-reduce)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]

LOG = logging.getLogger("cluster_kit.ddp")
_LOGGED: set[str] = set()
_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}
_BUILT_ON_CAPTURE_STREAM: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def graphs_requested(environ: dict[str, str] | None = None) -> bool:
    """True when ``CLUSTERKIT_CUDA_GRAPHS=1`` is set."""
    env = os.environ if environ is None else environ
    return env.get(ENV_FLAG, "").strip() == "1"


def prepare_process_group_env(enabled: bool | None = None) -> bool:
    """Turn DDP's async NCCL error handling off before ``init_process_group``.

    The CUDA graphs notes ask for this when collectives are captured. It only
    applies when graphs are requested (``enabled``, else the environment flag)
    and never overrides a value the user set. Returns whether graphs are wanted.
    """
    wanted = graphs_requested() if enabled is None else enabled
    if wanted:
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    return wanted


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter (CPU for a module without any)."""
    for param in module.parameters():
        return param.device
    return torch.device("cpu")


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream per GPU on which DDP is built, warmed up and captured.

    DDP keeps the AccumulateGrad nodes it met at construction; building it,
    warming up and capturing on different streams makes autograd join those
    streams inside the graph (PyTorch >= 2.11 warns about exactly that).
    """
    index = torch.device(device).index
    key = torch.cuda.current_device() if index is None else index
    if key not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[key] = torch.cuda.Stream(key)
    return _CAPTURE_STREAMS[key]


def wrap_ddp(
    module: nn.Module, for_capture: bool | None = None, **ddp_kwargs: Any
) -> nn.Module:
    """Wrap ``module`` in DistributedDataParallel, on the capture stream when graphed.

    Capturing the full backward pass needs DDP constructed in a side-stream
    context: with ``for_capture`` (default: ``CLUSTERKIT_CUDA_GRAPHS=1``) and a
    CUDA module it is built on :func:`capture_stream`; otherwise this is plain
    ``DistributedDataParallel(module, **ddp_kwargs)``. Under ``bench ddp --sweep``
    the arguments of ``CLUSTERKIT_DDP_VARIANT`` (:func:`variant_kwargs`) win over
    the caller's.
    """
    from torch.nn.parallel import DistributedDataParallel

    ddp_kwargs.update(variant_kwargs())
    device = module_device(module)
    wanted = graphs_requested() if for_capture is None else for_capture
    if device.type != "cuda":
        return DistributedDataParallel(module, **ddp_kwargs)
    ddp_kwargs.setdefault("device_ids", [device.index])
    if not wanted:
        return DistributedDataParallel(module, **ddp_kwargs)
    side = capture_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        wrapped = DistributedDataParallel(module, **ddp_kwargs)
    torch.cuda.current_stream(device).wait_stream(side)
    _BUILT_ON_CAPTURE_STREAM.add(wrapped)
    return wrapped


def _log_once(level: int, message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        LOG.log(level, message)


def _is_ddp(model: nn.Module) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)


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
        why = _trust.problem(os.lstat(path), "folder")
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
    if not _is_ddp(model):
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


class _Regions:
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
    regions = _Regions(blocks, options)

    def forward(*args: Any, **kwargs: Any) -> Any:
        with regions:
            return compiled(*args, **kwargs)

    return forward


class _Snapshot:
    """Model and optimizer state taken before warm-up, restored in place after it."""

    # A plain class, not a dataclass: dataclasses need the module in sys.modules,
    # which a trainer loading this file by path may not have done.
    def __init__(
        self, model: dict[str, torch.Tensor], optimizer: dict[int, dict[str, Any]]
    ) -> None:
        self.model = model
        self.optimizer = optimizer

    @classmethod
    def take(cls, model: nn.Module, optimizer: torch.optim.Optimizer) -> _Snapshot:
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        state = {
            id(p): {
                k: v.detach().clone() if torch.is_tensor(v) else v for k, v in s.items()
            }
            for p, s in optimizer.state.items()
        }
        return cls(weights, state)

    def restore(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, keep_new_state: bool
    ) -> None:
        """Copy the saved values back into the live tensors.

        State that warm-up created lazily is zeroed in place when a captured graph
        points at it (``keep_new_state``): Adam's and momentum SGD's fresh state is
        zeros. Otherwise it is dropped, so eager steps re-create it as usual.
        """
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                tensor.copy_(self.model[name])
            for param in list(optimizer.state.keys()):
                self._restore_param_state(optimizer, param, keep_new_state)

    def _restore_param_state(
        self, optimizer: torch.optim.Optimizer, param: Any, keep_new_state: bool
    ) -> None:
        live = optimizer.state[param]
        saved = self.optimizer.get(id(param))
        if saved is None and not keep_new_state:
            del optimizer.state[param]
            return
        for key, value in live.items():
            old = None if saved is None else saved.get(key)
            if torch.is_tensor(value) and old is not None:
                value.copy_(old)
            elif torch.is_tensor(value):
                value.zero_()
            elif saved is not None and key in saved:
                live[key] = old


def _describe(optimizer: torch.optim.Optimizer) -> str:
    """``AdamW(foreach)``, ``SGD(fused)``: the class and the update form it runs."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if group.get("fused"):
        form = "fused"
    elif group.get("foreach") is False:
        form = "for-loop"
    else:
        form = "foreach"
    return f"{type(optimizer).__name__}({form})"


GRAPHABLE_ADVICE = (
    "graphed steps need torch.optim.AdamW or Adam (capturable=True, fused=True is "
    "fastest) or SGD"
)


def optimizer_advice(optimizer: torch.optim.Optimizer) -> str | None:
    """Why this optimizer's step cannot be captured, naming what would work; None if it can.

    Adam-style optimizers keep their step count on the GPU only with
    ``capturable=True``; it is switched on here while their state is still empty,
    and for Adam/AdamW also over state they already have (a resumed checkpoint):
    their step counts move onto the device. SGD keeps no step count. Any other optimizer without a capturable mode keeps
    Python-side state that a replayed graph would never update.
    """
    name = type(optimizer).__name__
    groups = optimizer.param_groups
    if any("capturable" in group for group in groups):
        if isinstance(optimizer, torch.optim.Adam):
            return None  # loaded or earlier state is moved onto the device by build_step
        if optimizer.state and not all(group["capturable"] for group in groups):
            return (
                f"{name} already has state and capturable=False, so its step count "
                f"lives on the host; create it with {name}(..., capturable=True) "
                "before its first step"
            )
        return None
    if isinstance(optimizer, torch.optim.SGD):
        return None
    return f"{name} has no capturable mode, so its step cannot be replayed; {GRAPHABLE_ADVICE}"


def why_eager_for(
    optimizer: torch.optim.Optimizer, grad_scaler: Any | None = None
) -> str | None:
    """Why this optimizer (with this GradScaler) must run eagerly; None if it can be graphed."""
    advice = optimizer_advice(optimizer)
    if advice is not None:
        return advice
    scaling = grad_scaler is not None and grad_scaler.is_enabled()
    if scaling and not getattr(optimizer, "_step_supports_amp_scaling", False):
        return (
            f"GradScaler.step reads the inf/nan check back to the host before "
            f"{_describe(optimizer)}.step(), which a CUDA graph cannot replay; create "
            f"it with fused=True (e.g. {type(optimizer).__name__}(..., fused=True"
            f"{', capturable=True' if 'capturable' in optimizer.param_groups[0] else ''}"
            ")) so that skipping a step on inf/nan happens on the GPU"
        )
    return None


def _lr_dtype(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> torch.dtype:
    """The dtype of a captured lr tensor: float32 where a kernel reads it (fused).

    Foreach Adam computes ``1 - lr * weight_decay`` from it: in float64 that rounds as
    the plain loop's Python float does (see :meth:`HyperParams.plain_loop_division`).
    """
    foreach_adam = isinstance(optimizer, torch.optim.Adam) and not group.get("fused")
    if foreach_adam and group.get("foreach") is not False:
        return torch.float64
    return torch.float32


def _reads_tensor_lr(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    """Whether this group's update reads ``lr`` from a device tensor without a sync.

    Adam/AdamW do with capturable=True or fused=True; SGD only fused (its other
    forms turn a tensor lr into a Python number, a host sync).
    """
    if isinstance(optimizer, torch.optim.Adam):
        return True
    return isinstance(optimizer, torch.optim.SGD) and bool(group.get("fused"))


# Keys that LR schedulers keep for themselves: no optimizer update reads them.
SCHEDULER_KEYS = frozenset(
    {
        "params",
        "lr",
        "initial_lr",
        "max_lr",
        "min_lr",
        "base_lr",
        "base_momentum",
        "max_momentum",
        "name",
    }
)


class HyperParams:
    """The optimizer hyper-parameters a captured step reads, kept honest between replays.

    :meth:`install` (before warm-up) turns each group's ``lr`` into a 0-dim device
    tensor where the update reads lr from a tensor, so the captured kernels read
    whatever it holds; :meth:`uninstall` (after capture) puts the group's own
    value back, so LR schedulers and logging see floats as always. :meth:`apply`
    (before each replay) copies the group's current lr into that tensor: an LR
    scheduler's ``step()`` and ``group["lr"] = x`` both take effect on the next
    step. Every other hyper-parameter is baked into the captured kernels; a
    change to one (or to an lr held as a Python number) is refused with a
    ValueError that says what to do, never silently ignored.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.device = device
        self._tensors: list[torch.Tensor | None] = []
        self._own: list[Any] = []
        self._last: list[Any] = []
        self._frozen: list[list[tuple[str, Any]]] = []
        self._reciprocals: list[torch.Tensor | None] = []

    def install(self) -> None:
        """Give every group whose update can read it a device tensor lr."""
        for group in self.optimizer.param_groups:
            lr = group["lr"]
            tensor = None
            if _reads_tensor_lr(self.optimizer, group):
                if torch.is_tensor(lr):  # the dtype the plain loop computes with
                    tensor = lr.detach().to(self.device, copy=True)
                else:
                    tensor = torch.tensor(
                        float(lr),
                        dtype=_lr_dtype(self.optimizer, group),
                        device=self.device,
                    )
                group["lr"] = tensor
            self._tensors.append(tensor)
            self._reciprocals.append(
                None
                if tensor is None or torch.is_tensor(lr) or tensor.dtype != torch.float64
                else torch.tensor(1.0 / float(lr), dtype=torch.float32, device=self.device)
            )
            self._own.append(lr)
            self._last.append(lr)
            self._frozen.append(
                [(k, v) for k, v in group.items() if k not in SCHEDULER_KEYS]
            )

    def uninstall(self) -> None:
        """Put each group's own lr back (the graph keeps reading its tensor)."""
        for group, own in zip(self.optimizer.param_groups, self._own):
            group["lr"] = own

    def apply(self) -> None:
        """Bring the captured lr tensors up to date; refuse changes a replay would ignore."""
        groups = self.optimizer.param_groups
        if len(groups) != len(self._tensors):
            raise ValueError(
                f"the optimizer has {len(groups)} param groups, the captured step "
                f"{len(self._tensors)}; add param groups before build_step, or build "
                "the step again"
            )
        for index, group in enumerate(groups):
            self._apply_lr(index, group)
            for key, captured in self._frozen[index]:
                now = group.get(key)
                if now is not captured and not _same_value(now, captured):
                    raise ValueError(self._frozen_message(index, key, captured, now))

    def _apply_lr(self, index: int, group: dict[str, Any]) -> None:
        lr, tensor = group["lr"], self._tensors[index]
        if torch.is_tensor(lr):
            if tensor is None:
                raise ValueError(self._float_lr_message(index, self._last[index], lr))
            if lr is not tensor:
                tensor.copy_(lr)
                self._fill_reciprocal(index, 1.0 / lr)
            return
        last = self._last[index]
        if not torch.is_tensor(last) and lr == last:
            return
        if tensor is None:
            raise ValueError(self._float_lr_message(index, last, lr))
        tensor.fill_(lr)
        self._fill_reciprocal(index, 1.0 / lr if lr else float("inf"))
        self._last[index] = lr

    def _fill_reciprocal(self, index: int, value: Any) -> None:
        reciprocal = self._reciprocals[index]
        if reciprocal is not None:
            if torch.is_tensor(value):
                reciprocal.copy_(value)
            else:
                reciprocal.fill_(value)

    @contextlib.contextmanager
    def plain_loop_division(self) -> Any:
        """While capturing: foreach Adam's division by lr, done as the plain loop does it.

        With a Python float lr, capturable foreach Adam's ``_foreach_div_(x, lr)``
        computes ``x * float32(1 / lr)``; with a tensor lr it divides, which differs in
        the last bit. Adam turns such bits into lr-sized steps of parameters whose
        gradient is noise (a bias before BatchNorm), so the graph multiplies by a
        float32 reciprocal kept beside the lr tensor instead.
        """
        pairs = {
            id(t): r for t, r in zip(self._tensors, self._reciprocals) if r is not None
        }
        real = torch._foreach_div_

        def divide(tensors: Any, other: Any, *args: Any, **kwargs: Any) -> Any:
            reciprocal = pairs.get(id(other)) if torch.is_tensor(other) else None
            if reciprocal is None or args or kwargs:
                return real(tensors, other, *args, **kwargs)
            return torch._foreach_mul_(tensors, reciprocal)

        torch._foreach_div_ = divide  # type: ignore[assignment]
        try:
            yield
        finally:
            torch._foreach_div_ = real  # type: ignore[assignment]

    def _float_lr_message(self, index: int, old: Any, new: Any) -> str:
        name = _describe(self.optimizer)
        fix = (
            "create it with SGD(..., fused=True), whose update reads lr from a tensor"
            if isinstance(self.optimizer, torch.optim.SGD)
            else GRAPHABLE_ADVICE
        )
        return (
            f"param_groups[{index}]['lr'] changed from {old} to {new} after capture, "
            f"but {name} reads lr as a Python number inside the captured step, so a "
            f"replay would keep {old}; {fix}, or build the step with enabled=False"
        )

    @staticmethod
    def _frozen_message(index: int, key: str, old: Any, new: Any) -> str:
        return (
            f"param_groups[{index}][{key!r}] changed from {old!r} to {new!r} after "
            f"capture; the captured step keeps {old!r} (only lr follows changes "
            "between replays): set it before build_step, or build the step again "
            "after changing it"
        )


def _same_value(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values are different values
        return False


def _save_scaler(scaler: Any | None) -> dict[str, torch.Tensor] | None:
    """A GradScaler's scale and growth tracker, if it has made them yet."""
    if scaler is None or getattr(scaler, "_scale", None) is None:
        return None
    return {
        "_scale": scaler._scale.detach().clone(),
        "_growth_tracker": scaler._growth_tracker.detach().clone(),
    }


def _restore_scaler(scaler: Any | None, saved: dict[str, torch.Tensor] | None) -> None:
    """Undo what warm-up did to the scaler, in place (a graph points at its tensors)."""
    if scaler is None or getattr(scaler, "_scale", None) is None:
        return
    with torch.no_grad():
        if saved is not None:
            scaler._scale.copy_(saved["_scale"])
            scaler._growth_tracker.copy_(saved["_growth_tracker"])
        else:
            scaler._scale.fill_(scaler._init_scale)
            scaler._growth_tracker.fill_(scaler._init_growth_tracker)


class _RngState:
    """The CPU and the device's random number generators, put back after trial steps."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def _time_ms(run: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds per call of ``run``: TRIAL_STEPS back to back, synchronized at both ends."""
    for _ in range(TRIAL_WARMUP):
        run()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(TRIAL_STEPS):
        run()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3 / TRIAL_STEPS


def _slowest_rank(values: list[float], device: torch.device) -> list[float]:
    """Each value's maximum over the ranks, so that every rank decides alike."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def _steps_onto_devices(
    optimizer: torch.optim.Optimizer, group: dict[str, Any]
) -> list[tuple[dict[str, Any], torch.Tensor]]:
    """Move each host-side ``step`` of this group's state onto its parameter's device.

    Returns (state, host tensor) pairs, so that dropping the graph can put them back.
    """
    moved = []
    for param in group["params"]:
        state = optimizer.state.get(param, {})
        step = state.get("step")
        if torch.is_tensor(step) and step.device != param.device:
            state["step"] = step.to(param.device, copy=True)
            moved.append((state, step))
        elif step is not None and not torch.is_tensor(step):
            state["step"] = torch.tensor(float(step), device=param.device)
    return moved


class GraphedStep:
    """One DDP training step, replayed from a CUDA graph when it can be.

    ``model`` is the (DDP-wrapped) module, ``optimizer`` steps its parameters,
    ``loss_fn(output, targets)`` returns a scalar loss, and ``example_batch`` is an
    ``(inputs, targets)`` pair with the shapes and dtypes of the later batches (a
    batch of another shape, e.g. a short last batch, runs the plain loop's step
    eagerly on the same state, logged once; the next batch of the captured shape
    replays the graph again). ``warmup`` eager
    iterations run before capture (at least 11 for DDP).

    ``autocast_dtype`` runs forward and loss under autocast; ``max_grad_norm``
    clips the total gradient norm (kept in :attr:`last_grad_norm`);
    ``accumulation_steps=k`` makes one step k micro-batches (a leading dimension
    of size k on inputs and targets, DDP ``no_sync()`` on all but the last);
    ``grad_scaler`` scales an fp16 loss. Graphed or eager, a step computes what
    the plain loop in SPEC "cluster_kit.ddp" computes.

    ``keep_faster`` times the plain eager step and the replayed graph on the
    example batch (TRIAL_STEPS each, the slowest rank's figure) and keeps the graph
    only if it is faster: a compute-bound step gains nothing from a graph and pays
    for what capture needs (``capturable`` optimizer state, autocast without its
    cache). ``trial_ms`` holds both figures. Trial steps, like warm-up, are undone.

    ``compile_options`` (``torch.compile`` keyword arguments, see
    :func:`compile_options`; None: not compiled) compiles the model and the loss
    with Inductor before anything else runs; the whole step, Inductor's kernels
    included, is then captured as one graph, so a replay runs them without
    launches or torch.compile's guards. Graphed or eager, a compiled step computes
    what the plain loop computes with ``compile_model(model, **options)`` and
    ``torch.compile(loss_fn, **options)`` in their places: the model, or on one
    rank the module DDP wraps (:func:`compile_target`), each repeated block
    compiled once (:func:`compile_model`). With
    several ranks dynamo splits the compiled model at DDP's buckets and the graph
    holds every bucket's all-reduce where backward starts it. Autocast then runs
    without its cast cache in every step (a compiled graph casts by itself, and
    dynamo would compile again for each setting of the cache).

    After construction ``graphed`` says whether steps replay a graph,
    ``compiled`` whether they run Inductor's kernels, and ``reason`` why the
    step is not all that was asked for (None when it is): not graphed, or a
    compile that failed (the model's own kernels then run, graphed or not).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        example_batch: Batch,
        warmup: int = DDP_MIN_WARMUP,
        enabled: bool = True,
        *,
        autocast_dtype: torch.dtype | None = None,
        max_grad_norm: float | None = None,
        accumulation_steps: int = 1,
        grad_scaler: Any | None = None,
        keep_faster: bool = False,
        compile_options: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        # What a step calls: the model and loss, or Inductor's compilations of them.
        self._forward: Callable[..., Any] = model
        self._loss: Callable[..., Any] = loss_fn
        self.compiled = False
        self.warmup = warmup
        self.autocast_dtype = autocast_dtype
        self.max_grad_norm = max_grad_norm
        self.accumulation_steps = accumulation_steps
        self.grad_scaler = grad_scaler
        self.keep_faster = keep_faster
        self.device = module_device(model)
        self.graphed = False
        self.reason: str | None = None
        self.trial_ms: dict[str, float] | None = None
        self._capturing = False  # autocast keeps its cache except for the graph's steps
        # Eager steps of a DDP built on the capture stream run there too: its
        # AccumulateGrad nodes live on that stream, and autograd would join the two
        # streams at every gradient otherwise.
        self._eager_stream = (
            capture_stream(self.device) if model in _BUILT_ON_CAPTURE_STREAM else None
        )
        self._made_capturable: list[dict[str, Any]] = []
        self._moved_steps: list[tuple[dict[str, Any], torch.Tensor]] = []
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._grad_norm: torch.Tensor | None = None
        self._static_grad_norm: torch.Tensor | None = None  # what the graph writes
        self._graph: torch.cuda.CUDAGraph | None = None
        self._hyper = HyperParams(optimizer, self.device)
        self._static_inputs: torch.Tensor | None = None
        self._static_targets: torch.Tensor | None = None
        self._static_loss: torch.Tensor | None = None
        self._check_arguments(example_batch)
        compile_reason = None
        if compile_options is not None:
            compile_reason = self._compile_or_fall_back(example_batch, compile_options)
        self.reason = self._why_not_graphed(enabled)
        if self.reason is None:
            self._capture_or_fall_back(example_batch)
        elif enabled:
            _log_once(
                logging.WARNING,
                f"CUDA graphs off, training steps run eagerly: {self.reason}",
            )
        if compile_reason is not None:
            self.reason = f"{self.reason}; {compile_reason}" if self.reason else compile_reason

    @property
    def last_grad_norm(self) -> torch.Tensor | None:
        """Total gradient norm of the last step (before clipping); None without clipping."""
        if self._grad_norm is None or self._grad_norm is not self._static_grad_norm:
            return self._grad_norm
        return self._grad_norm.clone()  # the graph overwrites it on the next replay

    def _check_arguments(self, example_batch: Batch) -> None:
        if self.warmup < 1:
            raise ValueError("warmup must be at least 1 iteration")
        if _is_ddp(self.model) and self.warmup < DDP_MIN_WARMUP:
            raise ValueError(
                f"DDP needs at least {DDP_MIN_WARMUP} eager warm-up iterations before "
                f"capture (got warmup={self.warmup}); use warmup={DDP_MIN_WARMUP}"
            )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(
                f"max_grad_norm must be > 0 (got {self.max_grad_norm}); "
                "max_grad_norm=None turns clipping off"
            )
        if self.autocast_dtype not in (None, torch.bfloat16, torch.float16):
            raise ValueError(
                f"autocast_dtype must be torch.bfloat16 or torch.float16 (got "
                f"{self.autocast_dtype})"
            )
        if not isinstance(self.accumulation_steps, int) or self.accumulation_steps < 1:
            raise ValueError(
                f"accumulation_steps must be an integer >= 1 (got {self.accumulation_steps!r})"
            )
        self._check_micro_batches(*example_batch, what="example_batch")

    def _check_micro_batches(
        self, inputs: torch.Tensor, targets: torch.Tensor, what: str
    ) -> None:
        k = self.accumulation_steps
        if k == 1:
            return
        for name, tensor in (("inputs", inputs), ("targets", targets)):
            if tensor.dim() == 0 or tensor.shape[0] != k:
                raise ValueError(
                    f"{what} {name} have shape {tuple(tensor.shape)}, but "
                    f"accumulation_steps={k} needs a leading micro-batch dimension of "
                    f"{k}: stack the micro-batches, e.g. x.view({k}, -1, *x.shape[1:])"
                )

    def _why_not_graphed(self, enabled: bool) -> str | None:
        if not enabled:
            return f"CUDA graphs not requested ({ENV_FLAG} is not 1)"
        if not torch.cuda.is_available():
            return "CUDA is not available"
        if self.device.type != "cuda":
            return f"the model is on {self.device}, not on a CUDA device"
        return why_eager_for(self.optimizer, self.grad_scaler)

    def _compile_or_fall_back(
        self, example_batch: Batch, options: dict[str, Any]
    ) -> str | None:
        """Compile model and loss with Inductor and run them once; None, or why not.

        Compiling happens at the first call, so a failure shows here, before warm-up,
        and every rank learns whether all compiled: all run the same kernels' kind.
        """
        self.compiled = True  # the first pass compiles under the autocast of compiled steps
        error: str | None = None
        warning = private_compile_cache()
        if warning:
            _log_once(logging.WARNING, warning)
        try:
            self._forward = compile_model(self.model, **options)
            self._loss = torch.compile(self.loss_fn, **options)
            self._first_compiled_pass(example_batch)
        except Exception as exc:  # noqa: BLE001 - any compile failure means: the model's own kernels
            error = f"torch.compile failed: {type(exc).__name__}: {_first_line(exc)}"
        if _all_ranks_agree(error is None, self.device):
            return None
        self.compiled = False
        self._forward, self._loss = self.model, self.loss_fn
        reason = f"{error or 'torch.compile failed on another rank'}; steps run the model's own kernels"
        _log_once(logging.WARNING, f"Inductor off: {reason}")
        return reason

    def _first_compiled_pass(self, example_batch: Batch) -> None:
        """Forward, loss and backward of one micro-batch, undone: Inductor compiles here.

        Under DDP ``no_sync()``, so no all-reduce waits on a rank whose compile
        failed. Gradients, buffers (BatchNorm's statistics) and random number
        generators are put back as they were.
        """
        inputs, targets = (t.to(self.device) for t in example_batch)
        if self.accumulation_steps > 1:
            inputs, targets = inputs[0], targets[0]
        grads = [p.grad for p in self._params]
        buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        rng = _RngState(self.device)
        try:
            with self._on_eager_stream(), self._no_sync():
                with self._autocast():
                    loss = self._loss(self._forward(inputs), targets)
                loss.backward()
        finally:
            with torch.no_grad():
                for param, grad in zip(self._params, grads):
                    param.grad = grad
                for buffer, saved in buffers:
                    buffer.copy_(saved)
            rng.restore()

    def _capture_or_fall_back(self, example_batch: Batch) -> None:
        snapshot = _Snapshot.take(self.model, self.optimizer)
        scaler_state = _save_scaler(self.grad_scaler)
        rng = _RngState(self.device)
        eager_ms = None
        if self.keep_faster:
            eager_ms = self._time_eager(example_batch)
            snapshot.restore(self.model, self.optimizer, keep_new_state=False)
            _restore_scaler(self.grad_scaler, scaler_state)
            rng.restore()
        error: str | None = None
        try:
            self._prepare_optimizer()
            self._hyper.install()
            with self._hyper.plain_loop_division():
                self._capture(example_batch)
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            error = f"capture failed: {type(exc).__name__}: {exc}".strip()
        finally:
            self._hyper.uninstall()
        ok = _all_ranks_agree(error is None, self.device)
        if ok:
            self.graphed = True
            if eager_ms is not None:
                self._keep_faster(eager_ms)
        else:
            self.reason = error or "capture failed on another rank"
            _log_once(
                logging.WARNING,
                f"CUDA graphs off, training steps run eagerly: {self.reason}",
            )
        if not self.graphed:
            self._drop_graph()
        snapshot.restore(self.model, self.optimizer, keep_new_state=self.graphed)
        _restore_scaler(self.grad_scaler, scaler_state)
        if not self.graphed and eager_ms is not None:
            rng.restore()  # eager from here: the plain loop's random numbers
        torch.cuda.synchronize(self.device)

    def _time_eager(self, example_batch: Batch) -> float:
        """The plain loop's step on the example batch, in ms (the optimizer as given)."""
        inputs, targets = (t.to(self.device) for t in example_batch)
        return _time_ms(lambda: self._eager_step(inputs, targets), self.device)

    def _eager_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self._on_eager_stream():
            self.optimizer.zero_grad(set_to_none=True)
            return self._train_step(inputs, targets)

    @contextlib.contextmanager
    def _on_eager_stream(self) -> Any:
        """Eager work on the capture stream when DDP was built there (else as it comes)."""
        stream = self._eager_stream
        if stream is None:
            yield
            return
        current = torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            yield
        current.wait_stream(stream)

    def _keep_faster(self, eager_ms: float) -> None:
        """Replay the graph as long as the trial's eager steps took; keep the faster."""
        assert self._graph is not None
        graph = self._graph
        graphed_ms = _time_ms(graph.replay, self.device)
        eager_ms, graphed_ms = _slowest_rank([eager_ms, graphed_ms], self.device)
        self.trial_ms = {"eager": eager_ms, "graphed": graphed_ms}
        if graphed_ms <= eager_ms:
            return
        self.graphed = False
        self.reason = (
            f"eager steps were faster: {eager_ms:.3f} ms against {graphed_ms:.3f} ms "
            "replayed (a compute-bound step); keep_faster=False keeps the graph"
        )
        _log_once(logging.INFO, f"CUDA graph not kept: {self.reason}")

    def _drop_graph(self) -> None:
        """Back to the optimizer and tensors of the plain loop; the graph's memory goes."""
        self._graph = None
        self._static_inputs = self._static_targets = self._static_loss = None
        self._grad_norm = self._static_grad_norm = None
        for group in self._made_capturable:
            group["capturable"] = False
        self._made_capturable = []
        for state, host_step in self._moved_steps:
            host_step.copy_(state["step"])
            state["step"] = host_step
        self._moved_steps = []
        self.optimizer.zero_grad(set_to_none=True)

    def _prepare_optimizer(self) -> None:
        """Adam-style optimizers keep their step count on the GPU only when capturable.

        State an Adam/AdamW already has (``load_state_dict`` of a checkpoint saved
        by a plain optimizer) keeps its step counts on the host: they move onto
        their parameter's device, as a capturable Adam keeps them.
        """
        for group in self.optimizer.param_groups:
            if "capturable" in group and not group["capturable"]:
                if self.optimizer.state and not isinstance(self.optimizer, torch.optim.Adam):
                    raise RuntimeError(
                        "the optimizer has state and capturable=False; create it with "
                        "capturable=True (e.g. AdamW(..., capturable=True))"
                    )
                self._moved_steps += _steps_onto_devices(self.optimizer, group)
                group["capturable"] = True
                self._made_capturable.append(group)

    def _capture(self, example_batch: Batch) -> None:
        inputs, targets = example_batch
        self._static_inputs = inputs.detach().to(self.device, copy=True)
        self._static_targets = targets.detach().to(self.device, copy=True)
        side = capture_stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        self._capturing = True
        try:
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.optimizer.zero_grad(set_to_none=True)
                    self._train_step(self._static_inputs, self._static_targets)
            torch.cuda.current_stream(self.device).wait_stream(side)
            # Grads must be None so that the captured backward allocates and writes them.
            self.optimizer.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                self._static_loss = self._train_step(
                    self._static_inputs, self._static_targets
                )
            self._static_grad_norm = self._grad_norm
        finally:
            self._capturing = False
        self._graph = graph

    def _autocast(self) -> Any:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        # A graph must not keep autocast's cache of cast weights from capture time;
        # eager steps keep it, as the plain loop does. Compiled steps never use it
        # (Inductor's kernels cast by themselves) and keep one setting throughout:
        # dynamo guards on it and would compile the model again for the other.
        cache = not self._capturing and not self.compiled
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=cache)

    def _no_sync(self) -> Any:
        """DDP ``no_sync()``: backward without the all-reduce (nothing without DDP)."""
        if _is_ddp(self.model):
            return self.model.no_sync()  # type: ignore[operator]
        return contextlib.nullcontext()

    def _micro_batch_context(self, index: int) -> Any:
        """DDP ``no_sync()`` on every micro-batch but the last."""
        if index < self.accumulation_steps - 1:
            return self._no_sync()
        return contextlib.nullcontext()

    def _train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The plain loop of SPEC "cluster_kit.ddp", minus zero_grad: the mean loss."""
        k = self.accumulation_steps
        total: torch.Tensor | None = None
        for index in range(k):
            x, y = (inputs, targets) if k == 1 else (inputs[index], targets[index])
            with self._micro_batch_context(index):
                with self._autocast():
                    loss = self._loss(self._forward(x), y)
                    if k > 1:
                        loss = loss / k
                scaler = self.grad_scaler
                (scaler.scale(loss) if scaler is not None else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        self._clip_and_update()
        assert total is not None
        return total

    def _clip_and_update(self) -> None:
        scaler = self.grad_scaler
        if self.max_grad_norm:
            if scaler is not None:
                scaler.unscale_(self.optimizer)
            # error_if_nonfinite stays off: checking it reads the norm on the host.
            self._grad_norm = torch.nn.utils.clip_grad_norm_(
                self._params, self.max_grad_norm
            )
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Run one training step on this batch and return its loss (a new tensor).

        Each step is reported to a supervised job's supervisor (:func:`heartbeat`).
        """
        loss = self._run_step(inputs, targets)
        heartbeat()
        return loss

    def _run_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if not self.graphed:
            self._check_micro_batches(inputs, targets, what="the batch's")
            return self._eager_step(inputs, targets)
        assert self._graph is not None and self._static_loss is not None
        if not self._fits_graph(inputs, targets):
            return self._odd_batch_step(inputs, targets)
        self._hyper.apply()
        self._copy_batch(inputs, targets)
        self._grad_norm = self._static_grad_norm
        self._graph.replay()
        # A replay is an optimizer step: LR schedulers look for one before theirs.
        self.optimizer._opt_called = True  # type: ignore[attr-defined]
        return self._static_loss.clone()

    __call__ = step

    def _fits_graph(self, inputs: torch.Tensor, targets: torch.Tensor) -> bool:
        assert self._static_inputs is not None and self._static_targets is not None
        return (
            inputs.shape == self._static_inputs.shape
            and targets.shape == self._static_targets.shape
        )

    def _odd_batch_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """A batch of another shape (a short last batch): the plain loop's step, eagerly.

        It reads and updates the same parameters, buffers and optimizer state as the
        graph, with the optimizer's own hyper-parameters (lr from its group, as the
        plain loop); the graph's gradient tensors are put back for the next replay.
        """
        assert self._static_inputs is not None and self._static_targets is not None
        self._check_micro_batches(inputs, targets, what="the batch's")
        _log_once(
            logging.INFO,
            f"a batch of shape {tuple(inputs.shape)} (captured: "
            f"{tuple(self._static_inputs.shape)}) ran eagerly; the graph replays the "
            "next batch of the captured shape",
        )
        graph_grads = [p.grad for p in self._params]
        loss = self._eager_step(inputs.to(self.device), targets.to(self.device))
        for param, grad in zip(self._params, graph_grads):
            param.grad = grad
        return loss

    def _copy_batch(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        assert self._static_inputs is not None and self._static_targets is not None
        self._static_inputs.copy_(inputs, non_blocking=True)
        self._static_targets.copy_(targets, non_blocking=True)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's first line, cut to ``limit`` characters (compile errors run long)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _all_ranks_agree(ok: bool, device: torch.device) -> bool:
    """True only if every rank captured: ranks must all replay or all run eagerly."""
    if (
        not (dist.is_available() and dist.is_initialized())
        or dist.get_world_size() == 1
    ):
        return ok
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


class TrainingStep(Protocol):
    """What :func:`build_step` returns: a :class:`GraphedStep`, itself or feeding a profiler.

    ``step(inputs, targets)`` (or ``step.step``) runs one training step and returns
    its loss; ``graphed``, ``compiled``, ``reason``, ``trial_ms`` and
    ``last_grad_norm`` are :class:`GraphedStep`'s.
    """

    @property
    def model(self) -> nn.Module: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    @property
    def graphed(self) -> bool: ...

    @property
    def compiled(self) -> bool: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def trial_ms(self) -> dict[str, float] | None: ...

    @property
    def last_grad_norm(self) -> torch.Tensor | None: ...

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...


def build_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    example_batch: Batch,
    *,
    warmup: int = DDP_MIN_WARMUP,
    enabled: bool | None = None,
    autocast_dtype: torch.dtype | None = None,
    max_grad_norm: float | None = None,
    accumulation_steps: int = 1,
    grad_scaler: Any | None = None,
    keep_faster: bool = True,
    compile: bool | str | dict[str, Any] | None = None,
) -> TrainingStep:
    """A training step, graphed when ``enabled`` (default: ``CLUSTERKIT_CUDA_GRAPHS=1``).

    See :class:`GraphedStep` for the options; ``step.graphed`` and ``step.reason``
    say whether it replays a graph and why not. With ``keep_faster`` (the default)
    the graph is kept only where it beats the eager step, timed on the example batch.
    With ``CLUSTERKIT_PROFILE_STEPS`` set (``bench ddp``) the step also feeds a
    :class:`StepProfiler` of its own.

    ``compile``: the model and the loss compiled by Inductor, their kernels then
    captured with the rest of the step in the one graph. True or ``"default"``:
    ``torch.compile``'s defaults; ``"max-autotune-no-cudagraphs"``: that mode; a
    dict: ``torch.compile`` arguments (``mode``, ``fullgraph``, ``dynamic``,
    ``options``); False: not compiled; None (the default): what
    ``CLUSTERKIT_CUDA_GRAPHS_COMPILE`` says (a job file's ``cuda_graphs: {compile:
    ...}`` exports it), else not compiled. Modes that record CUDA graphs of their
    own are refused (ValueError). A compile that fails leaves the model's own
    kernels, with the reason in ``step.reason``; ``step.compiled`` says which ran.
    """
    enable_supervision()  # a hang in warm-up or capture is diagnosed too
    _supervision.finish_at_exit()  # a run whose loop ends without a stop asked is done
    wanted = graphs_requested() if enabled is None else enabled
    options = compile_requested() if compile is None else compile_options(compile)
    step = GraphedStep(
        model,
        optimizer,
        loss_fn,
        example_batch,
        warmup=warmup,
        enabled=wanted,
        autocast_dtype=autocast_dtype,
        max_grad_norm=max_grad_norm,
        accumulation_steps=accumulation_steps,
        grad_scaler=grad_scaler,
        keep_faster=keep_faster,
        compile_options=options,
    )
    profiler = StepProfiler()
    if not profiler.enabled:
        return step
    atexit.register(profiler.close)
    return _ProfiledStep(step, profiler)


# --- Step profiling and DDP variants (`clusterkit bench ddp`) -----------------------
# What build_step and wrap_ddp read from the environment bench ddp's job sets.

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


class _ProfiledStep:
    """A step from build_step that feeds a StepProfiler; its attributes pass through."""

    def __init__(self, step: GraphedStep, profiler: StepProfiler) -> None:
        self._step = step
        self._profiler = profiler

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if not _RUNNING:  # a script's own StepProfiler around the loop wins
            self._profiler.__enter__()
        loss = self._step(inputs, targets)
        self._profiler.step()
        return loss

    step = __call__

    @property
    def model(self) -> nn.Module:
        return self._step.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._step.optimizer

    @property
    def graphed(self) -> bool:
        return self._step.graphed

    @property
    def compiled(self) -> bool:
        return self._step.compiled

    @property
    def reason(self) -> str | None:
        return self._step.reason

    @property
    def trial_ms(self) -> dict[str, float] | None:
        return self._step.trial_ms

    @property
    def last_grad_norm(self) -> torch.Tensor | None:
        return self._step.last_grad_norm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._step, name)


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
