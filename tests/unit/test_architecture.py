"""The package's rooms keep their boundaries (docs/architecture.md), checked on the code.

Every import of every module counts, also the ones inside functions: a lazy import
still puts paramiko or a process on that path.
"""
from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "cluster_kit"

# Which modules may import what (module paths relative to cluster_kit/, as dotted names).
RULES = {
    "paramiko": lambda module: module.startswith("ssh."),
    "subprocess": lambda module: module in ("slurm.runner", "supervisor.job") or module.startswith("node."),
    "torch": lambda module: module in ("ddp", "node.allreduce_sweep"),
}
# The pure core: text and data in, text and data out; no edge module, not even lazily.
PURE = ("config.", "render.", "checks.", "report.", "fleet.audit", "fleet.facts", "hostlist", "errors",
        "slurm.builders")
EDGES = ("cluster_kit.ssh", "cluster_kit.slurm.runner", "cluster_kit.slurm.jobs", "cluster_kit.commands",
         "cluster_kit.cli", "cluster_kit.app")
# Runs inside jobs from a zip of itself and `packaging` only (checks/injob.py).
CHECKS_MAY_IMPORT = ("cluster_kit.checks", "cluster_kit.__init__", "packaging")
# Run inside jobs with the stdlib only: the trainer side (loaded by path beside ddp.py)
# and the hang/crash diagnosis the supervisor runs from a zip app: module -> what it may import.
STDLIB_ONLY = {
    "supervision": (),
    "analysis.flight_recorder": (),
    "analysis.rank_files": ("cluster_kit.analysis.flight_recorder",),
    "analysis.culprit": ("cluster_kit.analysis.flight_recorder", "cluster_kit.analysis.rank_files"),
    "slurm.outcome": (),
    "supervisor": (),
    "supervisor.record": (),
    "supervisor.decide": ("cluster_kit.hostlist", "cluster_kit.supervisor.record"),
    "hostlist": (),
    "supervisor.job": ("cluster_kit.hostlist", "cluster_kit.analysis", "cluster_kit.analysis.culprit", "cluster_kit.analysis.rank_files",
                       "cluster_kit.slurm", "cluster_kit.slurm.outcome", "cluster_kit.supervisor",
                       "cluster_kit.supervisor.decide", "cluster_kit.supervisor.record"),
}

# The layers, lowest first (docs/architecture.md): a room imports only from rooms of
# lower layers, and from itself. `cluster_kit` (the package's __init__: its version and
# the names it loads lazily) stands outside the order.
LAYERS = (
    ("errors",),  # the error classes and the one sanitizer
    ("hostlist", "text", "supervision", "node"),  # stdlib leaves
    ("checks", "analysis", "ddp"),  # facts -> findings, traces -> breakdowns, the trainer's side
    ("config",),  # files -> validated profiles and jobs -> effective settings
    ("ssh",),  # paramiko: connections, fan-out
    ("slurm",),  # sbatch/squeue/scontrol text, and the runner that runs them
    ("supervisor", "fleet"),  # a job's supervisor; preflight, audit, routing over nodes
    ("render",),  # effective settings -> sbatch scripts
    ("report",),  # findings and audits -> tables, JSON, Markdown, HTML
    ("lifecycle",),  # submit, follow, diagnose a job
    ("app",),  # the command context
    ("commands", "docs_reference"),
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


@pytest.mark.parametrize("module, source, why", [
    ("report.text", "import paramiko\n", "paramiko"),
    ("config.load", "def f():\n    import subprocess\n", "subprocess"),
    ("node.probe", "from cluster_kit import errors\n", "node scripts"),
    ("render.environment", "from cluster_kit.ssh import fanout\n", "pure core"),
    ("fleet.facts", "import torch\n", "torch"),
    ("checks.gpu", "import yaml\n", "checks run inside jobs"),
    ("supervision", "import numpy\n", "stdlib only"),
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
               ("node.allreduce_sweep", "import torch\n"), ("ddp", "import torch\n"),
               ("commands.jobs", "from cluster_kit.slurm import jobs\n")]
    assert violations([(m, ast.parse(s)) for m, s in allowed]) == []
