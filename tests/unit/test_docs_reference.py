"""docs/reference.md stays true: its generated blocks are current, it names every key and
check id of the product contract, every command and option, and its examples are what the
code accepts and writes.

The JSON documents compared with the page's examples are built by the real preflight, audit,
submit, analysis and all-reduce code from recorded probe facts, profiler traces and a real
sweep log (tests/data/); only the SSH fan-out is replaced by the results it would return.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from cluster_kit.analysis.report import SweepRun, build_report
from cluster_kit.analysis.traces import load_folder
from cluster_kit.cli import cli
from cluster_kit.config import json_schema, specs
from cluster_kit.config import spec as config_spec
from cluster_kit.fleet import audit
from cluster_kit.fleet.preflight import run_preflight
from cluster_kit.fleet.routing import Route
from cluster_kit.report.allreduce import parse_sweep_log, summarise
from cluster_kit.report.jobs import submit_document
from cluster_kit.ssh import HostResult

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
PAGE = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")


def _tool(path: Path) -> Any:
    """A script of the repository's scripts/, loaded as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


docs_reference = _tool(ROOT / "scripts" / "docs_reference.py")

# The names of the product contract's file formats and check tables (SPEC.md), copied here
# because the contract is not part of the checkout. Extend these lists; never drop a name.
SPEC_PROFILE_KEYS = ["name", "extends", "login", "login.host", "login.user", "login.port", "login.identity_file", "login.proxy_jump", "ssh", "ssh.user", "ssh.port", "ssh.identity_file", "ssh.proxy_jump", "ssh.known_hosts", "ssh.host_key_policy", "ssh.connect_timeout", "ssh.command_timeout", "ssh.fanout", "nodes", "slurm", "slurm.partition", "slurm.account", "slurm.qos", "slurm.constraint", "slurm.gpus_per_node", "slurm.ntasks_per_node", "slurm.cpus_per_task", "slurm.mem", "slurm.time", "slurm.exclusive", "slurm.sbatch", "network", "network.fabric", "network.ib_hca", "network.gid_index", "network.ib_timeout", "network.socket_ifname", "network.nccl_env", "environment", "environment.modules", "environment.setup", "environment.python", "environment.env", "expect", "expect.gpus_per_node", "expect.gpu_model", "expect.min_driver", "expect.nccl", "expect.ib_rate_gbps", "expect.peermem", "expect.memlock", "expect.allreduce_busbw_gbps", "expect.xid_window", "expect.ib_error_thresholds", "expect.ib_error_thresholds.symbol_error", "expect.ib_error_thresholds.link_error_recovery", "expect.ib_error_thresholds.link_downed", "expect.ib_error_thresholds.port_rcv_errors", "expect.ib_error_thresholds.local_link_integrity_errors", "expect.ib_error_thresholds.excessive_buffer_overrun_errors", "expect.ib_error_thresholds.port_rcv_remote_physical_errors"]
SPEC_JOB_KEYS = ["name", "profile", "nodes", "gpus_per_node", "time", "launcher", "script", "args", "workdir", "output", "env", "nccl", "nccl.debug", "preflight", "cuda_graphs", "template", "slurm", "resilience", "resilience.max_restarts", "resilience.hang_timeout", "resilience.exclude", "resilience.grace", "resilience.max_time_requeues", "resilience.checkpoint_dir"]
SPEC_SBATCH_EXAMPLES = ["reservation", "mail-type"]
SPEC_CHECK_IDS = ["ssh.reachable", "gpu.count", "gpu.model", "gpu.driver", "nccl.library", "nccl.torch", "rdma.hca_present", "rdma.port_state", "rdma.link_rate", "rdma.link_layer", "rdma.gid_index", "rdma.peermem", "net.socket_ifname", "sys.memlock", "gpu.ecc", "gpu.pcie_link", "gpu.throttle", "gpu.xid", "rdma.port_errors", "gpu.nvlink", "gpu.recovery_action", "rdma.nic_pcie", "topo.gpu_nic", "dcgm.diag"]
# Contract names the code does not have yet. Each is required on the page from the day the
# code has it (the regenerated tables then list it); until then it must not be there.
NOT_YET_BUILT = {
    "gpu.nvlink", "gpu.recovery_action", "rdma.nic_pcie", "topo.gpu_nic", "dcgm.diag",
}


def block(name: str, text: str = PAGE) -> str:
    """The text of one generated block of the page."""
    match = re.search(rf"<!-- generated: {name} -->\n(.*?)<!-- end: {name} -->", text, re.DOTALL)
    assert match, f"no generated block {name!r} in docs/reference.md"
    return match.group(1)


def first_column(name: str) -> set[str]:
    """The `code` names in the first column of a generated table."""
    return set(re.findall(r"^\| `([^`]+)` \|", block(name), re.MULTILINE))


def built(names: list[str], have: set[str]) -> list[str]:
    """The contract names the page must hold: all but those the code does not have yet."""
    return [name for name in names if name not in NOT_YET_BUILT or name in have]


# ---------------------------------------------------------------- generated blocks


def test_the_committed_reference_is_current() -> None:
    assert docs_reference.regenerate(PAGE) == PAGE, \
        "docs/reference.md is stale: run `.venv/bin/python scripts/docs_reference.py`"


def test_a_stale_or_broken_page_is_caught() -> None:
    stale = PAGE.replace(block("job-keys"), "| `gone` | string |  | a key that was dropped |\n")
    assert stale != PAGE and docs_reference.regenerate(stale) == PAGE
    no_checks = PAGE.replace("<!-- end: check-ids -->", "")
    with pytest.raises(ValueError, match="missing"):
        docs_reference.regenerate(no_checks)
    with pytest.raises(ValueError, match="unknown"):
        docs_reference.regenerate(PAGE + "<!-- generated: typo -->\n<!-- end: typo -->\n")


def test_check_mode_reports_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "reference.md"
    page.write_text(PAGE.replace(block("check-ids"), "| `old.id` | never | gone |\n"), encoding="utf-8")
    monkeypatch.setattr(docs_reference, "REFERENCE", page)
    assert docs_reference.main(["--check"]) == 1
    assert docs_reference.main([]) == 0 and page.read_text(encoding="utf-8") == PAGE
    assert docs_reference.main(["--check"]) == 0


def test_every_key_of_the_specs_is_a_row() -> None:
    for kind, name in (("profile", "profile-keys"), ("job", "job-keys")):
        root = specs.PROFILE if kind == "profile" else specs.JOB
        assert first_column(name) == {".".join(p) for p in json_schema.spec_paths(root)}


def test_the_contract_keys_are_on_the_page() -> None:
    profile, job = first_column("profile-keys"), first_column("job-keys")
    assert set(built(SPEC_PROFILE_KEYS, profile)) - profile == set()
    assert set(built(SPEC_JOB_KEYS, job)) - job == set()
    assert set(SPEC_SBATCH_EXAMPLES) <= set(re.findall(r"`([a-z-]+)`", block("sbatch-options")))


def test_the_contract_check_ids_are_on_the_page() -> None:
    on_page = first_column("check-ids")
    assert set(built(SPEC_CHECK_IDS, set(docs_reference.check_ids()))) - on_page == set()
    assert on_page == set(docs_reference.check_ids())
    assert (NOT_YET_BUILT - set(docs_reference.check_ids())) & on_page == set()


# ---------------------------------------------------------------- check ids from the code


def test_check_ids_are_the_literal_ids_of_findings() -> None:
    source = ("def f(check_id):\n"
              "    a = passed('gpu.count', 'ok')\n"
              "    b = findings.failed('new.family', 'bad', 'fix')\n"
              "    c = Finding(check_id, 'fail', 'x')\n"
              "    d = section(facts, 'not.an_id')\n"
              "    e = warned('Not An Id', 'x', 'y')\n")
    assert sorted(docs_reference._ids_in(ast.parse(source))) == ["gpu.count", "new.family"]


def test_the_ids_outside_checks_are_found() -> None:
    assert {"ssh.reachable", "probe.python", "probe.run", "container.rdma"} <= set(docs_reference.check_ids())


def test_an_undescribed_check_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docs_reference, "check_ids", lambda: [*docs_reference.CHECKS, "gpu.new_check"])
    with pytest.raises(ValueError, match="gpu.new_check"):
        docs_reference.check_table()


# ---------------------------------------------------------------- the sbatch pass-through


def slurm_problems(slurm: dict[str, Any]) -> list[str]:
    return [message for _, message in config_spec.check({"slurm": slurm}, specs.PROFILE)]


def test_every_owned_option_is_refused_in_the_pass_through() -> None:
    owned = first_column("sbatch-owned")
    assert owned and all(option.startswith("--") for option in owned)
    for option in owned:
        problems = slurm_problems({"sbatch": {option[2:]: "x"}})
        assert len(problems) == 1 and ("remove it here" in problems[0] or "own key" in problems[0]), problems


def test_every_listed_option_passes_in_both_spellings() -> None:
    listed = re.findall(r"`([a-z-]+)`", block("sbatch-options"))
    assert len(listed) > 50
    for option in listed:
        assert slurm_problems({"sbatch": {option: "x"}, option.replace("-", "_"): True}) == [], option


@pytest.mark.parametrize(("slurm", "words"), [
    ({"sbatch": {"--mail-type": "END"}}, "without the leading dashes"),
    ({"sbatch": {"mail_typo": "END"}}, "did you mean 'mail-type'"),
    ({"sbatch": {"comment": None}}, "expected a string"),
    ({"sbatch": {"comment": "a b"}}, "must not carry"),
    ({"sbatch": {"comment": "two\nlines"}}, "single line"),
])
def test_the_refusals_the_page_names(slurm: dict[str, Any], words: str) -> None:
    problems = slurm_problems(slurm)
    assert len(problems) == 1 and words in problems[0], problems


# ---------------------------------------------------------------- examples and commands


def yaml_examples() -> list[dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE, re.DOTALL)
    return [yaml.safe_load(text) for text in blocks]


def test_the_yaml_examples_are_valid() -> None:
    examples = yaml_examples()
    assert len(examples) == 4
    for data in examples:
        spec = specs.JOB if "script" in data else specs.PROFILE
        assert config_spec.check(data, spec) == [], data


def commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, click.Command]]:
    """(`bench ddp`, command) for every command under the group."""
    out = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            out += commands(command, path + (name,))
        else:
            out.append((" ".join(path + (name,)), command))
    return out


def command_section(path: str) -> str:
    """The text under the `####` heading that names the command."""
    for match in re.finditer(r"^#### (.*)\n(.*?)(?=^#|\Z)", PAGE, re.MULTILINE | re.DOTALL):
        heading = match.group(1)
        if f"`clusterkit {path}" in heading or f"`{path} " in heading or f"`{path}`" in heading:
            return match.group(0)
    raise AssertionError(f"docs/reference.md has no heading for `clusterkit {path}`")


def test_every_command_and_option_is_on_the_page() -> None:
    found = commands(cli)
    assert len(found) >= 15
    for path, command in found:
        section = command_section(path)
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                long = max(param.opts, key=len)
                assert long in section, f"{long} of `clusterkit {path}` is not on the page"
    for param in cli.params:
        assert max(param.opts, key=len) in block_of("## Commands")


def block_of(heading: str) -> str:
    start = PAGE.index(heading + "\n")
    return PAGE[start:PAGE.index("\n## ", start + 1)]


def test_every_exit_code_of_the_errors_is_on_the_page() -> None:
    from cluster_kit import errors
    codes = {cls.exit_code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.ClusterKitError)}
    rows = set(re.findall(r"^\| (\d+) \|", block_of("## Exit codes"), re.MULTILINE))
    assert {str(code) for code in codes} | {"0", "130"} <= rows


# ---------------------------------------------------------------- JSON shapes


def documented(name: str) -> Any:
    match = re.search(rf"<!-- shape: {name} -->\n```json\n(.*?)```", PAGE, re.DOTALL)
    assert match, f"no JSON example {name!r}"
    return json.loads(match.group(1))


def keys_at(doc: Any, path: str) -> set[str]:
    """Keys of every object at a dotted path; `*` is each item of a list or value of a map."""
    found: list[Any] = [doc]
    for part in path.split(".") if path else []:
        nxt: list[Any] = []
        for item in found:
            if part == "*":
                nxt += list(item.values()) if isinstance(item, dict) else list(item or [])
            elif isinstance(item, dict) and item.get(part) is not None:
                nxt.append(item[part])
        found = nxt
    return {key for item in found if isinstance(item, dict) for key in item if key != "..."}


def assert_same_shape(name: str, real: Any, paths: list[str]) -> None:
    """The page's example has exactly the keys the code writes, at each path."""
    example = documented(name)
    for path in paths:
        assert keys_at(example, path) == keys_at(real, path), f"{name} at {path or 'the top'}"


def facts_line(name: str) -> str:
    return json.dumps(json.loads((DATA / "facts" / f"{name}.json").read_text()))


PROFILE = {"name": "dev-nodes",
           "network": {"fabric": "infiniband", "socket_ifname": "eth0"},
           "environment": {"python": "python3"},
           "expect": {"gpus_per_node": 8, "gpu_model": "H100", "ib_rate_gbps": 400, "peermem": True,
                      "nccl": ">=2.18", "memlock": "unlimited"}}


def real_preflight() -> tuple[dict[str, Any], dict[str, Any]]:
    results = {"gpu001": HostResult("gpu001", True, 0, facts_line("ib-ok"), "", None, 0.31),
               "gpu002": HostResult("gpu002", True, 0, facts_line("ib-flap"), "", None, 0.28),
               "gpu003": HostResult("gpu003", True, 0, facts_line("ib-nohca"), "", None, 0.30),
               "gpu009": HostResult("gpu009", False, None, "", "", "connection refused (gpu009 port 22)", 0.0)}

    def fan_out(hosts: list[str], command: str, stdin: bytes | None = None, on_result: Any = None) -> list:
        return [results[host] for host in hosts]
    return run_preflight(list(results), PROFILE, fan_out)


def test_the_preflight_example_is_the_code_shape() -> None:
    report, _ = real_preflight()
    assert_same_shape("preflight", report, ["", "nodes.*", "nodes.*.checks.*", "summary"])


def test_the_submit_example_is_the_code_shape() -> None:
    report, _ = real_preflight()
    route = Route({"gpu002": ["rdma.port_errors"]}, ["gpu002"], 1, None)
    doc = submit_document("4711", route, report, test_only="Job 4711 to start at ...")
    assert_same_shape("submit", doc, [""])


def test_the_audit_and_baseline_examples_are_the_code_shape() -> None:
    report, facts = real_preflight()
    first = audit.build_audit("dev-nodes", report, facts)
    baseline = audit.save_baseline(first)
    counters = baseline["nodes"]["gpu002"]  # ib-flap: its link_downed grew since
    counter = next(name for name, value in counters.items()
                   if name.endswith(".counters.link_downed") and value != "0")
    counters[counter] = "0"
    counters["gpu.driver"] = "535.104.05"
    slurm = {"gpu002": {"state": "drained", "reason": "clusterkit: rdma.port_errors"}}
    doc = audit.build_audit("dev-nodes", report, facts, baseline, slurm)
    assert doc["drift"] and any("growth" in change for change in doc["changes"])
    assert_same_shape("audit", doc, ["", "drift.*", "checks.*", "changes.*", "baseline", "summary", "slurm.*"])
    assert_same_shape("baseline", baseline, [""])


def test_the_analysis_example_is_the_code_shape() -> None:
    rows = parse_sweep_log((DATA / "allreduce" / "gloo_4proc_cpu.log").read_text())
    cpu, _ = build_report(load_folder(DATA / "traces" / "gloo-straggler"), "4712", rows,
                          SweepRun(["as-is", "bucket_cap_mb=1", "static_graph"]))
    gpu, _ = build_report(load_folder(DATA / "traces" / "h200-graphed"), "4712")
    real = {**cpu, "ranks": cpu["ranks"] + gpu["ranks"]}
    assert cpu["straggler"] and cpu["advice"] and cpu["sweep"] and cpu["sweep_best"]
    assert_same_shape("analyze", real, ["", "ranks.*", "ranks.*.step_ms", "ranks.*.collectives.*",
                                        "straggler", "advice.*", "sweep.*", "sweep_best"])


def test_the_allreduce_example_is_the_code_shape() -> None:
    rows = parse_sweep_log((DATA / "allreduce" / "gloo_4proc_cpu.log").read_text())
    _, doc, _ = summarise(rows, 100.0)
    assert_same_shape("allreduce", doc, ["", "rows.*"])


def test_the_pass_through_renders_as_the_page_says(tmp_path: Path) -> None:
    """The page's pass-through example as a profile, and a job that changes two of its options."""
    profile = next(data for data in yaml_examples() if set(data) == {"slurm"})
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile), encoding="utf-8")
    job = {"profile": "./p.yaml", "script": "/bin/true",
           "slurm": {"requeue": False, "mail-type": "FAIL", "sbatch": {"comment": "a(b)"}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job), encoding="utf-8")
    result = CliRunner().invoke(cli, ["render", str(tmp_path / "job.yaml")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --partition=gpu" in lines
    assert "#SBATCH --mail-type=FAIL" in lines and "#SBATCH --reservation=maint" in lines
    assert '#SBATCH --signal=B:USR1@120' in lines and '#SBATCH --comment="a(b)"' in lines
    assert not [line for line in lines if "requeue" in line or "END" in line]


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_page_links_to_its_own_headings() -> None:
    anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", PAGE, re.MULTILINE)}
    links = set(re.findall(r"\]\(#([^)]+)\)", PAGE))
    assert links and links - anchors == set()


def test_the_check_table_is_in_the_order_findings_come() -> None:
    report, _ = real_preflight()
    order = re.findall(r"^\| `([^`]+)` \|", block("check-ids"), re.MULTILINE)
    for entry in report["nodes"]:
        ids = [check["id"] for check in entry["checks"]]
        assert ids == sorted(ids, key=order.index)
    assert len(report["nodes"][0]["checks"]) >= 12
