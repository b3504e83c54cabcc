"""dcgm.diag: the probe's parser on posted `dcgmi diag` text (tests/data/dcgm, source in the
file's header) and the check on each state of the probe's dcgm section."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cluster_kit.checks import evaluate
from cluster_kit.checks.findings import Finding
from cluster_kit.fleet.preflight import build_probe_command
from cluster_kit.node import probe

DATA = Path(__file__).resolve().parents[2] / "data"
PROBE = Path(probe.__file__)
# The layout of `dcgmi diag -r 1` (its Deployment rows), all passing.
PASSING = """Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| CUDA Main Library         | Pass                                           |
| Permissions and OS Blocks | Pass                                           |
| Persistence Mode          | Pass                                           |
| Environment Variables     | Pass                                           |
| Page Retirement/Row Remap | Pass                                           |
| Graphics Processes        | Pass                                           |
| Inforom                   | Skip                                           |
+---------------------------+------------------------------------------------+
"""


def real(name: str) -> str:
    lines = (DATA / "dcgm" / name).read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("# "))


def diag(dcgm: dict[str, Any] | None, deep: bool = True) -> Finding | None:
    facts = json.loads((DATA / "facts" / "ib-ok.json").read_text())
    if dcgm is not None:
        facts["dcgm"] = dcgm
    return next((f for f in evaluate(facts, {"expect": {}}, deep) if f.id == "dcgm.diag"), None)


def test_a_failed_test_with_its_wrapped_warning_is_parsed() -> None:
    [test] = probe.parse_dcgm_diag(real("diag-fail-pcie.txt"))
    assert (test["test"], test["result"]) == ("PCIe", "Fail - All")
    assert test["details"][0].startswith("GPU 0GPU 0's NvLink link 0 is currently down Run a field diagnostic")


def test_a_passing_run_lists_every_test() -> None:
    tests = probe.parse_dcgm_diag(PASSING)
    assert [t["test"] for t in tests][:3] == ["Denylist", "NVML Library", "CUDA Main Library"]
    assert {t["result"] for t in tests} == {"Pass", "Skip"}


def test_fail_names_the_test_and_dcgms_words() -> None:
    found = diag({"status": "ok", "exit_code": 226, "tests": probe.parse_dcgm_diag(real("diag-fail-pcie.txt"))})
    assert found is not None and found.status == "fail"
    assert found.message.startswith("dcgmi diag -r 1: PCIe: Fail - All (GPU 0GPU 0's NvLink link 0 is currently down")
    assert "dcgmi diag -r 3" in found.fix


def test_pass_skip_and_warn() -> None:
    found = diag({"status": "ok", "exit_code": 0, "tests": probe.parse_dcgm_diag(PASSING)})
    assert found is not None and (found.status, found.message) == ("pass", "dcgmi diag -r 1: 9 tests, none failed")
    found = diag({"status": "absent", "error": "dcgmi not found on PATH (DCGM is not installed)"})
    assert found is not None and found.status == "pass"
    assert found.message == "skipped: dcgmi not found on PATH (DCGM is not installed)"
    found = diag({"status": "error", "error": "dcgmi diag -r 1: Error: unable to establish a connection to the "
                  "specified host: localhost"})
    assert found is not None and found.status == "warn" and "nv-hostengine" in found.fix


def test_only_under_deep_and_never_from_a_job_probe() -> None:
    assert diag({"status": "ok", "exit_code": 0, "tests": []}, deep=False) is None
    assert diag({"status": "skipped"}) is None           # the in-job probe runs --deep without --dcgm
    assert "--dcgm" in build_probe_command("/usr/bin/python3", deep=True)
    assert "--dcgm" not in build_probe_command("/usr/bin/python3")


def test_the_probe_runs_dcgmi_only_with_dcgm(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    dcgmi = tmp_path / "bin" / "dcgmi"
    dcgmi.write_text("#!/bin/sh\n[ \"$*\" = 'diag -r 1' ] || exit 3\nprintf '%s' '" + PASSING.replace("'", "") + "'\n")
    dcgmi.chmod(0o755)
    env = {"PATH": str(tmp_path / "bin"), probe.ROOT_ENV: str(tmp_path), "LANG": "C"}
    for args, status in (([], "skipped"), (["--dcgm"], "ok")):
        done = subprocess.run([sys.executable, "-", *args], input=PROBE.read_bytes(), capture_output=True,
                              env=env, timeout=120, check=True)
        facts = json.loads(done.stdout)
        assert facts["dcgm"]["status"] == status
    assert len(facts["dcgm"]["tests"]) == 9
    assert probe.parse_args(["--python", "/p", "--dcgm", "--deep=/p"]) == {"python": "/p", "dcgm": "1", "deep": "/p"}


def test_every_failed_test_with_all_its_details_whole_finding() -> None:
    tests = [{"test": "PCIe", "result": "Fail - All", "details": ["GPU 0: link 0 down", "GPU 1: link 2 down"]},
             {"test": "Denylist", "result": "Pass"},
             {"test": "Inforom", "result": "Fail - GPU 3"}]
    found = diag({"status": "ok", "exit_code": 226, "tests": tests})
    assert found is not None and (found.status, found.message, found.fix) == (
        "fail", "dcgmi diag -r 1: PCIe: Fail - All (GPU 0: link 0 down; GPU 1: link 2 down); Inforom: Fail - GPU 3",
        ("read the full report on the node (`dcgmi diag -r 1`, then `dcgmi diag -r 3` for the long tests) and act "
        "on its failed tests; drain the node (`clusterkit audit --drain --apply`) until they pass"))


def test_a_diagnostic_that_did_not_run_whole_warning() -> None:
    found = diag({"status": "error", "error": "dcgmi diag -r 1: Error: unable to establish a connection"})
    assert found is not None and (found.message, found.fix) == (
        "the diagnostic did not run: dcgmi diag -r 1: Error: unable to establish a connection",
        ("start DCGM's host engine (`systemctl start nvidia-dcgm`, or `nv-hostengine`) and run `dcgmi diag -r 1` "
        "on the node"))
