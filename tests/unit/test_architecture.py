"""The package's rooms keep their boundaries (docs/architecture.md), checked on the code.

Every import of every module counts, also the ones inside functions: a lazy import
still puts paramiko or a process on that path.
"""
from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "cluster_kit"

# Which modules may import what (module paths relative to cluster_kit/, as dotted names).
RULES = {
    "paramiko": lambda module: module.startswith("ssh."),
    "subprocess": lambda module: module in ("slurm.runner", "supervisor.attempt", "supervisor.slurmctl")
    or module.startswith("node."),
    "torch": lambda module: module == "node.allreduce_sweep" or module.startswith(TORCH_TRAINER),
}
# The trainer's torch side; its other modules are stdlib-only (below).
TORCH_TRAINER = ("trainer.process_group", "trainer.profiler", "trainer.step", "trainer.checkpoint.checkpointer",
                 "trainer.checkpoint.state", "trainer.checkpoint.data", "trainer.checkpoint.sharded",
                 "trainer.checkpoint.group", "trainer.checkpoint.writer", "trainer.checkpoint.loading")
# The pure core: text and data in, text and data out; no edge module, not even lazily.
PURE = ("config.", "render.", "checks.", "report.", "fleet.audit", "fleet.facts", "hostlist", "errors",
        "slurm.builders")
EDGES = ("cluster_kit.ssh", "cluster_kit.slurm.runner", "cluster_kit.slurm.jobs", "cluster_kit.commands",
         "cluster_kit.cli", "cluster_kit.app")
# Runs inside jobs from a zip of itself and `packaging` only (checks/injob.py).
CHECKS_MAY_IMPORT = ("cluster_kit.checks", "cluster_kit.__init__", "packaging")
# Run inside jobs with the stdlib only: the trainer's stdlib side (the contract with the
# supervisor, supervision, what is trusted on disk) and the hang/crash diagnosis the
# supervisor runs from a zip app: module -> what it may import.
CONTRACT = ("cluster_kit.trainer", "cluster_kit.trainer.contract")
SUPERVISION = ("cluster_kit.trainer.supervision.files", "cluster_kit.trainer.supervision.heartbeat",
               "cluster_kit.trainer.supervision.dumps", "cluster_kit.trainer.supervision.stop",
               "cluster_kit.trainer.supervision.environment", "cluster_kit.trainer.supervision.link")
# What the supervisor's own process may reach: its room, the diagnosis and Slurm text it
# runs from its zip app, the trainer's stdlib side, the node sets.
SUPERVISOR_SIDE = ("cluster_kit.hostlist", "cluster_kit.analysis", "cluster_kit.analysis.culprit",
                   "cluster_kit.analysis.rank_files", "cluster_kit.slurm", "cluster_kit.slurm.outcome",
                   "cluster_kit.slurm.builders", "cluster_kit.slurm.node_names", "cluster_kit.supervisor",
                   "cluster_kit.trainer.checkpoint", "cluster_kit.trainer.checkpoint.interval",
                   "cluster_kit.trainer.checkpoint.status", *CONTRACT) + tuple(
    f"cluster_kit.supervisor.{m}" for m in ("private", "record", "lock", "settings", "decide", "slurmctl", "launch",
                                            "attempt", "allocation", "chain", "ending", "attempts"))
STDLIB_ONLY = {
    "trainer": (),
    "trainer.contract": (),
    "trainer.compile_options": (),
    "trainer.trust": (),
    "trainer.supervision": CONTRACT + SUPERVISION,
    **{module.replace("cluster_kit.", ""): CONTRACT + SUPERVISION for module in SUPERVISION},
    "analysis.flight_recorder": (),
    "analysis.rank_files": ("cluster_kit.analysis.flight_recorder",) + CONTRACT,
    "analysis.faults": ("cluster_kit.analysis.rank_files",),
    "analysis.culprit": ("cluster_kit.analysis.faults", "cluster_kit.analysis.flight_recorder",
                         "cluster_kit.analysis.rank_files"),
    "slurm.outcome": (),
    "slurm.builders": ("cluster_kit.slurm.outcome",),
    "slurm.node_names": ("cluster_kit.slurm.builders",),
    "supervisor": (),
    "supervisor.private": ("cluster_kit.trainer", "cluster_kit.trainer.trust"),
    "supervisor.record": ("cluster_kit.supervisor", "cluster_kit.supervisor.private"),
    "supervisor.lock": ("cluster_kit.supervisor", "cluster_kit.supervisor.private"),
    "supervisor.settings": (),
    "trainer.checkpoint.interval": (),
    "trainer.checkpoint.store": (),
    "trainer.checkpoint.fence": ("cluster_kit.trainer.checkpoint.store",),
    "trainer.checkpoint.status": ("cluster_kit.trainer.checkpoint.store",) + CONTRACT,
    "trainer.checkpoint.settings": ("cluster_kit.trainer.checkpoint.interval",) + CONTRACT,
    "trainer.checkpoint.pace": ("cluster_kit.trainer.checkpoint.interval", "cluster_kit.trainer.checkpoint.settings"),
    "supervisor.decide": ("cluster_kit.hostlist", "cluster_kit.supervisor.record", "cluster_kit.analysis.culprit",
                          "cluster_kit.slurm.outcome", *CONTRACT),
    "supervisor.slurmctl": ("cluster_kit.hostlist", "cluster_kit.supervisor", "cluster_kit.supervisor.decide"),
    "hostlist": (),
    "supervisor.attempt": ("cluster_kit.analysis", "cluster_kit.analysis.culprit", "cluster_kit.analysis.rank_files",
                           "cluster_kit.supervisor", "cluster_kit.supervisor.decide",
                           "cluster_kit.supervisor.slurmctl") + CONTRACT,
    "supervisor.launch": ("cluster_kit.hostlist",),
    "supervisor.allocation": ("cluster_kit.hostlist", "cluster_kit.supervisor", "cluster_kit.supervisor.slurmctl",
                              "cluster_kit.supervisor.attempt"),
    **{module: SUPERVISOR_SIDE for module in ("supervisor.chain", "supervisor.ending", "supervisor.attempts",
                                              "supervisor.job")},
}

# The layers, lowest first (docs/architecture.md): a room imports only from rooms of
# lower layers, and from itself. `cluster_kit` (the package's __init__: its version and
# the names it loads lazily) stands outside the order.
LAYERS = (
    ("errors",),  # the error classes and the one sanitizer
    ("hostlist", "text", "trainer", "node"),  # stdlib leaves, and what a training script imports
    ("checks", "analysis", "ddp", "checkpoint"),  # facts -> findings, traces -> breakdowns; the trainer's public paths
    ("config",),  # files -> validated profiles and jobs -> effective settings
    ("ssh",),  # paramiko: connections, fan-out
    ("slurm",),  # sbatch/squeue/scontrol text, and the runner that runs them
    ("supervisor", "fleet"),  # a job's supervisor; preflight, audit, routing over nodes
    ("render",),  # effective settings -> sbatch scripts
    ("report",),  # findings and audits -> tables, JSON, Markdown, HTML
    ("lifecycle",),  # submit, follow, diagnose a job
    ("app",),  # the command context
    ("api",),  # cluster_kit.submit, Job, ...: the Python API over lifecycle
    ("commands",),
    ("cli",),
    ("__main__",),
)


def imports_of(tree: ast.AST, module: str) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in the tree, relative ones made absolute."""
    package = ["cluster_kit", *module.split(".")[:-1]]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            yield node.lineno, base
            if base == "cluster_kit" or (node.level and not node.module):
                for alias in node.names:
                    yield node.lineno, f"{base}.{alias.name}"


def modules() -> list[tuple[str, ast.AST]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"
        found.append((name, ast.parse(path.read_text(), str(path))))
    return found


def violations(found: list[tuple[str, ast.AST]]) -> list[str]:
    """Every import that crosses a boundary, as `module:line imports name (why)`."""
    problems: dict[tuple[str, int, str], str] = {}
    for module, tree in found:
        for line, imported in imports_of(tree, module):
            top = imported.split(".")[0]
            where = f"cluster_kit.{module}:{line} imports {imported}"
            if top in RULES and not RULES[top](module):
                problems.setdefault((module, line, top), f"{where} (only {top}'s own rooms may)")
            if module.startswith("node.") and top == "cluster_kit":
                problems.setdefault((module, line, "node"), f"{where} (node scripts run where clusterkit is not installed)")
            if (module == "trainer" or module.startswith("trainer.")) and top == "cluster_kit" \
                    and not imported.startswith("cluster_kit.trainer"):
                problems.setdefault((module, line, "trainer"),
                                    f"{where} (the trainer imports only the stdlib, torch and itself)")
            if module.startswith(PURE) and imported.startswith(EDGES):
                problems.setdefault((module, line, "pure"), f"{where} (the pure core reaches no edge)")
            if module in STDLIB_ONLY and top not in _STDLIB and imported not in STDLIB_ONLY[module]:
                problems.setdefault((module, line, "stdlib"),
                                    f"{where} (runs inside jobs with the stdlib only)")
            in_checks = module.startswith("checks.") or module == "checks"
            if in_checks and top not in _STDLIB and not imported.startswith(CHECKS_MAY_IMPORT):
                problems.setdefault((module, line, "checks"),
                                    f"{where} (checks run inside jobs with the stdlib and packaging only)")
            if (why := layer_crossing(module, imported)) is not None:
                problems.setdefault((module, line, "layer"), f"{where} ({why})")
    return list(problems.values())


_LAYER_OF = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}


def layer_crossing(module: str, imported: str) -> str | None:
    """Why importing `imported` from `module` climbs the layers, or None."""
    room, parts = module.split(".")[0], imported.split(".")
    if parts[0] != "cluster_kit" or len(parts) < 2 or room == "__init__":
        return None
    target = parts[1]
    if target == room or target not in _LAYER_OF:
        return None
    if room not in _LAYER_OF:
        return f"{room} has no layer: add it to LAYERS"
    if _LAYER_OF[target] >= _LAYER_OF[room]:
        return f"layer {_LAYER_OF[room]} ({room}) may not import layer {_LAYER_OF[target]} ({target})"
    return None


_STDLIB = set(sys.stdlib_module_names)


def test_the_package_keeps_its_boundaries() -> None:
    assert violations(modules()) == []


def test_the_layout_is_the_documented_one() -> None:
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert {"commands", "config", "render", "slurm", "ssh", "checks", "fleet", "report", "node"} <= rooms
    assert (PACKAGE / "ddp.py").exists()  # the public import path of training scripts (SPEC)
    assert (PACKAGE / "checkpoint" / "__init__.py").exists() and "trainer" in rooms


@pytest.mark.parametrize("module, source, why", [
    ("text", "import paramiko\n", "paramiko"),
    ("config.load", "def f():\n    import subprocess\n", "subprocess"),
    ("node.probe", "from cluster_kit import errors\n", "node scripts"),
    ("render.environment", "from cluster_kit.ssh import fanout\n", "pure core"),
    ("fleet.facts", "import torch\n", "torch"),
    ("checks.gpu", "import yaml\n", "checks run inside jobs"),
    ("trainer.supervision.heartbeat", "import numpy\n", "stdlib only"),
    ("trainer.step.loop", "from cluster_kit.config import load\n", "the trainer imports only"),
    ("trainer.contract", "import torch\n", "torch"),
    ("analysis.culprit", "from cluster_kit.analysis import traces\n", "stdlib only"),
    ("analysis.flight_recorder", "from . import rank_files\n", "stdlib only"),
    ("config.effective", "from cluster_kit.render import jobscript\n", "layer 3 (config) may not import layer 7"),
    ("report.audit", "def f():\n    from cluster_kit.lifecycle import follow\n", "(report) may not import"),
    ("fleet.routing", "from cluster_kit.supervisor import decide\n", "layer 6 (fleet) may not import layer 6"),
    ("text", "from cluster_kit.checks.findings import STATUS_ORDER\n", "layer 1 (text)"),
])
def test_a_crossing_is_reported(module: str, source: str, why: str) -> None:
    found = violations([(module, ast.parse(source))])
    assert any(why in problem for problem in found), found


def test_the_edges_may_do_their_job() -> None:
    allowed = [("ssh.connect", "import paramiko\n"), ("slurm.runner", "import subprocess\n"),
               ("node.allreduce_sweep", "import torch\n"), ("trainer.step.graphed", "import torch\n"),
               ("commands.jobs", "from cluster_kit.slurm import jobs\n")]
    assert violations([(m, ast.parse(s)) for m, s in allowed]) == []


# ----------------------------------------------------------------------------
# Seams: `_names` stay in their module; modules import in one direction


def private_imports(found: list[tuple[str, ast.AST]]) -> list[str]:
    """Every `from <package module> import _name` (dunders aside), as `module:line imports name`."""
    problems = []
    for module, tree in found:
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _absolute_base(node, module)
            if not base.startswith("cluster_kit"):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not (alias.name.startswith("__") and alias.name.endswith("__")):
                    problems.append(f"cluster_kit.{module}:{node.lineno} imports {base}.{alias.name} "
                                    "(a private name: make it public or keep it in its module)")
    return problems


def _absolute_base(node: ast.ImportFrom, module: str) -> str:
    """The module an ImportFrom reads from, made absolute: what imports_of yields first for it."""
    return next(imported for line, imported in imports_of(ast.Module([node], []), module))


def import_graph(found: list[tuple[str, ast.AST]]) -> dict[str, set[str]]:
    """module -> the package's modules it imports (any import, lazy or TYPE_CHECKING ones too).

    `from a import b` counts as importing module `a.b` where there is one, else `a`.
    """
    names = {module for module, _ in found}
    graph: dict[str, set[str]] = {module: set() for module in names}
    for module, tree in found:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    graph[module] |= _package_modules(alias.name, names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute_base(node, module)
                for alias in node.names:
                    submodule = _strip(f"{base}.{alias.name}")
                    graph[module] |= {submodule} if submodule in names else _package_modules(base, names)
    for module, imported in graph.items():
        imported.discard(module)
    return graph


def _strip(imported: str) -> str:
    return "__init__" if imported == "cluster_kit" else imported.removeprefix("cluster_kit.")


def _package_modules(imported: str, names: set[str]) -> set[str]:
    """The package module `imported` names, or the one it names a member of."""
    if imported != "cluster_kit" and not imported.startswith("cluster_kit."):
        return set()
    name = _strip(imported)
    while name not in names and "." in name:
        name = name.rsplit(".", 1)[0]
    return {name} & names


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Each group of modules that import one another in a loop (strongly connected, Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(frozenset(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles




def test_no_module_imports_another_modules_private_names() -> None:
    assert private_imports(modules()) == []


def test_modules_import_one_another_in_one_direction() -> None:
    assert import_cycles(import_graph(modules())) == []


@pytest.mark.parametrize("module, source", [
    ("ssh.fanout", "from cluster_kit.ssh.deadlines import _close_quietly\n"),
    ("config.load", "def f():\n    from cluster_kit.config.search import _same_file\n"),
    ("ssh.session", "from .hosts import _run_on\n"),
    ("report.text", "from cluster_kit.report import _rows\n"),
])
def test_a_private_import_is_reported(module: str, source: str) -> None:
    found = private_imports([(module, ast.parse(source))])
    assert len(found) == 1 and "private name" in found[0], found


def test_a_dunder_import_is_not_private() -> None:
    assert private_imports([("cli", ast.parse("from cluster_kit import __version__\n"))]) == []


@pytest.mark.parametrize("sources, cycle", [
    ({"ssh.hosts": "from cluster_kit.ssh.connect import connect_endpoint\n",
      "ssh.connect": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from cluster_kit.ssh.hosts import connect_host\n"},
     {"ssh.hosts", "ssh.connect"}),
    ({"fleet.preflight": "def f():\n    from cluster_kit import report\n",
      "report": "from cluster_kit.report import text\n",
      "report.text": "from ..fleet import preflight\n"},
     {"fleet.preflight", "report", "report.text"}),
    ({"config.load": "from . import effective\n",
      "config.effective": "import cluster_kit.config.load\n"},
     {"config.load", "config.effective"}),
])
def test_an_import_cycle_is_reported(sources: dict[str, str], cycle: set[str]) -> None:
    found = [(module, ast.parse(source)) for module, source in sources.items()]
    assert import_cycles(import_graph(found)) == [frozenset(cycle)]


# ----------------------------------------------------------------------------
# Surfaces: what another room imports from a package is in the package's `__all__`


def surfaces(found: list[tuple[str, ast.AST]]) -> dict[str, list[str] | None]:
    """package -> the names its `__init__` lists in `__all__` (None: it lists none).

    A package is a module with modules under it.
    """
    names = {module for module, _ in found}
    return {module: _listed(tree) for module, tree in found
            if any(name.startswith(f"{module}.") for name in names)}


def _listed(tree: ast.AST) -> list[str] | None:
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return None


def crossings(found: list[tuple[str, ast.AST]]) -> Iterator[tuple[str, int, str, str]]:
    """(module, line, package, name) for every import from outside a package that names
    what is in it: `import cluster_kit.pkg.name`, `from cluster_kit.pkg.name... import x`,
    `from cluster_kit.pkg import name`, and `pkg.name` after `from cluster_kit import pkg`.
    """
    for module, tree in found:
        room = module.split(".")[0]
        aliases: dict[str, str] = {}  # bound by `from cluster_kit import pkg [as alias]`: alias -> pkg
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                paths = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute_base(node, module)
                paths = [f"{base}.{alias.name}" for alias in node.names] if base.count(".") == 1 else [base]
                if base == "cluster_kit":
                    aliases.update({alias.asname or alias.name: alias.name for alias in node.names})
            else:
                continue
            for parts in (path.split(".") for path in paths):
                if parts[0] == "cluster_kit" and len(parts) > 2 and parts[1] != room:
                    yield module, node.lineno, parts[1], parts[2]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and aliases.get(node.value.id, room) != room):
                yield module, node.lineno, aliases[node.value.id], node.attr


def surface_violations(found: list[tuple[str, ast.AST]], surface: dict[str, list[str] | None]) -> list[str]:
    """Every crossing that names what its package does not list, as `module:line imports name`."""
    return [f"cluster_kit.{module}:{line} imports cluster_kit.{package}.{name} (not in {package}/__init__.py's "
            "__all__: use what it lists, or list it there if other rooms should use it)"
            for module, line, package, name in crossings(found)
            if package in surface and name not in (surface[package] or [])]


def unlisted_surfaces(found: list[tuple[str, ast.AST]]) -> list[str]:
    """Each package without an `__all__`, and each listed name that is neither one of its
    modules nor a name its `__init__` binds (ssh's lazy names are bound by its TYPE_CHECKING imports)."""
    defined = {module: _defined(tree) for module, tree in found}
    problems = []
    for package, names in surfaces(found).items():
        if not names:
            problems.append(f"cluster_kit.{package} lists no __all__ (the modules and names other rooms may import)")
        problems += [f"cluster_kit.{package} lists {name}, which is neither its module nor a name it defines"
                     for name in names or [] if name not in defined[package] and f"{package}.{name}" not in defined]
    return problems


def _defined(tree: ast.AST) -> set[str]:
    """The names a module binds: definitions and assignments at its top, imports anywhere."""
    names = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
             if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def test_every_package_lists_its_surface() -> None:
    assert unlisted_surfaces(modules()) == []


def test_rooms_import_only_what_a_package_lists() -> None:
    assert surface_violations(modules(), package_surfaces()) == []


@functools.cache
def package_surfaces() -> dict[str, list[str] | None]:
    """The package's own surfaces, read once for the planted tests."""
    return surfaces(modules())


@pytest.mark.parametrize("module, source, name", [
    ("commands.jobs", "from cluster_kit.lifecycle.outcome import FORGOTTEN\n", "cluster_kit.lifecycle.outcome"),
    ("render.environment", "def f():\n    from cluster_kit.config import yamlfile\n", "cluster_kit.config.yamlfile"),
    ("app", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cluster_kit.ssh.settings import Hop\n",
     "cluster_kit.ssh.settings"),
    ("fleet.preflight", "import cluster_kit.checks.gpu\n", "cluster_kit.checks.gpu"),
    ("commands.audit", "from ..report import html\n", "cluster_kit.report.html"),
    ("fleet.preflight", "from cluster_kit.checks import worst\n", "cluster_kit.checks.worst"),
    ("commands.jobs", "from cluster_kit import lifecycle\nlifecycle.outcome.FORGOTTEN\n", "cluster_kit.lifecycle.outcome"),
])
def test_an_unlisted_crossing_is_reported(module: str, source: str, name: str) -> None:
    found = surface_violations([(module, ast.parse(source))], package_surfaces())
    assert len(found) == 1 and f"imports {name} (not in" in found[0], found


def test_listed_names_and_a_rooms_own_modules_may_be_imported() -> None:
    allowed = [("commands.jobs", "from cluster_kit import lifecycle\nfrom cluster_kit.lifecycle import records\n"
                                 + "lifecycle.submit_job\n"),
               ("fleet.preflight", "from cluster_kit.checks import evaluate\nfrom cluster_kit.checks.findings import with_fix\n"),
               ("config.load", "from cluster_kit.config.yamlfile import load_yaml\nfrom . import problems\n"),
               ("app", "from cluster_kit.ssh import SshSettings\nimport cluster_kit.slurm.runner\n")]
    assert surface_violations([(m, ast.parse(s)) for m, s in allowed], package_surfaces()) == []


@pytest.mark.parametrize("init, why", [
    ('"""A room."""\n', "lists no __all__"),
    ('__all__ = ["load", "loader"]\n', "lists loader, which is neither"),
    (('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .load import load_job\n'
      '__all__ = ["load", "load_job", "load_profile"]\n'), "lists load_profile, which is neither"),
])
def test_a_package_that_does_not_list_what_is_there_is_reported(init: str, why: str) -> None:
    found = unlisted_surfaces([("config", ast.parse(init)), ("config.load", ast.parse("def load_job(): ...\n"))])
    assert len(found) == 1 and why in found[0], found


def test_test_files_have_unique_basenames() -> None:
    """pytest imports test modules by basename: two files of one name stop the whole run."""
    tests = PACKAGE.parent / "tests"
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


# The house's sizes (docs/architecture.md): small modules in folders that show the
# architecture. node/probe.py is the one exception: it is shipped to the nodes as one file.
MAX_TOP_MODULES = 8
MAX_FILE_LINES = 600
ONE_FILE = ("node/probe.py",)
MAX_CLASS_LINES = 250
MAX_SUPERVISOR_PARAMETERS = 5


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return len(names) - (1 if names[:1] in (["self"], ["cls"]) else 0)


def test_the_package_top_holds_few_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of cluster_kit/: {top}; put them in rooms"


def test_no_file_or_class_grows_past_its_size() -> None:
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES and name not in ONE_FILE:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                too_long.append(f"{name}: class {node.name}: {node.end_lineno - node.lineno + 1} lines")
            if name.startswith("supervisor/") and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and _parameters(node) > MAX_SUPERVISOR_PARAMETERS:
                too_long.append(f"{name}: {node.name} takes {_parameters(node)} parameters")
    assert too_long == []


@pytest.mark.parametrize("source, expected", [
    ("def f(a, b, c, d, e, f):\n    pass\n", 6),
    ("class A:\n    def m(self, a, *, b):\n        pass\n", 2),
])
def test_parameters_are_counted_without_self(source: str, expected: int) -> None:
    function = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef))
    assert _parameters(function) == expected
