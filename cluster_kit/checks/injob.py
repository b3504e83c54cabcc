"""In-job preflight: the checks travel inside the sbatch script as a zip app.

At render time `checks_source(profile)` packs `cluster_kit.checks` (and the pure
`packaging` it uses) plus the resolved profile into a base64 zip; the script
decodes it and runs it with the job's Python over the facts that the probe
printed on every allocated node. Nothing needs to be installed on the nodes.

`main` runs on the node: stdlib only at import time.
"""
from __future__ import annotations

import base64
import io
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

MAIN = """import json, sys
from cluster_kit.checks.injob import main
sys.exit(main(json.loads({profile!r}), sys.argv[1:]))
"""


def _package_files(package: str) -> list[tuple[str, Path]]:
    """(archive name, path) of every .py file of an importable package."""
    module = __import__(package)
    root = Path(str(module.__file__)).parent
    return [(f"{package}/{p.relative_to(root).as_posix()}", p) for p in sorted(root.rglob("*.py"))]


def build_bundle(profile: dict[str, Any]) -> bytes:
    """The zip app (bytes) that evaluates the profile's checks on probe facts."""
    checks = Path(__file__).parent  # this module is one of the checks package
    files = [("cluster_kit/__init__.py", checks.parent / "__init__.py")]
    files += [(f"cluster_kit/checks/{p.name}", p) for p in sorted(checks.glob("*.py"))]
    files += _package_files("packaging")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        # ZipInfo's own time stamp (1980-01-01), not the clock's as writestr(name) takes:
        # the same profile renders the same job script, whenever it is rendered
        main = zipfile.ZipInfo("__main__.py")
        zf.writestr(main, MAIN.format(profile=json.dumps(profile, sort_keys=True)),
                    compress_type=zipfile.ZIP_DEFLATED)
        for name, path in files:
            zf.write(path, name)
    return buf.getvalue()


def checks_source(profile: dict[str, Any]) -> str:
    """The bundle as base64 text in 76-column lines, for a quoted heredoc."""
    return base64.encodebytes(build_bundle(profile)).decode("ascii")


def read_facts(text: str) -> dict[str, dict[str, Any]]:
    """{slurm node name: facts} from the probe's JSON lines (other lines ignored)."""
    facts: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            node = json.loads(line)
        except ValueError:
            continue
        facts[node.get("slurm_node") or node.get("hostname", "?")] = node
    return facts


def verdicts(facts: dict[str, dict[str, Any]], nodes: list[str],
             profile: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """(node, status, problem lines) per expected node; a silent node fails."""
    from cluster_kit.checks import evaluate, node_status
    from cluster_kit.checks.findings import with_fix

    out = []
    for node in nodes:
        if node not in facts:
            out.append((node, "fail", ["probe.run: the probe printed nothing on this node"]))
            continue
        # deep: the job's probe imported torch with the job's python (nccl.torch)
        findings = [f for f in evaluate(facts[node], profile, deep=True) if f.status != "pass"]
        lines = [f"{f.id}: {with_fix(f.message, f.fix)}" for f in findings]
        out.append((node, node_status(findings), lines))
    return out


def main(profile: dict[str, Any], argv: list[str]) -> int:
    """`checks.pyz FACTS_FILE NODE...`: print a line per node, exit 1 on any failure."""
    facts = read_facts(Path(argv[0]).read_text())
    failed = 0
    for node, status, lines in verdicts(facts, argv[1:], profile):
        failed += status == "fail"
        print(f"clusterkit preflight: {node}: {status}", file=sys.stderr)
        for line in lines:
            print(f"clusterkit preflight:   {line}", file=sys.stderr)
    return 1 if failed else 0
