"""The in-job preflight's pure parts, in this process: the bundle's contents, the probe's
lines read into facts, and each node's verdict and printed lines.

(tests/unit/fleet/test_preflight.py runs the bundle itself with a bare Python.)
"""
from __future__ import annotations

import base64
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.checks import injob

PROFILE: dict[str, Any] = {"name": "t", "expect": {"memlock": "unlimited", "torch_cuda": False}}
TORCH = {"status": "ok", "version": "2.3.0"}
GOOD = {"slurm_node": "gpu-01", "hostname": "gpu-01.cluster", "torch": TORCH,
        "memlock": {"status": "ok", "soft_kib": "unlimited"}}
LOW = {"slurm_node": "gpu-02", "torch": TORCH, "memlock": {"status": "ok", "soft_kib": 64}}
MEMLOCK_FIX = ("raise it: `* soft memlock unlimited` and `* hard memlock unlimited` in /etc/security/limits.d/, "
               "and start slurmd with LimitMEMLOCK=infinity (Slurm copies the submitting shell's limits "
               "unless PropagateResourceLimitsExcept=MEMLOCK)")
SKIPPED_LINE = ("nccl.torch: the probe did not import torch (it ran without --deep) "
                "(fix: run preflight with --deep)")
LOW_LINE = f"sys.memlock: RLIMIT_MEMLOCK is 64 KiB, expected unlimited (expect.memlock) (fix: {MEMLOCK_FIX})"


def test_the_bundle_holds_the_checks_packaging_and_a_main_with_the_profile() -> None:
    bundle = zipfile.ZipFile(io.BytesIO(injob.build_bundle(PROFILE)))
    names = bundle.namelist()
    assert names[0] == "__main__.py"
    checks = sorted(p.name for p in Path(injob.__file__).parent.glob("*.py"))
    assert [n for n in names if n.startswith("cluster_kit/")] == [
        "cluster_kit/__init__.py", *(f"cluster_kit/checks/{name}" for name in checks)]
    assert "packaging/__init__.py" in names and "packaging/specifiers.py" in names
    assert all(info.compress_type == zipfile.ZIP_DEFLATED for info in bundle.infolist())
    assert bundle.read("cluster_kit/checks/injob.py") == Path(injob.__file__).read_bytes()
    assert bundle.read("__main__.py").decode() == (
        "import json, sys\n"
        "from cluster_kit.checks.injob import main\n"
        f"sys.exit(main(json.loads({json.dumps(PROFILE, sort_keys=True)!r}), sys.argv[1:]))\n")


def test_the_source_is_the_bundle_in_base64_lines_of_76() -> None:
    text = injob.checks_source(PROFILE)
    assert base64.decodebytes(text.encode("ascii")) == injob.build_bundle(PROFILE)
    assert {len(line) for line in text.splitlines()[:-1]} == {76}


def test_the_bundle_does_not_carry_the_time_it_was_built() -> None:
    """The generated entry is stamped 1980-01-01, not the clock: two renders of one
    profile give one script, even across a tick of zip's 2-second clock."""
    with zipfile.ZipFile(io.BytesIO(injob.build_bundle(PROFILE))) as zf:
        main = zf.getinfo("__main__.py")
    assert main.date_time == (1980, 1, 1, 0, 0, 0)
    assert main.compress_type == zipfile.ZIP_DEFLATED


def test_package_files_names_each_file_under_the_package() -> None:
    files = injob._package_files("packaging")
    assert ("packaging/version.py", Path(__import__("packaging").__file__).parent / "version.py") in files
    assert [name for name, _ in files] == sorted(name for name, _ in files)


def test_facts_are_keyed_by_slurm_node_then_hostname_and_other_lines_are_skipped() -> None:
    text = "\n".join([
        "srun: warning: something",
        "{not json",
        "  " + json.dumps(GOOD) + "  ",
        json.dumps({"hostname": "gpu-03"}),
        json.dumps({"slurm_node": "", "hostname": "gpu-04"}),
        json.dumps({"other": 1}),
        "",
    ])
    assert injob.read_facts(text) == {
        "gpu-01": GOOD, "gpu-03": {"hostname": "gpu-03"},
        "gpu-04": {"slurm_node": "", "hostname": "gpu-04"}, "?": {"other": 1}}


def test_verdicts_per_expected_node_a_silent_node_fails() -> None:
    facts = {"gpu-01": GOOD, "gpu-02": LOW, "gpu-09": GOOD}
    assert injob.verdicts(facts, ["gpu-03", "gpu-02", "gpu-01"], PROFILE) == [
        ("gpu-03", "fail", ["probe.run: the probe printed nothing on this node"]),
        ("gpu-02", "fail", [LOW_LINE]),
        ("gpu-01", "pass", []),
    ]


def test_verdicts_run_the_deep_checks() -> None:
    facts = {"gpu-01": {**GOOD, "torch": {"status": "skipped"}}}
    assert injob.verdicts(facts, ["gpu-01"], PROFILE) == [
        ("gpu-01", "warn", [SKIPPED_LINE])]


def write_facts(tmp_path: Path, *nodes: dict[str, Any]) -> str:
    path = tmp_path / "facts.jsonl"
    path.write_text("".join(json.dumps(node) + "\n" for node in nodes))
    return str(path)


def test_main_prints_a_line_per_node_and_exits_1_on_a_failure(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    facts = write_facts(tmp_path, GOOD, LOW)
    # the failing node first: a pass after it does not clear the exit status
    assert injob.main(PROFILE, [facts, "gpu-02", "gpu-01"]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == ("clusterkit preflight: gpu-02: fail\n"
                       f"clusterkit preflight:   {LOW_LINE}\n"
                       "clusterkit preflight: gpu-01: pass\n")


def test_main_exits_0_when_no_node_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = write_facts(tmp_path, GOOD, {**GOOD, "slurm_node": "gpu-02", "torch": {"status": "skipped"}})
    assert injob.main(PROFILE, [facts, "gpu-01", "gpu-02"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "clusterkit preflight: gpu-01: pass",
        "clusterkit preflight: gpu-02: warn",
        f"clusterkit preflight:   {SKIPPED_LINE}",
    ]
