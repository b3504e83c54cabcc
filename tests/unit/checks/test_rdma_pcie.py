"""rdma.nic_pcie on probe facts of fake sysfs trees (tests/unit/node/test_probe.py builds
them as the kernel lays out an HCA's PCI function: device/{current,max}_link_{width,speed})."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.checks import evaluate, rdma_pcie
from cluster_kit.checks.findings import Finding

DATA = Path(__file__).resolve().parents[2] / "data" / "facts"
LISTED = {"network": {"fabric": "infiniband", "ib_hca": [f"mlx5_{n}:1" for n in range(8)]},
          "expect": {"gpus_per_node": 8}}
UNLISTED = {"network": {"fabric": "infiniband"}, "expect": {}}


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((DATA / f"{name}.json").read_text()))


def nic_pcie(facts: dict[str, Any], profile: dict[str, Any] = LISTED) -> Finding | None:
    return next((f for f in evaluate(facts, profile) if f.id == "rdma.nic_pcie"), None)


@pytest.mark.parametrize(("text", "expected"), [
    ("32.0 GT/s PCIe", 32.0), ("16.0 GT/s PCIe", 16.0), ("2.5 GT/s PCIe", 2.5),
    ("8 GT/s", 8.0),            # kernels before 4.19 print no "PCIe"
    ("Unknown", None), ("Unknown speed", None), (None, None),
])
def test_sysfs_speed_strings(text: str | None, expected: float | None) -> None:
    assert rdma_pcie.speed(text) == expected


def test_widths() -> None:
    assert [rdma_pcie.width(t) for t in ("16", "8\n", "0", "", None)] == [16, 8, None, None, None]


def test_a_listed_hca_at_x8_of_x16_fails_exactly_this_check() -> None:
    facts = load("ib-x8")
    bad = {f.id: f for f in evaluate(facts, LISTED) if f.status != "pass"}
    assert list(bad) == ["rdma.nic_pcie"]
    assert bad["rdma.nic_pcie"].status == "fail"
    assert bad["rdma.nic_pcie"].message == "mlx5_2 (0000:2c:00.0): PCIe x8 of x16"
    assert "`lspci -vv -s 0000:2c:00.0`" in bad["rdma.nic_pcie"].fix


def test_a_listed_hca_at_a_lower_pcie_speed_fails() -> None:
    finding = nic_pcie(load("ib-gen4"))
    assert finding is not None and finding.status == "fail"
    assert finding.message == "mlx5_6 (0000:6c:00.0): PCIe 16 GT/s of 32 GT/s"


def test_without_ib_hca_every_hca_is_checked_and_only_warns() -> None:
    finding = nic_pcie(load("ib-x8"), UNLISTED)
    assert finding is not None and finding.status == "warn"


def test_an_unlisted_degraded_hca_is_not_checked_when_ib_hca_is_set() -> None:
    profile = copy.deepcopy(LISTED)
    profile["network"]["ib_hca"] = ["mlx5_0", "mlx5_1"]
    finding = nic_pcie(load("ib-x8"), profile)
    assert finding is not None and (finding.status, finding.message) == (
        "pass", "2 HCAs at full PCIe link width and speed")


def test_healthy_node_passes_and_old_facts_without_pci_skip_the_check() -> None:
    finding = nic_pcie(load("ib-ok"))
    assert finding is not None and (finding.status, finding.message) == (
        "pass", "8 HCAs at full PCIe link width and speed")
    facts = load("ib-x8")
    for hca in facts["rdma"]["hcas"].values():
        del hca["pci"]
    assert nic_pcie(facts) is None
    assert nic_pcie(load("ib-x8"), {"network": {"fabric": "ethernet"}}) is None
