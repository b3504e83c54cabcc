"""rdma.port_errors: HCA ports whose error counters say the link is flapping or noisy.

The counters are the kernel's `/sys/class/infiniband/<hca>/ports/<p>/counters/`
files (Documentation/ABI/stable/sysfs-class-infiniband), cumulative since the
driver loaded or someone cleared them (`perfquery -R`). A port fails when a
counter exceeds its threshold: `expect.ib_error_thresholds` over the defaults
below. The ports checked are rdma.port_state's (`network.ib_hca`, else all).

The defaults leave room for what a healthy link collects over months of uptime
(a link_downed or two from a switch reboot or recabling, a few symbol errors
that forward error correction repaired) and fire on sustained trouble: a link
that keeps retraining, or a cable whose bit errors reach the receive path.
"""
from __future__ import annotations

from collections.abc import Mapping

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    failed,
    passed,
    plural,
    settings,
    thresholds,
    warned,
)
from cluster_kit.checks.rdma import (
    PortRef,
    port_checks_run,
    select_ports,
)

DEFAULT_THRESHOLDS: dict[str, int] = {
    "symbol_error": 100,
    "link_error_recovery": 10,
    "link_downed": 5,
    "port_rcv_errors": 100,
    "local_link_integrity_errors": 10,
    "excessive_buffer_overrun_errors": 10,
    "port_rcv_remote_physical_errors": 100,
}
COUNTERS = tuple(DEFAULT_THRESHOLDS)


def counter(ref: PortRef, name: str) -> int | None:
    """One counter of a port, None when the kernel does not expose it."""
    try:
        return int(str((ref.data.get("counters") or {})[name]).strip())
    except (KeyError, ValueError):
        return None


def over_limits(ref: PortRef, limits: Mapping[str, int]) -> list[str]:
    """ "link_downed 37 (> 5)" for each counter of the port above its threshold."""
    over = []
    for name in COUNTERS:
        seen = counter(ref, name)
        if seen is not None and seen > limits[name]:
            over.append(f"{name} {seen} (> {limits[name]})")
    return over


def port_errors_fix(bad: list[PortRef]) -> str:
    """Confirm with perfquery/mlxlink, then replace the cable or transceiver."""
    first = bad[0]
    return (f"confirm on the node with `perfquery -x` (the port's LID) or `mlxlink -d {first.hca} -p {first.port} -c` "
            "(BER, FEC and cable info), then reseat or replace the cable or transceiver and check the switch "
            "port; clear the counters afterwards (`perfquery -R`) and drain the node meanwhile: NCCL "
            "over a flapping link stalls or times out")


def check_port_errors(facts: Facts, profile: Profile) -> Finding | None:
    """rdma.port_errors on the selected ports; None when no port is selected."""
    selection = select_ports(facts, settings(profile, "network"))
    if not selection.ports:
        return None
    limits = thresholds(DEFAULT_THRESHOLDS, settings(profile, "expect").get("ib_error_thresholds"))
    bad = [(ref, over_limits(ref, limits)) for ref in selection.ports]
    bad = [(ref, over) for ref, over in bad if over]
    if bad:
        message = "; ".join(f"{ref.hca} port {ref.port}: {', '.join(over)}" for ref, over in bad)
        fix = port_errors_fix([ref for ref, _ in bad])
        if selection.strict:
            return failed("rdma.port_errors", message, fix)
        return warned("rdma.port_errors", message, fix)
    counted = [ref for ref in selection.ports if ref.data.get("counters")]
    if not counted:
        return passed("rdma.port_errors", "the kernel exposes no error counters for these ports")
    return passed("rdma.port_errors", f"{plural(len(counted), 'port')}: error counters within "
                  "expect.ib_error_thresholds")


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """rdma.port_errors when the rdma port checks run (fabric infiniband/roce or ib_hca)."""
    if not port_checks_run(settings(profile, "network")):
        return []
    finding = check_port_errors(facts, profile)
    return [finding] if finding else []
