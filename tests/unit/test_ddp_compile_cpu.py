"""build_step(..., compile=...) on the CPU: Inductor's CPU backend, DDP over gloo.

Graph capture needs CUDA, so here the compiled step runs eagerly; it must compute
exactly what the plain loop of SPEC "cluster_kit.ddp" computes with
``ddp.compile_model(model)`` (``torch.compile`` of the model, each repeated block
compiled once) and ``torch.compile(loss_fn)`` in their places, and a
compile that fails must leave the model's own kernels with the reason.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cluster_kit import ddp
from cluster_kit.trainer import trust
from cluster_kit.trainer.step.compile import Regions

# Inductor's CPU backend writes C++ and builds it with g++ (scripts/setup installs it).
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler (g++) for Inductor")

Batch = tuple[torch.Tensor, torch.Tensor]
STEPS = 8
K = 2  # micro-batches a step
MAX_NORM = 0.5


@pytest.fixture(scope="module", autouse=True)
def process_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Each test compiles anew: dynamo's cache of one test's frames stays out of the next."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Net(nn.Module):
    """Pointwise work in bf16 that Inductor fuses (rounding once, where eager rounds
    after every op), BatchNorm statistics and dropout's random numbers: the compiled
    step differs from the plain one, and a first pass that left a trace would show."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.norm = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.1)
        self.b = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h = F.gelu(h) * 1.7 + torch.tanh(h) * 0.3
        return self.b(self.drop(self.norm(h)))


class BreakingNet(Net):
    """Net with a graph break, which ``fullgraph=True`` refuses."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h = F.gelu(h) * 1.7 + torch.tanh(h) * 0.3
        torch._dynamo.graph_break()
        return self.b(self.drop(self.norm(h)))


class Layer(nn.Module):
    """A residual block with pointwise work in bf16 that Inductor fuses."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(self.norm(x))
        return x + F.gelu(h) * 1.7 + torch.tanh(h) * 0.3


class Stack(Net):
    """Net with a run of repeated blocks before its head: compiled as regions."""

    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((8,), 2.0))
        self.blocks = nn.Sequential(*[Layer() for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.blocks(x * self.scale))


def make_model(graph_break: bool = False, cls: type[Net] | None = None) -> DistributedDataParallel:
    torch.manual_seed(0)
    return DistributedDataParallel((cls or (BreakingNet if graph_break else Net))())


def make_batches(seed: int = 1) -> list[Batch]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(K, 6, 8, generator=gen), torch.randn(K, 6, 4, generator=gen))
            for _ in range(STEPS)]


def make_optimizer(model: nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    factor: Callable[[int], float] = lambda i: min(1.0, (i + 1) / 3) * 0.5 * (1 + math.cos(math.pi * i / STEPS))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


Record = tuple[list[float], list[torch.Tensor]]


def plain_loop(model: DistributedDataParallel, forward: Callable[..., Any],
               loss_fn: Callable[..., Any], seed: int = 1) -> Record:
    """SPEC's plain loop with `forward` and `loss_fn`, as a user writes it."""
    opt, sched = make_optimizer(model)
    torch.manual_seed(2)
    losses = []
    for inputs, targets in make_batches(seed):
        total = torch.zeros(())
        for i in range(K):
            sync = model.no_sync() if i < K - 1 else contextlib.nullcontext()
            with sync:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = loss_fn(forward(inputs[i]), targets[i]) / K
                loss.backward()
            total = total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        losses.append(float(total))
    return losses, [p.detach().clone() for p in model.parameters()] + list(model.buffers())


def built_loop(model: DistributedDataParallel, seed: int = 1,
               **kwargs: Any) -> tuple[ddp.TrainingStep, Record]:
    opt, sched = make_optimizer(model)
    data = make_batches(seed)
    torch.manual_seed(2)  # before build_step: its first compiled pass must give back what it drew
    step = ddp.build_step(model, opt, F.mse_loss, data[0], enabled=False,
                          autocast_dtype=torch.bfloat16, max_grad_norm=MAX_NORM,
                          accumulation_steps=K, **kwargs)
    losses = []
    for batch in data:
        losses.append(float(step(*batch)))
        sched.step()
    return step, (losses, [p.detach().clone() for p in model.parameters()] + list(model.buffers()))


def same(a: Record, b: Record) -> bool:
    return a[0] == b[0] and all(torch.equal(p, q) for p, q in zip(a[1], b[1]))


def test_a_compiled_step_equals_the_compiled_plain_loop_exactly() -> None:
    reference = make_model()
    # One rank: the step compiles the module DDP wraps (DDP's sync is the identity).
    want = plain_loop(reference, torch.compile(reference.module), torch.compile(F.mse_loss))
    uncompiled = make_model()
    plain = plain_loop(uncompiled, uncompiled, F.mse_loss)
    assert not same(plain, want)  # Inductor's kernels round otherwise: the comparison can tell
    step, got = built_loop(make_model(), compile=True)
    assert step.compiled is True and step.graphed is False
    assert step.reason == f"CUDA graphs not requested ({ddp.ENV_FLAG} is not 1)"
    assert same(got, want)


def test_a_failed_compile_leaves_the_models_own_kernels_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = make_model(graph_break=True)
    want = plain_loop(model, model, F.mse_loss)
    with caplog.at_level("WARNING", logger="cluster_kit.ddp"):
        step, got = built_loop(make_model(graph_break=True), compile={"fullgraph": True})
    assert step.compiled is False and step.graphed is False
    reason = str(step.reason)
    assert reason.startswith(f"CUDA graphs not requested ({ddp.ENV_FLAG} is not 1); torch.compile failed: ")
    assert reason.endswith("; steps run the model's own kernels")
    assert "\n" not in reason and len(reason) < 500
    assert "Inductor off: torch.compile failed" in caplog.text
    assert same(got, want)


def test_the_job_scripts_variable_turns_compiling_on_and_an_argument_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ddp.ENV_COMPILE, "1")
    on, _ = built_loop(make_model())
    assert on.compiled is True
    off, _ = built_loop(make_model(), compile=False)
    assert off.compiled is False and off.reason == f"CUDA graphs not requested ({ddp.ENV_FLAG} is not 1)"
    monkeypatch.setenv(ddp.ENV_COMPILE, "reduce-overhead")
    with pytest.raises(ValueError, match="CLUSTERKIT_CUDA_GRAPHS_COMPILE='reduce-overhead'"):
        built_loop(make_model())


@pytest.mark.parametrize("value", ["reduce-overhead", {"options": {"triton.cudagraphs": True}}])
def test_modes_with_cuda_graphs_of_their_own_are_refused_before_anything_runs(value: Any) -> None:
    model = make_model()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="records CUDA graphs of its own"):
        built_loop(model, compile=value)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def halve(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations, not strings
    """A communication hook that changes the gradients even on one rank."""
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(bucket.buffer().mul_(0.5))
    return done


def test_on_one_rank_inductor_compiles_the_module_ddp_wraps_unless_a_hook_changes_gradients() -> None:
    plain = nn.Linear(2, 2)
    assert ddp.compile_target(plain) is plain
    bare = make_model()
    assert ddp.compile_target(bare) is bare.module
    builtin = make_model()
    builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    assert ddp.compile_target(builtin) is builtin
    hooked = make_model()
    hooked.register_comm_hook(None, halve)
    assert ddp.compile_target(hooked) is hooked


def test_a_communication_hook_keeps_ddp_in_the_compiled_step() -> None:
    reference = make_model()
    reference.register_comm_hook(None, halve)
    want = plain_loop(reference, torch.compile(reference), torch.compile(F.mse_loss))
    unhooked = make_model()
    assert not same(plain_loop(unhooked, torch.compile(unhooked.module), torch.compile(F.mse_loss)), want)
    model = make_model()
    model.register_comm_hook(None, halve)
    step, got = built_loop(model, compile=True)
    assert step.compiled is True
    assert same(got, want)


NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")


def plant(where: Path, how: str) -> None:
    """What another user, or a careless one, leaves where Inductor's cache folder goes."""
    if how == "link":
        (where.parent / "elsewhere").mkdir(mode=0o700)
        where.symlink_to(where.parent / "elsewhere")
        return
    where.mkdir()
    os.chmod(where, 0o777 if how == "everyone-writes" else 0o755)  # mkdir's mode passes the umask
    if how == "another-user":
        os.chown(where, NOBODY, NOBODY)


@pytest.mark.parametrize("how", [pytest.param("another-user", marks=as_root), "everyone-writes", "link"])
def test_an_inductor_cache_folder_someone_else_could_write_is_replaced_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / "torchinductor_me"
    plant(planted, how)
    env: dict[str, str] = {}
    warning = ddp.private_compile_cache(env, default=str(planted))
    used = Path(env[ddp.INDUCTOR_CACHE_ENV])
    assert used != planted and used.parent == tmp_path and used.name.startswith("torchinductor_")
    assert (used.stat().st_mode & 0o777) == 0o700 and used.stat().st_uid == os.getuid()
    assert warning is not None and warning.startswith(f"Inductor's cache folder {planted} ")
    assert {"another-user": f"belongs to {trust.user_name(NOBODY)}",
            "everyone-writes": "is writable by group and others (mode 0777)",
            "link": "is a symbolic link"}[how] in warning
    assert f"compiling into the new private folder {used} instead" in warning
    assert f"remove {planted}" in warning and "set TORCHINDUCTOR_CACHE_DIR" in warning


def test_an_own_private_inductor_cache_folder_is_made_or_kept_and_exported(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "inductor"
    env: dict[str, str] = {}
    assert ddp.private_compile_cache(env, default=str(folder)) is None
    assert env[ddp.INDUCTOR_CACHE_ENV] == str(folder) and (folder.stat().st_mode & 0o777) == 0o700
    (folder / "kept").write_text("")
    assert ddp.private_compile_cache(env) is None  # the exported folder, checked again
    assert env[ddp.INDUCTOR_CACHE_ENV] == str(folder) and (folder / "kept").exists()


@as_root
def test_a_compile_never_writes_into_a_cache_folder_planted_by_another_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / "planted"
    plant(planted, "another-user")
    monkeypatch.setenv(ddp.INDUCTOR_CACHE_ENV, str(planted))
    with caplog.at_level("WARNING", logger="cluster_kit.ddp"):
        step, _ = built_loop(make_model(), compile=True)
    assert step.compiled is True
    used = Path(os.environ[ddp.INDUCTOR_CACHE_ENV])
    assert used != planted and any(used.iterdir())  # Inductor's kernels went to the private folder
    assert not any(planted.iterdir())
    assert f"Inductor's cache folder {planted} belongs to" in caplog.text


def test_a_user_without_an_account_gets_a_cache_folder_named_by_uid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container may run the job as a uid that has no account: no name for the folder's."""
    import getpass

    def no_account() -> str:
        raise KeyError(f"getpwuid(): uid not found: {os.getuid()}")

    monkeypatch.setattr(getpass, "getuser", no_account)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env: dict[str, str] = {}
    assert ddp.private_compile_cache(env) is None
    folder = tmp_path / f"torchinductor_uid_{os.getuid()}"
    assert env[ddp.INDUCTOR_CACHE_ENV] == str(folder) and (folder.stat().st_mode & 0o777) == 0o700


def exit_codes(processes: list[Any]) -> list[int | None]:
    """Start ``processes`` together, give each 240 s to end (else kill it): their exit codes."""
    for process in processes:
        process.start()
    for process in processes:
        process.join(240)
        if process.is_alive():
            process.kill()
            process.join()
    return [process.exitcode for process in processes]


def restarted_compile(cache: str, out: str) -> None:
    """One start of a trainer whose job names ``cache`` as Inductor's folder: what it
    compiled and what it found compiled, and what it trained, written to ``out``."""
    from torch._dynamo.utils import counters

    os.environ[ddp.INDUCTOR_CACHE_ENV] = cache
    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=0, world_size=1)
    try:
        step, (losses, weights) = built_loop(make_model(cls=Stack), compile=True)
        Path(out).write_text(json.dumps({
            "compiled": step.compiled, "losses": losses,
            "weights": torch.cat([w.detach().flatten() for w in weights]).tolist(),
            "graphs_compiled": counters["inductor"]["fxgraph_cache_miss"],
            "graphs_loaded": counters["inductor"]["fxgraph_cache_hit"]}))
    finally:
        dist.destroy_process_group()


def test_a_restart_that_finds_the_jobs_cache_folder_loads_every_graph_instead_of_compiling(
    tmp_path: Path,
) -> None:
    """A restart on a spare node compiles anew from its own empty folder; one whose job
    names a folder every node sees (``env: {TORCHINDUCTOR_CACHE_DIR: ...}``) loads
    what the first start compiled and trains the same."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    cache = tmp_path / "shared" / "inductor"
    starts = []
    for attempt in range(2):  # each a fresh process, as a restart is
        out = tmp_path / f"attempt{attempt}.json"
        process = spawn.Process(target=restarted_compile, args=(str(cache), str(out)))
        assert exit_codes([process]) == [0], f"attempt {attempt} failed: see its stderr above"
        starts.append(json.loads(out.read_text()))
    first, restart = starts
    assert first["compiled"] and restart["compiled"]
    assert first["graphs_compiled"] > 0 and first["graphs_loaded"] == 0
    assert restart["graphs_compiled"] == 0 and restart["graphs_loaded"] == first["graphs_compiled"]
    assert restart["losses"] == first["losses"] and restart["weights"] == first["weights"]


def two_ranks_check(rank: int) -> None:
    """The compiled step keeps DDP and equals the plain loop over compile_model, on this rank."""
    torch._dynamo.reset()
    # Repeated blocks: DDP compiled around blocks compiled once (ddp.compile_model).
    reference = make_model(cls=Stack)
    want = plain_loop(reference, ddp.compile_model(reference), torch.compile(F.mse_loss), seed=1 + rank)
    model = make_model(cls=Stack)
    assert ddp.compile_target(model) is model  # two ranks: DDP's all-reduce matters
    step, got = built_loop(model, seed=1 + rank, compile=True)
    assert step.compiled is True and same(got, want)
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    theirs = [torch.zeros_like(mine) for _ in range(2)]
    dist.all_gather(theirs, mine)
    assert torch.equal(theirs[0], theirs[1])  # each rank's own batches, the same weights


def two_ranks_train(rank: int, store: str) -> None:
    """One rank of two (gloo). The step, its DDP and the compiled code that hold the
    process group are freed before the group is destroyed: a group a DDP still holds
    lives on to the interpreter's exit, where gloo's threads can abort it."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        two_ranks_check(rank)
        torch._dynamo.reset()
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_on_two_ranks_the_compiled_step_keeps_ddp_and_equals_the_compiled_loop(tmp_path: Path) -> None:
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    ranks = [spawn.Process(target=two_ranks_train, args=(rank, str(tmp_path / "store"))) for rank in range(2)]
    assert exit_codes(ranks) == [0, 0], "a rank failed: see its stderr above"


def test_the_longest_run_of_one_block_class_is_the_models_repeated_blocks() -> None:
    stack = Stack(depth=4)
    assert ddp.repeated_blocks(stack) == list(stack.blocks)
    # A Sequential of layers without modules of their own (Linear, GELU) repeats no block.
    assert ddp.repeated_blocks(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8))) == []
    assert ddp.repeated_blocks(Net()) == []
    assert ddp.repeated_blocks(nn.ModuleList([Layer(), Net()])) == []  # two classes: no run


class CountingBackend:
    """A torch.compile backend that runs each graph as traced and counts them."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        self.graphs += 1
        return gm.forward


@pytest.mark.parametrize("depth", [2, 5])
def test_each_repeated_block_is_compiled_once_and_the_rest_around_them(depth: int) -> None:
    torch.manual_seed(0)
    model = Stack(depth)
    x = torch.randn(6, 8)
    model.eval()  # dropout off: the compiled model's output can be compared with the model's
    backend = CountingBackend()
    forward = ddp.compile_model(model, backend=backend)
    assert torch.equal(forward(x), model(x))
    # Before the blocks, one block for all of them, after them: 3 graphs at any depth.
    assert backend.graphs == 3
    assert all("forward" not in vars(block) for block in model.blocks)  # the model as it was
    whole = CountingBackend()
    torch._dynamo.reset()
    assert torch.equal(ddp.compile_model(model, backend=whole, fullgraph=True)(x), model(x))
    assert whole.graphs == 1


def test_a_forward_set_on_a_block_itself_is_put_back_after_the_compiled_model_runs() -> None:
    model = Stack().eval()
    first = model.blocks[0]
    own = first.forward  # a bound method, set on the block as a hook library would
    first.forward = own  # type: ignore[method-assign]
    ddp.compile_model(model, backend=CountingBackend())(torch.randn(6, 8))
    assert vars(first)["forward"] == own
    assert all("forward" not in vars(block) for block in model.blocks[1:])


def test_regions_entered_inside_themselves_leave_the_blocks_as_they_were() -> None:
    model = Stack().eval()
    regions = Regions(list(model.blocks), {"backend": CountingBackend()})
    with regions:
        with regions:
            pass
        assert all(vars(block)["forward"] is regions.forwards[block] for block in model.blocks)
    assert all("forward" not in vars(block) for block in model.blocks)


def test_a_copy_of_a_model_compiled_by_regions_runs_its_own_parameters() -> None:
    model = Stack().eval()
    forward = ddp.compile_model(model, backend=CountingBackend())
    x = torch.randn(6, 8)
    before = forward(x)
    import copy

    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    assert not torch.equal(twin(x), before)
    assert torch.equal(forward(x), before)


def test_a_compiled_step_with_repeated_blocks_equals_the_plain_loop_over_compile_model() -> None:
    reference = make_model(cls=Stack)
    want = plain_loop(reference, ddp.compile_model(reference), torch.compile(F.mse_loss))
    uncompiled = make_model(cls=Stack)
    assert not same(plain_loop(uncompiled, uncompiled, F.mse_loss), want)  # the comparison can tell
    step, got = built_loop(make_model(cls=Stack), compile=True)
    assert step.compiled is True and same(got, want)
