"""gpu.nvlink: inactive NVLinks, and NVLinks whose error counters say they are failing.

The facts are the probe's `nvlink` section: `nvidia-smi nvlink -s` (each link's
speed, or `<inactive>`) and `nvidia-smi nvlink -e` (Replay, Recovery and CRC
errors per link, cumulative since the driver loaded or `nvidia-smi nvlink -re`).
A down NVLink is the usual cause of a slow intra-node all-reduce: NCCL routes
around it over fewer links, or over PCIe.

A node has NVLinks when nvidia-smi lists an active link for some GPU; a GPU there
that lists an inactive link, or says all its links are inactive, fails. GPUs
without NVLink (PCIe cards) list none, and a lone GPU of an NVLink board (a VM)
lists only inactive ones: both pass. A counter above its threshold fails:
`expect.nvlink_error_thresholds` over the defaults below (CRC variants such as
"CRC Flit" count as `crc`). Runs with the GPU health checks.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    failed,
    passed,
    plural,
    section,
    section_problem,
    settings,
    thresholds,
    warned,
)
from cluster_kit.checks.gpu_health import (
    DRAIN,
    expected_gpus,
    label,
    named_drain,
)

# A healthy link counts a few replays and CRC retries over months; a link that keeps
# retraining (recovery) or retrying is failing.
DEFAULT_NVLINK_THRESHOLDS: dict[str, int] = {"crc": 100, "replay": 100, "recovery": 10}

INACTIVE_FIX = ("an NVLink is down: check the NVLink fabric (`nvidia-smi nvlink -s`, "
                "`systemctl status nvidia-fabricmanager` on NVSwitch systems), then reset the GPUs "
                "(`nvidia-smi -r`) or reboot; a link that stays down needs the baseboard serviced (RMA); "
                f"{DRAIN} meanwhile: all-reduces on this node run slow")
ERRORS_FIX = ("an NVLink is failing: clear the counters (`nvidia-smi nvlink -re`) and read them again under "
              "load (`nvidia-smi nvlink -e`), run `dcgmi diag -r 2`; if they grow, reset or reboot and have "
              f"the baseboard serviced; {DRAIN} meanwhile")


def counter_group(kind: str) -> str | None:
    """ "crc_flit" -> "crc", "replay" -> "replay"; None for counters without a threshold."""
    return next((group for group in DEFAULT_NVLINK_THRESHOLDS if kind == group or kind.startswith(group + "_")),
                None)


def nvlink_gpus(facts: Facts) -> Mapping[str, Mapping[str, Any]]:
    """{gpu index: {"links": ..., "all_inactive": ..., "errors": ...}} of the probe."""
    gpus = section(facts, "nvlink").get("gpus")
    return gpus if isinstance(gpus, Mapping) else {}


def inactive_links(gpu: Mapping[str, Any]) -> str | None:
    """ "NVLink 7 inactive", "all NVLinks inactive", or None when every link is up."""
    if gpu.get("all_inactive"):
        return "all NVLinks inactive"
    down = [link for link, state in (gpu.get("links") or {}).items() if state == "inactive"]
    if not down:
        return None
    return f"NVLink{'s' if len(down) > 1 else ''} {', '.join(down)} inactive"


def over_limits(gpu: Mapping[str, Any], limits: Mapping[str, int]) -> list[str]:
    """ "link 3 CRC 412 (> 100)" for each counter of the GPU's links above its threshold."""
    over = []
    for link, counts in (gpu.get("errors") or {}).items():
        for kind, count in (counts or {}).items():
            group = counter_group(str(kind))
            try:
                seen = int(count)
            except (TypeError, ValueError):
                continue
            if group is not None and seen > limits[group]:
                over.append(f"link {link} {kind.replace('_', ' ')} {seen} (> {limits[group]})")
    return over


def described(index: str, gpus: list[Mapping[str, Any]]) -> str:
    """ "GPU 4 (00000000:9A:00.0)" when nvidia-smi listed that GPU, else "GPU 4"."""
    gpu = next((g for g in gpus if str(g.get("index")) == index), None)
    return label(gpu) if gpu is not None else f"GPU {index}"


def check_nvlink(facts: Facts, profile: Profile, gpus: list[Mapping[str, Any]]) -> Finding | None:
    """gpu.nvlink on the probe's NVLink facts; None from a probe that did not read them."""
    if not section(facts, "nvlink"):
        return None
    problem = section_problem(facts, "nvlink")
    if problem is not None:
        return warned("gpu.nvlink", f"cannot read the NVLink state: {problem}",
                      "run `nvidia-smi nvlink -s` on the node and check the driver")
    links = nvlink_gpus(facts)
    with_links = [index for index, gpu in links.items() if gpu.get("links")]
    if not any(state != "inactive" for gpu in links.values() for state in (gpu.get("links") or {}).values()):
        note = " active (every link nvidia-smi lists is inactive: a GPU of an NVLink board passed through " \
            "alone, or a PCIe card without a bridge)" if with_links or any(
                gpu.get("all_inactive") for gpu in links.values()) else ""
        return passed("gpu.nvlink", f"these GPUs have no NVLink{note}")
    down = [(index, inactive_links(gpu)) for index, gpu in links.items()]
    down = [(index, what) for index, what in down if what]
    if down:
        return failed("gpu.nvlink", "; ".join(f"{described(i, gpus)}: {what}" for i, what in down), INACTIVE_FIX)
    limits = thresholds(DEFAULT_NVLINK_THRESHOLDS, settings(profile, "expect").get("nvlink_error_thresholds"))
    noisy = [(index, over_limits(gpu, limits)) for index, gpu in links.items()]
    noisy = [(index, over) for index, over in noisy if over]
    if noisy:
        return failed("gpu.nvlink", "; ".join(f"{described(i, gpus)}: {', '.join(over)}" for i, over in noisy),
                      ERRORS_FIX)
    count = sum(len(links[index].get("links") or {}) for index in with_links)
    unread = section(facts, "nvlink").get("errors_error")
    counters = f"error counters unreadable ({unread})" if unread else \
        "error counters within expect.nvlink_error_thresholds"
    return passed("gpu.nvlink", f"{plural(count, 'NVLink')} of {plural(len(with_links), 'GPU')} active, {counters}")


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """gpu.nvlink, when the profile expects GPUs and nvidia-smi listed some."""
    gpus = expected_gpus(facts, profile)
    if not gpus:
        return []
    finding = check_nvlink(facts, profile, gpus)
    return [named_drain(finding)] if finding else []
