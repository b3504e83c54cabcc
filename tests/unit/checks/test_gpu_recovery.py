"""gpu.recovery_action on the probe's facts (tests/data/facts, from the fake trees of
tests/unit/node/test_probe.py) and on the field as the real driver documents it
(tests/data/nvidia_smi/help.txt, `nvidia-smi --help-query-gpu` of driver 580)."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.checks import evaluate
from cluster_kit.checks.findings import Finding
from cluster_kit.node import probe

DATA = Path(__file__).resolve().parents[2] / "data"
PROFILE = {"network": {"fabric": "infiniband", "ib_hca": [f"mlx5_{n}:1" for n in range(8)]},
           "expect": {"gpus_per_node": 8, "gpu_model": "H100", "min_driver": "535.104"}}


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((DATA / "facts" / f"{name}.json").read_text()))


def recovery(facts: dict[str, Any], profile: dict[str, Any] = PROFILE) -> Finding | None:
    return next((f for f in evaluate(facts, profile) if f.id == "gpu.recovery_action"), None)


def with_action(gpu: int, action: str) -> dict[str, Any]:
    facts = copy.deepcopy(load("ib-ok"))
    facts["gpu"]["gpus"][gpu]["gpu_recovery_action"] = action
    return facts


def test_the_field_is_the_real_drivers_and_asked_in_the_one_query() -> None:
    help_text = (DATA / "nvidia_smi" / "help.txt").read_text()
    assert '"gpu_recovery_action"\nGPU recovery action information.' in help_text
    assert "gpu_recovery_action" in probe.health_queries()[0]


def test_a_gpu_asking_for_a_node_reboot_fails_with_its_name_and_the_reboot() -> None:
    finding = recovery(load("gpu-reboot"))
    assert finding is not None and finding.status == "fail"
    assert finding.message == "GPU 6 (00000000:BA:00.0) asks for: Node Reboot"
    assert "reboot the node" in finding.fix
    assert 'reason="clusterkit: gpu.recovery_action"' in finding.fix
    bad = [f.id for f in evaluate(load("gpu-reboot"), PROFILE) if f.status != "pass"]
    assert bad == ["gpu.recovery_action"]


@pytest.mark.parametrize(("action", "words"), [
    ("GPU Reset", "`nvidia-smi -r -i 3`"),
    ("Drain P2P", "peer-to-peer/NVLink traffic must stop"),
    ("Drain and Reset", "let the running job finish"),
])
def test_each_pending_action_fails_with_its_own_fix(action: str, words: str) -> None:
    finding = recovery(with_action(3, action))
    assert finding is not None and finding.status == "fail"
    assert finding.message == f"GPU 3 (00000000:5D:00.0) asks for: {action}"
    assert words in finding.fix


def test_the_most_drastic_action_decides_the_fix() -> None:
    facts = with_action(1, "GPU Reset")
    facts["gpu"]["gpus"][4]["gpu_recovery_action"] = "Node Reboot"
    finding = recovery(facts)
    assert finding is not None and "reboot the node" in finding.fix
    assert finding.message.count("asks for") == 2


def test_none_passes_and_an_old_driver_passes_with_a_note() -> None:
    ok = recovery(load("ib-ok"))
    assert ok is not None and (ok.status, ok.message) == ("pass", "8 GPUs: no recovery action pending")
    old = recovery(load("gpu-powercap"))   # a driver that refused the field
    assert old is not None and old.status == "pass" and "field unknown" in old.message
    na = recovery(with_action(0, "[N/A]"))
    assert na is not None and na.status == "pass"


def test_an_error_text_in_the_field_warns() -> None:
    finding = recovery(with_action(2, "[Unknown Error]"))
    assert finding is not None and finding.status == "pass"    # nvidia-smi's placeholder: not reported
    finding = recovery(with_action(2, "Failed to retrieve"))
    assert finding is not None and finding.status == "warn" and "Failed to retrieve" in finding.message


def test_not_run_without_gpu_expectations() -> None:
    assert recovery(load("gpu-reboot"), {"network": {}, "expect": {}}) is None


DRAIN = ("drain the node (`clusterkit audit --drain --apply`, or "
         '`scontrol update nodename=<node> state=drain reason="clusterkit: gpu.recovery_action"`)')



REBOOT_FIX = (f"{DRAIN}; reboot the node: the driver cannot recover the GPU without it; run `dcgmi diag -r 3` "
              "before returning it to service")

def test_the_reboot_finding_written_out() -> None:
    finding = recovery(load("gpu-reboot"))
    assert finding is not None and finding.fix == REBOOT_FIX


def test_the_reboot_outranks_a_reset_asked_for_first() -> None:
    """By SEVERITY, not by the order of the words: "gpu reset" sorts before "node reboot"."""
    facts = with_action(1, "GPU Reset")
    facts["gpu"]["gpus"][4]["gpu_recovery_action"] = "Node Reboot"
    finding = recovery(facts)
    assert finding is not None and finding.fix == REBOOT_FIX


def test_every_gpu_asking_for_the_action_is_named_and_reset() -> None:
    facts = with_action(1, "GPU Reset")
    facts["gpu"]["gpus"][3]["gpu_recovery_action"] = "GPU Reset"
    finding = recovery(facts)
    assert finding is not None
    assert finding.message == ("GPU 1 (00000000:2A:00.0) asks for: GPU Reset; "
                               "GPU 3 (00000000:5D:00.0) asks for: GPU Reset")
    assert finding.fix == (f"{DRAIN}; reset the GPU: `nvidia-smi -r -i 1,3` with no process on it (or reboot the "
                           "node); run `dcgmi diag -r 3` before returning it to service")


def test_an_action_spelt_with_underscores_is_the_same_action() -> None:
    finding = recovery(with_action(2, "Drain_P2P"))
    assert finding is not None and (finding.status, finding.message) == (
        "fail", "GPU 2 (00000000:3A:00.0) asks for: Drain_P2P")
    assert "peer-to-peer/NVLink traffic must stop" in finding.fix


def test_unknown_field_and_error_texts_written_out() -> None:
    old = recovery(load("gpu-powercap"))
    assert old is not None and old.message == (
        "the driver reports no GPU recovery action (field unknown to it or not supported)")
    facts = with_action(2, "Failed to retrieve")
    facts["gpu"]["gpus"][5]["gpu_recovery_action"] = "Unknown Error 999"
    finding = recovery(facts)
    assert finding is not None and (finding.status, finding.message, finding.fix) == (
        "warn", ("cannot read the recovery action: GPU 2 (00000000:3A:00.0): Failed to retrieve; "
        "GPU 5 (00000000:AB:00.0): Unknown Error 999"),
        (f"{DRAIN}; read `nvidia-smi -q` (GPU Recovery Action) and the kernel log, then reset the GPU or reboot "
        "the node"))
