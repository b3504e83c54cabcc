"""gpu.nvlink: the probe's parsers on real `nvidia-smi nvlink -s` / `-e` output of NVLink
nodes (tests/data/nvlink, each file's header names where it was posted), and the check on
probe facts of fake nodes (tests/data/facts/nvlink-down.json: 8 H100s with 18 links each)."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cluster_kit.checks import evaluate, nvlink
from cluster_kit.checks.findings import Finding
from cluster_kit.node import probe

DATA = Path(__file__).resolve().parents[2] / "data"
PROFILE = {"network": {"fabric": "infiniband", "ib_hca": [f"mlx5_{n}:1" for n in range(8)]},
           "expect": {"gpus_per_node": 8, "gpu_model": "H100", "min_driver": "535.104"}}


def real(name: str) -> str:
    """A captured output without its header comment."""
    lines = (DATA / "nvlink" / name).read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("# "))


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((DATA / "facts" / f"{name}.json").read_text()))


def finding(facts: dict[str, Any], profile: dict[str, Any] = PROFILE) -> Finding | None:
    return next((f for f in evaluate(facts, profile) if f.id == "gpu.nvlink"), None)


def healthy() -> dict[str, Any]:
    """nvlink-down with its inactive link up and its counters cleared."""
    facts = copy.deepcopy(load("nvlink-down"))
    facts["nvlink"]["gpus"]["4"]["links"]["7"] = "26.562 GB/s"
    facts["nvlink"]["gpus"]["2"]["errors"]["11"] = {"replay": "0", "recovery": "0", "crc": "0"}
    return facts


# ---------------------------------------------------------------- real text

def test_hgx_a100_links_all_active() -> None:
    gpus = probe.parse_nvlink_status(real("status-hgx-a100.txt"))
    assert list(gpus) == ["0", "1"]
    assert gpus["0"]["links"] == {str(n): "25 GB/s" for n in range(12)}
    assert gpus["1"]["all_inactive"] is False


def test_gb200_eighteen_links_with_space_indent() -> None:
    gpus = probe.parse_nvlink_status(real("status-gb200.txt"))
    assert gpus["0"]["links"] == {str(n): "53.125 GB/s" for n in range(18)}


def test_inactive_links_of_a_v100_node() -> None:
    gpus = probe.parse_nvlink_status(real("status-inactive-v100.txt"))
    assert gpus["3"]["links"] == {"0": "25.781 GB/s", "1": "25.781 GB/s", "2": "25.781 GB/s", "3": "inactive",
                                  "4": "25.781 GB/s", "5": "inactive"}
    assert nvlink.inactive_links(gpus["3"]) == "NVLinks 3, 5 inactive"


def test_all_links_inactive_message_of_a_b200() -> None:
    gpus = probe.parse_nvlink_status(real("status-all-inactive-b200.txt"))
    assert gpus == {"2": {"links": {}, "all_inactive": True}}
    assert nvlink.inactive_links(gpus["2"]) == "all NVLinks inactive"


def test_error_counters_of_a_gb300() -> None:
    assert probe.parse_nvlink_errors(real("errors-gb300.txt")) == {
        "0": {"0": {"replay": "0", "recovery": "0", "crc": "0"}}}


def test_crc_variants_count_as_crc() -> None:
    text = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n\t Link 0: CRC Flit Errors: 7\n\t Link 0: Replay Errors: 1\n"
    assert probe.parse_nvlink_errors(text) == {"0": {"0": {"crc_flit": "7", "replay": "1"}}}
    assert nvlink.counter_group("crc_flit") == "crc" and nvlink.counter_group("bogus") is None


# ---------------------------------------------------------------- the check

def test_an_inactive_nvlink_fails_exactly_this_check() -> None:
    facts = load("nvlink-down")
    bad = {f.id: f for f in evaluate(facts, PROFILE) if f.status != "pass"}
    assert list(bad) == ["gpu.nvlink"]
    assert bad["gpu.nvlink"].message == "GPU 4 (00000000:9A:00.0): NVLink 7 inactive"
    assert "nvidia-fabricmanager" in bad["gpu.nvlink"].fix
    assert 'reason="clusterkit: gpu.nvlink"' in bad["gpu.nvlink"].fix


def test_counters_above_the_thresholds_fail_and_the_profile_moves_them() -> None:
    facts = healthy()
    facts["nvlink"]["gpus"]["2"]["errors"]["11"] = {"replay": "3", "recovery": "14", "crc": "412"}
    found = finding(facts)
    assert found is not None and found.status == "fail"
    assert found.message == "GPU 2 (00000000:3A:00.0): link 11 recovery 14 (> 10), link 11 crc 412 (> 100)"
    assert "nvidia-smi nvlink -re" in found.fix
    loose = copy.deepcopy(PROFILE)
    loose["expect"]["nvlink_error_thresholds"] = {"crc": 1000, "recovery": 20}
    relaxed = finding(facts, loose)
    assert relaxed is not None and relaxed.status == "pass"


def test_healthy_links_pass_with_their_count() -> None:
    found = finding(healthy())
    assert found is not None and found.status == "pass"
    assert found.message == "144 NVLinks of 8 GPUs active, error counters within expect.nvlink_error_thresholds"
    assert finding(load("nvlink-down"), {"expect": {}}) is None


def test_gpus_without_nvlink_pass() -> None:
    found = finding(load("ib-ok"))       # nvlink -s lists the GPUs and no link, as PCIe GPUs do
    assert found is not None and (found.status, found.message) == ("pass", "these GPUs have no NVLink")


def test_a_node_whose_every_link_is_inactive_passes_as_without_nvlink() -> None:
    """A VM given one GPU of an HGX board sees its links, all inactive: no NVLink to check."""
    facts = healthy()
    for gpu in facts["nvlink"]["gpus"].values():
        gpu["links"] = dict.fromkeys(gpu["links"], "inactive")
    found = finding(facts)
    assert found is not None and found.status == "pass"
    assert found.message.startswith("these GPUs have no NVLink active (every link nvidia-smi lists is inactive")


def test_one_gpu_with_all_links_inactive_on_an_nvlink_node_fails() -> None:
    facts = healthy()
    facts["nvlink"]["gpus"]["5"] = probe.parse_nvlink_status(real("status-all-inactive-b200.txt"))["2"]
    found = finding(facts)
    assert found is not None and found.status == "fail"
    assert found.message == "GPU 5 (00000000:AB:00.0): all NVLinks inactive"


def test_unreadable_nvlink_state_warns_and_an_old_probe_skips() -> None:
    facts = load("ib-ok")
    facts["nvlink"] = {"status": "error", "error": "nvidia-smi nvlink -s: Invalid combination of input arguments."}
    found = finding(facts)
    assert found is not None and found.status == "warn"
    del facts["nvlink"]
    assert finding(facts) is None


def test_validate_names_file_line_for_bad_nvlink_thresholds(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nexpect:\n  nvlink_error_thresholds:\n    crc: -1\n    flit: 3\n")
    done = subprocess.run([sys.executable, "-m", "cluster_kit", "validate", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    out = done.stdout + done.stderr
    assert f"{path}:4: expect.nvlink_error_thresholds.crc: -1 is too small; use 0 or more" in out
    assert f"{path}:5: unknown key 'flit' in expect.nvlink_error_thresholds; valid keys: crc, replay, recovery" in out


# ---------------------------------------------------------------- whole findings

DRAIN = ("drain the node (`clusterkit audit --drain --apply`, or "
         '`scontrol update nodename=<node> state=drain reason="clusterkit: gpu.nvlink"`)')


def test_inactive_links_of_two_gpus_whole_finding() -> None:
    facts = load("nvlink-down")
    facts["nvlink"]["gpus"]["6"]["all_inactive"] = True
    found = finding(facts)
    assert found is not None and found.message == (
        "GPU 4 (00000000:9A:00.0): NVLink 7 inactive; GPU 6 (00000000:BA:00.0): all NVLinks inactive")
    assert found.fix == (
        "an NVLink is down: check the NVLink fabric (`nvidia-smi nvlink -s`, `systemctl status "
        "nvidia-fabricmanager` on NVSwitch systems), then reset the GPUs (`nvidia-smi -r`) or reboot; a link "
        f"that stays down needs the baseboard serviced (RMA); {DRAIN} meanwhile: all-reduces on this node run slow")


def test_a_gpu_nvidia_smi_did_not_list_is_named_by_its_index() -> None:
    facts = load("nvlink-down")
    facts["nvlink"]["gpus"]["9"] = facts["nvlink"]["gpus"].pop("4")
    found = finding(facts)
    assert found is not None and found.message == "GPU 9: NVLink 7 inactive"


def test_error_counters_of_two_gpus_at_and_over_their_thresholds() -> None:
    facts = healthy()
    facts["nvlink"]["gpus"]["2"]["errors"]["11"] = {"crc": "N/A", "replay": "250"}   # unreadable, then over
    facts["nvlink"]["gpus"]["3"]["errors"]["0"] = {"crc_flit": "101", "recovery": "10"}  # recovery at its limit
    found = finding(facts)
    assert found is not None and found.message == (
        "GPU 2 (00000000:3A:00.0): link 11 replay 250 (> 100); GPU 3 (00000000:5D:00.0): link 0 crc flit 101 (> 100)")
    assert found.fix == (
        "an NVLink is failing: clear the counters (`nvidia-smi nvlink -re`) and read them again under load "
        "(`nvidia-smi nvlink -e`), run `dcgmi diag -r 2`; if they grow, reset or reboot and have the baseboard "
        f"serviced; {DRAIN} meanwhile")


def test_unreadable_error_counters_pass_and_say_so() -> None:
    facts = healthy()
    facts["nvlink"]["errors_error"] = "nvidia-smi nvlink -e: Not Supported"
    found = finding(facts)
    assert found is not None and found.message == (
        "144 NVLinks of 8 GPUs active, error counters unreadable (nvidia-smi nvlink -e: Not Supported)")


def test_gpus_that_all_say_all_links_inactive_pass_with_the_note() -> None:
    facts = load("ib-ok")
    facts["nvlink"] = {"status": "ok", "gpus": {"0": {"links": {}, "all_inactive": True}}}
    found = finding(facts)
    assert found is not None and (found.status, found.message) == (
        "pass", ("these GPUs have no NVLink active (every link nvidia-smi lists is inactive: a GPU of an NVLink "
        "board passed through alone, or a PCIe card without a bridge)"))
    facts["nvlink"] = {"status": "ok"}      # nvidia-smi printed nothing at all
    found = finding(facts)
    assert found is not None and (found.status, found.message) == ("pass", "these GPUs have no NVLink")


def test_unreadable_nvlink_state_whole_warning() -> None:
    facts = load("ib-ok")
    facts["nvlink"] = {"status": "error", "error": "nvidia-smi nvlink -s: Invalid combination of input arguments."}
    found = finding(facts)
    assert found is not None and (found.message, found.fix) == (
        "cannot read the NVLink state: nvidia-smi nvlink -s: Invalid combination of input arguments.",
        "run `nvidia-smi nvlink -s` on the node and check the driver")
