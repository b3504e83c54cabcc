"""rdma.nic_pcie: an HCA whose own PCIe link trained narrower or slower than it can.

The facts are the kernel's attributes of the HCA's PCI function,
`/sys/class/infiniband/<hca>/device/{current,max}_link_{width,speed}`
("16", "32.0 GT/s PCIe"). A ConnectX at x8 of x16, or at Gen4 of Gen5, halves
that rail whatever the port's own rate says. Which HCAs: those of
`network.ib_hca` (a problem fails), else every HCA (a problem warns), as for
the port checks; runs when they run.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    failed,
    passed,
    plural,
    settings,
    warned,
)
from cluster_kit.checks.rdma import hca_facts, listed_hcas, port_checks_run

SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")


def speed(text: Any) -> float | None:
    """GT/s of a sysfs link speed ("32.0 GT/s PCIe", "8 GT/s"), None for "Unknown" or missing."""
    match = SPEED.match(str(text or ""))
    return float(match.group(1)) if match else None


def width(text: Any) -> int | None:
    """Lanes of a sysfs link width ("16"), None when missing or 0 (no link)."""
    try:
        lanes = int(str(text).strip())
    except ValueError:
        return None
    return lanes or None


def link_problems(pci: Mapping[str, Any]) -> list[str]:
    """ "PCIe x8 of x16", "PCIe 16.0 GT/s of 32.0 GT/s" for one PCI function."""
    problems = []
    cur_w, max_w = width(pci.get("current_link_width")), width(pci.get("max_link_width"))
    if cur_w and max_w and cur_w < max_w:
        problems.append(f"PCIe x{cur_w} of x{max_w}")
    cur_s, max_s = speed(pci.get("current_link_speed")), speed(pci.get("max_link_speed"))
    if cur_s and max_s and cur_s < max_s:
        problems.append(f"PCIe {cur_s:g} GT/s of {max_s:g} GT/s")
    return problems


def nic_pcie_fix(address: str) -> str:
    """Reseat/check the card, compare LnkSta with LnkCap, check the BIOS slot speed."""
    shown = address or "<pci address>"
    return (f"the NIC's PCIe link trained below its capability (`lspci -vv -s {shown}`: LnkSta below LnkCap): "
            "reseat the card, check its riser/slot and the BIOS PCIe speed setting, then reboot; drain the "
            "node meanwhile (`clusterkit audit --drain --apply`): every all-reduce waits for this rail")


def selected(facts: Facts, network: Mapping[str, Any]) -> tuple[list[str], bool]:
    """(HCA names to check, strict): the listed ones that exist, else all."""
    hcas = hca_facts(facts)
    listed = [name for name, _ in listed_hcas(network)]
    if listed:
        return [name for name in dict.fromkeys(listed) if name in hcas], True
    return list(hcas), False


def pci_of(hca: Mapping[str, Any]) -> Mapping[str, Any]:
    """An HCA's PCI function facts ({} from a probe that did not read them)."""
    pci = hca.get("pci")
    return pci if isinstance(pci, Mapping) else {}


def check_nic_pcie(facts: Facts, profile: Profile) -> Finding | None:
    """rdma.nic_pcie on the selected HCAs; None when none has PCI link facts."""
    names, strict = selected(facts, settings(profile, "network"))
    hcas = hca_facts(facts)
    reported = [(name, pci) for name, pci in ((name, pci_of(hcas[name])) for name in names)
                if pci.get("max_link_width") or pci.get("max_link_speed")]
    if not reported:
        return None
    bad = [(name, pci, link_problems(pci)) for name, pci in reported]
    bad = [(name, pci, problems) for name, pci, problems in bad if problems]
    if not bad:
        return passed("rdma.nic_pcie", f"{plural(len(reported), 'HCA')} at full PCIe link width and speed")
    message = "; ".join(f"{name} ({(pci.get('path') or ['?'])[-1]}): {', '.join(problems)}"
                        for name, pci, problems in bad)
    fix = nic_pcie_fix(str((bad[0][1].get("path") or [""])[-1]))
    return failed("rdma.nic_pcie", message, fix) if strict else warned("rdma.nic_pcie", message, fix)


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """rdma.nic_pcie when the rdma port checks run (fabric infiniband/roce or ib_hca)."""
    if not port_checks_run(settings(profile, "network")):
        return []
    finding = check_nic_pcie(facts, profile)
    return [finding] if finding else []
