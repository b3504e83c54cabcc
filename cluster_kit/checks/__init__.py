"""Pure checks: probe facts + profile data -> findings (SPEC's check ids).

Only the checks whose expectation or network setting the profile configures
run; each family module says when (gpu, gpu_health, gpu_recovery, nvlink, nccl, rdma, rdma_errors, rdma_pcie, topology,
net, system). This
package runs on the CLI and inside jobs (cluster_kit.checks.injob): standard library
and `packaging` only.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cluster_kit.checks import (
    container,
    dcgm,
    gpu,
    gpu_health,
    gpu_recovery,
    nccl,
    net,
    nvlink,
    rdma,
    rdma_errors,
    rdma_pcie,
    system,
    topology,
)
from cluster_kit.checks.findings import Finding, worst

# The room's surface: evaluate, node_status and Finding, and the modules other rooms import.
__all__ = [
    "Finding",
    "evaluate",
    "findings",
    "gpu_health",
    "injob",
    "node_status",
    "nvlink",
    "rdma",
    "rdma_errors",
    "topology",
]


def evaluate(facts: Mapping[str, Any], profile_data: Mapping[str, Any], deep: bool = False) -> list[Finding]:
    """Every configured check on one node's facts, in a stable order.

    `profile_data` is a resolved profile (or effective job settings): its
    `network`, `expect` and `environment` mappings are read. `deep` adds
    nccl.torch and dcgm.diag (the probe ran with --deep).
    """
    findings = [
        *gpu.check(facts, profile_data),
        *gpu_health.check(facts, profile_data),
        *gpu_recovery.check(facts, profile_data),
        *nvlink.check(facts, profile_data),
        *nccl.check(facts, profile_data, deep),
        *dcgm.check(facts, profile_data, deep),
        *rdma.check(facts, profile_data),
        *rdma_errors.check(facts, profile_data),
        *rdma_pcie.check(facts, profile_data),
        *topology.check(facts, profile_data),
        *net.check(facts, profile_data),
        *system.check(facts, profile_data),
        *container.check(facts, profile_data),
    ]
    return [container.inside(finding, profile_data) for finding in findings]


def node_status(findings: Iterable[Finding]) -> str:
    """The node's status: the worst of its findings (pass < warn < fail)."""
    return worst(finding.status for finding in findings)
