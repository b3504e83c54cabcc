"""The generated parts of docs/reference.md, from the code that owns each fact.

docs/reference.md is written by hand except for its blocks between
`<!-- generated: NAME -->` and `<!-- end: NAME -->`, which this module writes:
the key tables from config/specs.py through config/json_schema.py (the same
walk and fragments as `clusterkit schema`), sbatch and NCCL words from
config/vocab.py, check ids from the findings the package builds (every
`Finding`/`passed`/`failed`/`warned` call with a literal id), and the
defaults of the checks that own them.

    .venv/bin/python scripts/docs_reference.py          # rewrite docs/reference.md
    .venv/bin/python scripts/docs_reference.py --check  # exit 1 when it is stale

A tool of the repository, not of the package: it reads the package's rooms from above.
"""
from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster_kit.checks.gpu_health import RESET_XIDS
from cluster_kit.checks.nvlink import DEFAULT_NVLINK_THRESHOLDS
from cluster_kit.checks.rdma_errors import DEFAULT_THRESHOLDS
from cluster_kit.config import json_schema, specs, vocab
from cluster_kit.config import spec as config_spec

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cluster_kit"
REFERENCE = ROOT / "docs" / "reference.md"
BLOCK = re.compile(r"(<!-- generated: ([a-z-]+) -->\n)(.*?)(<!-- end: \2 -->)", re.DOTALL)
FINDING_CALLS = ("Finding", "passed", "failed", "warned")
CHECK_ID = re.compile(r"[a-z]+\.[a-z_]+\Z")


# ---------------------------------------------------------------- key tables


def type_text(fragment: dict[str, Any]) -> str:
    """A JSON Schema fragment of one key in a few words: `integer 1 to 65535`."""
    if "anyOf" in fragment:
        return _any_of_text(fragment["anyOf"])
    if "enum" in fragment:
        return "one of " + ", ".join(f"`{value}`" for value in fragment["enum"])
    kind = fragment.get("type")
    if kind == "array":
        return "list of " + _plural(type_text(fragment.get("items", {})))
    if kind == "object":
        return "mapping of NAME: " + type_text(_map_value(fragment))
    if isinstance(kind, list):
        return " or ".join(kind)
    return _bounded(str(kind or "any value"), fragment)


def _any_of_text(options: Sequence[dict[str, Any]]) -> str:
    """Alternatives; a case-insensitive spelling of an enum reads as `(any case)`."""
    enums = [option for option in options if "enum" in option]
    rest = [option for option in options if "enum" not in option]
    if enums and rest and all(option.get("type") == "string" for option in rest):
        return type_text(enums[0]) + " (any case)"
    return " or ".join(dict.fromkeys(type_text(option) for option in options))


def _bounded(kind: str, fragment: dict[str, Any]) -> str:
    low, high = fragment.get("minimum"), fragment.get("maximum")
    if low is not None and high is not None:
        return f"{kind} {low} to {high}"
    if low is not None:
        return f"{kind} >= {low}"
    if fragment.get("exclusiveMinimum") is not None:
        return f"{kind} > {fragment['exclusiveMinimum']}"
    return kind


def _plural(text: str) -> str:
    """ "string or number" -> "strings or numbers" (the items of a list)."""
    words = ("string", "integer", "number", "boolean")
    return " ".join(f"{word}s" if word in words else word for word in text.split(" "))


def _map_value(fragment: dict[str, Any]) -> dict[str, Any]:
    """The value fragment of an open mapping, or of one with a fixed set of names."""
    if isinstance(fragment.get("additionalProperties"), dict):
        return dict(fragment["additionalProperties"])
    return dict(next(iter(fragment.get("properties", {}).values()), {}))


def default_text(spec: config_spec.Spec, path: str, required: Sequence[str]) -> str:
    """The Default column: `required`, the spec's default, or empty."""
    if path in required:
        section, _, _ = path.rpartition(".")
        return f"**required** in `{section}`" if section else "**required**"
    if isinstance(spec, config_spec.Section) and spec.shorthand is not None:
        spec = spec.shorthand
    default = getattr(spec, "default", None)
    if isinstance(spec, config_spec.Field) and default is not None:
        return f"`{json.dumps(default)}`" if not isinstance(default, str) else f"`{default}`"
    return ""


def required_paths(kind: str) -> list[str]:
    """Keys a file of this kind must have (sections' own required keys, when present)."""
    if kind != "job":
        return []
    return [*specs.JOB_REQUIRED, *(f"container.{key}" for key in specs.CONTAINER_REQUIRED)]


def key_rows(kind: str) -> Iterator[list[str]]:
    """One row per named key path of a profile or job: key, type, default, meaning."""
    root = specs.PROFILE if kind == "profile" else specs.JOB
    required = required_paths(kind)
    for path in json_schema.spec_paths(root):
        spec = _spec_at(root, path)
        dotted = ".".join(path)
        kind_text = section_text(spec) if isinstance(spec, config_spec.Section) else \
            type_text(json_schema.node_schema(spec, kind, path))
        meaning = specs.describe(kind, dotted) or ""
        yield [f"`{dotted}`", kind_text, default_text(spec, dotted, required), meaning]


def section_text(spec: config_spec.Section) -> str:
    """`section`, or `boolean or section` for one with a shorthand scalar."""
    if spec.shorthand is None:
        return "section"
    return f"{type_text(json_schema.field_schema(spec.shorthand))} or section"


def _spec_at(root: config_spec.Section, path: Sequence[str]) -> config_spec.Spec:
    spec: config_spec.Spec = root
    for key in path:
        assert isinstance(spec, config_spec.Section)
        spec = spec.fields[key]
    return spec


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; `|` inside a cell is escaped."""
    def cells(row: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
    return "\n".join([cells(headers), "|" + " --- |" * len(headers), *(cells(row) for row in rows)])


def profile_keys() -> str:
    """The profile's key table."""
    return table(["key", "type", "default", "meaning"], list(key_rows("profile")))


def job_keys() -> str:
    """The job file's key table."""
    return table(["key", "type", "default", "meaning"], list(key_rows("job")))


# ---------------------------------------------------------------- sbatch and NCCL words


def sbatch_owned() -> str:
    """The sbatch options clusterkit writes itself, and where each comes from."""
    rows = [[f"`--{vocab.sbatch_option(key)}`", f"its own key: `slurm.{key}`"] for key in specs.SLURM_NAMED]
    rows += [[f"`--{option}`", source] for option, source in vocab.SBATCH_MANAGED.items()]
    return table(["option", "set from"], sorted(rows))


def sbatch_passthrough() -> str:
    """Every option the pass-through accepts, in sbatch's dashed spelling."""
    options = [key for key in specs.allowed_sbatch_keys() if "_" not in key]
    return _word_list(options)


def nccl_variables() -> str:
    """The names `nccl_env` accepts, and those that have their own key."""
    owned = table(["variable", "set from"], [[f"`{name}`", f"`{source}`" if " " not in source else source]
                                             for name, source in vocab.NCCL_OWNED.items()])
    accepted = _word_list(sorted(vocab.NCCL_VARIABLES - set(vocab.NCCL_OWNED)))
    return f"{owned}\n\nAccepted in `nccl_env`:\n\n{accepted}"


def _word_list(words: Sequence[str], width: int = 100) -> str:
    """Words in backticks, comma-separated, wrapped to lines of about `width` characters."""
    lines: list[str] = []
    line = ""
    for word in words:
        item = f"`{word}`"
        if line and len(line) + len(item) + 2 > width:
            lines.append(line + ",")
            line = item
        else:
            line = f"{line}, {item}" if line else item
    return "\n".join(lines + [line + "."]) if line else ""


# ---------------------------------------------------------------- check ids


def check_ids(package: Path = PACKAGE) -> list[str]:
    """Every check id the package's code emits, sorted: the literal first argument of
    each Finding/passed/failed/warned call."""
    found: set[str] = set()
    for path in sorted(package.rglob("*.py")):
        found.update(_ids_in(ast.parse(path.read_text(encoding="utf-8"), str(path))))
    return sorted(found)


def _ids_in(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        first = node.args[0]
        if name in FINDING_CALLS and isinstance(first, ast.Constant) and isinstance(first.value, str) \
                and CHECK_ID.match(first.value):
            yield first.value


GPU_HEALTH_RUNS = ("`expect` names GPUs (`gpus_per_node`, `gpu_model`, `min_driver` or `xid_window`) "
                   "and nvidia-smi lists some")
RDMA_RUNS = "`network.fabric` is `infiniband` or `roce`, or `network.ib_hca` is set"
RDMA_PORTS = ("checked ports: those of `network.ib_hca` (a bare HCA name: all its ports), where any "
              "problem fails; without it every port, where a bad port only warns")


@dataclass(frozen=True)
class CheckText:
    """What a check id means for the person reading a report."""

    runs: str     # when the check runs
    verdict: str  # what fails (and warns)


# Every check id the code emits, in the order a node's findings come (checks.evaluate).
CHECKS: dict[str, CheckText] = {
    "ssh.reachable": CheckText(
        "every node `preflight`, `audit`, `submit` or `init` reaches over SSH",
        "status `unreachable`: no TCP connection, a refused or unknown host key, failed authentication, "
        "or no answer within `ssh.connect_timeout` / `ssh.command_timeout`"),
    "probe.python": CheckText(
        "every reachable node",
        "fails: the node has neither `python3` nor `platform-python` to run the probe"),
    "probe.run": CheckText(
        "every reachable node, and each node of an in-job preflight",
        "fails: the probe printed no facts (its last error line is in the message)"),
    "gpu.count": CheckText(
        "`expect.gpus_per_node` is set",
        "fails: nvidia-smi lists another number of GPUs, or nvidia-smi is missing or fails"),
    "gpu.model": CheckText(
        "`expect.gpu_model` is set",
        "fails: a GPU's name does not contain it (case-insensitive)"),
    "gpu.driver": CheckText(
        "`expect.min_driver` is set",
        "fails: the driver is older, compared number by number (`535.104` < `535.129.03`)"),
    "gpu.ecc": CheckText(
        GPU_HEALTH_RUNS,
        "fails: volatile uncorrected ECC errors, pending retired pages or row remaps, or a row-remap "
        "failure; warns when the driver refuses the health fields"),
    "gpu.pcie_link": CheckText(
        GPU_HEALTH_RUNS,
        "fails: a GPU's PCIe link is narrower than its maximum width; warns: a busy GPU below its "
        "maximum generation (an idle one drops generation on purpose)"),
    "gpu.throttle": CheckText(
        GPU_HEALTH_RUNS,
        "fails: HW slowdown, HW thermal slowdown, SW thermal slowdown or HW power brake; idle, "
        "application clocks and SW power cap pass"),
    "gpu.xid": CheckText(
        GPU_HEALTH_RUNS,
        "fails: the kernel log (dmesg, else the journal) has an Xid that needs a GPU reset within "
        "`expect.xid_window` (default 24h): Xid " + ", ".join(str(x) for x in sorted(RESET_XIDS)) +
        "; warns when neither log is readable"),
    "gpu.recovery_action": CheckText(
        GPU_HEALTH_RUNS,
        "fails: the driver reports a pending recovery action for a GPU (`gpu_recovery_action`: GPU Reset, "
        "Node Reboot, Drain P2P, Drain and Reset); a driver that does not know the field passes"),
    "gpu.nvlink": CheckText(
        GPU_HEALTH_RUNS + ", and the probe read `nvidia-smi nvlink -s`",
        "fails: a GPU of a node with NVLinks lists an inactive link (or all links inactive), or a link's "
        "CRC / Replay / Recovery errors (`nvidia-smi nvlink -e`) exceed `expect.nvlink_error_thresholds` "
        "(defaults below); GPUs without NVLink, or whose every link is inactive (a lone GPU of a board in "
        "a VM), pass; warns when `nvidia-smi nvlink -s` fails"),
    "nccl.library": CheckText(
        "`expect.nccl` is set",
        "fails: no libnccl loads, or the first one a PyTorch job would load misses the specifier"),
    "nccl.torch": CheckText(
        "`--deep`",
        "fails: `environment.python` cannot import torch, torch is a CPU build, sees no GPU, has no "
        "NCCL backend, or its NCCL misses `expect.nccl`; warns when the probe ran without `--deep`"),
    "dcgm.diag": CheckText(
        "`--deep` (never in a job's preflight)",
        "fails: `dcgmi diag -r 1` reports a failed test; passes with a note when dcgmi is not installed; "
        "warns when the diagnostic cannot run (no DCGM host engine)"),
    "rdma.hca_present": CheckText(
        RDMA_RUNS,
        "fails: an HCA of `network.ib_hca` is missing (without `ib_hca`: there is no HCA at all)"),
    "rdma.port_state": CheckText(
        RDMA_RUNS,
        "fails: a checked port is not ACTIVE / LinkUp (" + RDMA_PORTS + ", unless no port is usable)"),
    "rdma.link_rate": CheckText(
        "as `rdma.port_state`, and `expect.ib_rate_gbps` is set",
        "fails: an ACTIVE checked port runs below `expect.ib_rate_gbps` Gb/s"),
    "rdma.link_layer": CheckText(
        "`network.fabric` is `infiniband` or `roce`",
        "fails: a checked port's link layer is not InfiniBand (fabric `infiniband`) or Ethernet "
        "(fabric `roce`)"),
    "rdma.gid_index": CheckText(
        "as `rdma.port_state`, and `network.gid_index` is set",
        "fails: the GID at that index is missing or all-zero on a checked port, or (fabric `roce`) "
        "not of type RoCE v2"),
    "rdma.peermem": CheckText(
        "`expect.peermem: true` and `network.fabric` is not `ethernet`",
        "fails: neither `nvidia_peermem` nor `nv_peer_mem` is loaded"),
    "rdma.port_errors": CheckText(
        RDMA_RUNS,
        "fails: an error counter of a checked port is above its threshold (`expect.ib_error_thresholds`, "
        "defaults below); warns instead when `network.ib_hca` is unset"),
    "rdma.nic_pcie": CheckText(
        RDMA_RUNS + ", and the probe read the HCAs' PCI functions",
        "fails: a checked HCA's own PCIe link (`/sys/class/infiniband/<hca>/device/{current,max}_link_{width,speed}`) "
        "is narrower or slower than its maximum; warns instead when `network.ib_hca` is unset"),
    "topo.gpu_nic": CheckText(
        RDMA_RUNS + ", and the probe resolved the GPUs' and HCAs' PCI paths",
        "warns: a GPU's nearest HCA of the fabric (same PCIe switch, else same NUMA node) is not in "
        "`network.ib_hca`, or the HCAs span sockets and none is local to some GPU; never fails"),
    "net.socket_ifname": CheckText(
        "`network.socket_ifname` is set",
        "fails: no interface matches it, or only interfaces that are down; warns when it selects "
        "only `lo`, or also matches an interface that is down"),
    "sys.memlock": CheckText(
        "`expect.memlock` is set",
        "fails: the soft RLIMIT_MEMLOCK (`ulimit -l`) is below it"),
    "container.nccl": CheckText(
        "in-job preflight of a job with `container:` whose profile uses RDMA or sets `expect.nccl`",
        "fails: no libnccl loads inside the image"),
    "container.rdma": CheckText(
        "in-job preflight of a job with `container:` whose profile uses RDMA",
        "fails: the image has no libibverbs, or the container has no `/dev/infiniband`"),
}


def check_table() -> str:
    """The check ids the code emits, each with when it runs and what it says."""
    emitted = check_ids()
    undocumented = [check for check in emitted if check not in CHECKS]
    gone = [check for check in CHECKS if check not in emitted]
    if undocumented or gone:
        raise ValueError(f"check ids without a description: {undocumented}; described but emitted "
                         f"nowhere: {gone}; update CHECKS in cluster_kit/docs_reference.py")
    return table(["id", "runs when", "verdict"], [[f"`{check}`", text.runs, text.verdict] for check, text in CHECKS.items()])


def port_error_defaults() -> str:
    """The default thresholds of rdma.port_errors (checks/rdma_errors.py)."""
    return table(["counter", "default threshold"],
                 [[f"`{name}`", str(value)] for name, value in DEFAULT_THRESHOLDS.items()])


def nvlink_error_defaults() -> str:
    """The default thresholds of gpu.nvlink (checks/nvlink.py)."""
    return table(["counter", "default threshold"],
                 [[f"`{name}`", str(value)] for name, value in DEFAULT_NVLINK_THRESHOLDS.items()])


# ---------------------------------------------------------------- the file


BLOCKS: dict[str, Callable[[], str]] = {
    "profile-keys": profile_keys,
    "job-keys": job_keys,
    "sbatch-owned": sbatch_owned,
    "sbatch-options": sbatch_passthrough,
    "nccl-variables": nccl_variables,
    "check-ids": check_table,
    "port-error-defaults": port_error_defaults,
    "nvlink-error-defaults": nvlink_error_defaults,
}


def regenerate(text: str) -> str:
    """`text` with every generated block rewritten; each block must be there once."""
    names = [match.group(2) for match in BLOCK.finditer(text)]
    unknown = sorted(set(names) - set(BLOCKS))
    missing = sorted(set(BLOCKS) - set(names))
    twice = sorted({name for name in names if names.count(name) > 1})
    if unknown or missing or twice:
        raise ValueError(f"generated blocks: unknown {unknown}, missing {missing}, repeated {twice}")
    return BLOCK.sub(lambda m: f"{m.group(1)}{BLOCKS[m.group(2)]()}\n{m.group(4)}", text)


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite docs/reference.md, or with --check say whether it is stale (exit 1)."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    current = REFERENCE.read_text(encoding="utf-8")
    fresh = regenerate(current)
    if fresh == current:
        return 0
    if check:
        print(f"{REFERENCE} is stale; run: python -m cluster_kit.docs_reference", file=sys.stderr)
        return 1
    REFERENCE.write_text(fresh, encoding="utf-8")
    print(f"wrote {REFERENCE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
