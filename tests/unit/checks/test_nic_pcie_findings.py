"""rdma.nic_pcie findings written out whole (message and fix) on the probe's facts of
fake sysfs trees (tests/data/facts/ib-x8: mlx5_2 at x8 of x16; ib-gen4: mlx5_6 at 16 of
32 GT/s), with the attributes a kernel may not give edited to None as the probe records
them, and a device link that resolves nowhere (the probe's path [])."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from cluster_kit.checks import evaluate
from cluster_kit.checks.findings import Finding

DATA = Path(__file__).resolve().parents[2] / "data" / "facts"
LISTED = {"network": {"fabric": "infiniband", "ib_hca": [f"mlx5_{n}:1" for n in range(8)]},
          "expect": {"gpus_per_node": 8}}
UNLISTED = {"network": {"fabric": "infiniband"}, "expect": {}}


def load(name: str) -> dict[str, Any]:
    return copy.deepcopy(dict(json.loads((DATA / f"{name}.json").read_text())))


def nic_pcie(facts: dict[str, Any], profile: dict[str, Any] = LISTED) -> Finding | None:
    return next((f for f in evaluate(facts, profile) if f.id == "rdma.nic_pcie"), None)


def whole(f: Finding | None) -> tuple[str, str, str] | None:
    return None if f is None else (f.status, f.message, f.fix)


def fix(address: str) -> str:
    return (f"the NIC's PCIe link trained below its capability (`lspci -vv -s {address}`: LnkSta below LnkCap): "
            "reseat the card, check its riser/slot and the BIOS PCIe speed setting, then reboot; drain the "
            "node meanwhile (`clusterkit audit --drain --apply`): every all-reduce waits for this rail")


def without(facts: dict[str, Any], *attrs: str) -> dict[str, Any]:
    """Every HCA's PCI attributes `attrs` unreadable (None, as the probe records them)."""
    for hca in facts["rdma"]["hcas"].values():
        for attr in attrs:
            hca["pci"][attr] = None
    return facts


def test_unlisted_hca_at_x8_warns_whole_finding() -> None:
    assert whole(nic_pcie(load("ib-x8"), UNLISTED)) == (
        "warn", "mlx5_2 (0000:2c:00.0): PCIe x8 of x16", fix("0000:2c:00.0"))


def test_two_degraded_hcas_one_narrow_and_slow() -> None:
    facts = load("ib-x8")
    facts["rdma"]["hcas"]["mlx5_5"]["pci"].update(current_link_width="4", current_link_speed="16.0 GT/s PCIe")
    assert whole(nic_pcie(facts)) == (
        "fail", "mlx5_2 (0000:2c:00.0): PCIe x8 of x16; mlx5_5 (0000:5c:00.0): PCIe x4 of x16, PCIe 16 GT/s of 32 GT/s",
        fix("0000:2c:00.0"))


def test_width_alone_is_enough_to_check() -> None:
    """No link speed files (the probe's None): the widths still tell x8 of x16."""
    facts = without(load("ib-x8"), "current_link_speed", "max_link_speed")
    assert whole(nic_pcie(facts)) == ("fail", "mlx5_2 (0000:2c:00.0): PCIe x8 of x16", fix("0000:2c:00.0"))


def test_speed_alone_is_enough_to_check() -> None:
    facts = without(load("ib-gen4"), "current_link_width", "max_link_width")
    assert whole(nic_pcie(facts)) == (
        "fail", "mlx5_6 (0000:6c:00.0): PCIe 16 GT/s of 32 GT/s", fix("0000:6c:00.0"))


def test_a_device_link_that_resolves_nowhere_has_no_address() -> None:
    facts = load("ib-x8")
    facts["rdma"]["hcas"]["mlx5_2"]["pci"]["path"] = []
    assert whole(nic_pcie(facts)) == ("fail", "mlx5_2 (?): PCIe x8 of x16", fix("<pci address>"))
