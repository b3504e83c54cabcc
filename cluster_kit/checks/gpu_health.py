"""gpu.ecc, gpu.pcie_link, gpu.throttle, gpu.xid: GPUs that are up but degraded.

The facts are the health fields of the probe's one `nvidia-smi --query-gpu`
call (plus `--query-remapped-rows`) and the Xid lines of the kernel log. These
checks run when the profile expects GPUs (`expect.gpus_per_node`, `gpu_model`,
`min_driver` or `xid_window`) and nvidia-smi listed some; a field the driver
reports as "[N/A]" (no ECC on the model, no row remapper before Ampere) is
skipped, and a driver that refused the fields altogether is a warning.
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
    section,
    section_problem,
    settings,
    warned,
)

# nvidia-smi's placeholders for a value it does not have.
NOT_REPORTED = {"", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]",
                "[Insufficient Permissions]", "[GPU requires reset]"}

# clocks_event_reasons.active bits (nvml.h nvmlClocksEventReason*).
IDLE = 0x1
FAILING_REASONS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                   0x80: "HW power brake slowdown"}
BENIGN_REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "SW power cap", 0x10: "sync boost",
                  0x100: "display clock setting"}
THERMAL = 0x20 | 0x40
POWER_BRAKE = 0x80

# Xids whose resolution is a GPU reset, a reboot or an RMA (not an application
# bug such as Xid 13/31/43): double-bit ECC 48, row-remap and page-retirement
# events 63/64, uncontained ECC 95, NVLink 74, fallen off the bus 79, GSP 119/120, ...
RESET_XIDS = frozenset({48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 95, 119, 120})
XID_HINTS = {
    48: "a double-bit ECC error",
    63: "a row remap / page retirement is pending",
    64: "row remapping or page retirement failed",
    74: "an NVLink error",
    79: "the GPU has fallen off the bus: also reseat it and check its riser and power cables",
    95: "an uncontained ECC error",
    119: "the GSP firmware timed out",
    120: "the GSP firmware reported an error",
}
DEFAULT_XID_WINDOW_S = 24 * 3600
DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

HEALTH_REFUSED_FIX = ("upgrade the NVIDIA driver, or read the values by hand with "
                      "`nvidia-smi -q -d ECC,PCIE,PERFORMANCE`")
DRAIN = ("drain the node (`clusterkit audit --drain --apply`, or "
         "`scontrol update nodename=<node> state=drain reason=...`)")
DRAIN_REASON = "reason=..."


# ---------------------------------------------------------------- helpers

def gpu_list(facts: Facts) -> list[Mapping[str, Any]]:
    """The GPUs nvidia-smi listed ([] when the gpu section is not ok)."""
    data = section(facts, "gpu")
    if data.get("status") != "ok":
        return []
    return [gpu for gpu in data.get("gpus") or [] if isinstance(gpu, Mapping)]


def value(gpu: Mapping[str, Any], key: str) -> str | None:
    """A health value as nvidia-smi printed it, None when not reported."""
    text = gpu.get(key)
    if text is None or str(text).strip() in NOT_REPORTED:
        return None
    return str(text).strip()


def number(gpu: Mapping[str, Any], key: str) -> int | None:
    """A numeric health value ("16", "0x48"), None when not reported or not a number."""
    text = value(gpu, key)
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def label(gpu: Mapping[str, Any]) -> str:
    """ "GPU 3 (00000000:5D:00.0)"."""
    return f"GPU {gpu.get('index', '?')} ({gpu.get('pci_bus_id', 'bus id unknown')})"


def refused(facts: Facts, check_id: str, what: str) -> Finding | None:
    """A warning when the driver refused the health fields, else None."""
    error = section(facts, "gpu").get("health_error")
    if not error:
        return None
    return warned(check_id, f"cannot check {what}: {error}", HEALTH_REFUSED_FIX)


def reasons_text(bits: int, names: Mapping[int, str]) -> list[str]:
    """The names of the set bits of a clocks_event_reasons mask."""
    return [name for bit, name in names.items() if bits & bit]


# ---------------------------------------------------------------- gpu.ecc

def ecc_problems(gpu: Mapping[str, Any]) -> list[str]:
    """What is wrong with one GPU's memory: uncorrected errors, pending remaps/retirements."""
    problems = []
    uncorrected = number(gpu, "ecc_errors_uncorrected_volatile_total")
    if uncorrected:
        problems.append(f"{plural(uncorrected, 'uncorrected volatile ECC error')}")
    if value(gpu, "retired_pages_pending") == "Yes":
        problems.append("page retirement pending")
    if value(gpu, "remapped_rows_pending") == "Yes":
        problems.append("row remap pending")
    if value(gpu, "remapped_rows_failure") == "Yes":
        problems.append("row remapping FAILED")
    return problems


def ecc_fix(bad: list[tuple[Mapping[str, Any], list[str]]]) -> str:
    """RMA for a row-remap failure, else a reset that completes the remap/retirement."""
    if any("row remapping FAILED" in problems for _, problems in bad):
        return (f"the GPU's memory has no spare rows left: {DRAIN} and RMA the GPU "
                "(`nvidia-smi -q -d ROW_REMAPPER` shows it)")
    indexes = ",".join(str(gpu.get("index", "?")) for gpu, _ in bad)
    return (f"{DRAIN}, then reset the GPU (`nvidia-smi -r -i {indexes}` with no process on it) or reboot, "
            "so the pending row remap / page retirement takes effect; run `dcgmi diag -r 3` before "
            "returning it to service; uncorrected errors that come back mean RMA")


def check_ecc(facts: Facts, gpus: list[Mapping[str, Any]]) -> Finding:
    """gpu.ecc: no volatile uncorrected errors, no pending retirement/remap, no remap failure."""
    problem = refused(facts, "gpu.ecc", "ECC")
    if problem:
        return problem
    bad = [(gpu, ecc_problems(gpu)) for gpu in gpus]
    bad = [(gpu, problems) for gpu, problems in bad if problems]
    if bad:
        text = "; ".join(f"{label(gpu)}: {', '.join(problems)}" for gpu, problems in bad)
        return failed("gpu.ecc", text, ecc_fix(bad))
    disabled = [label(gpu) for gpu in gpus if value(gpu, "ecc_mode_current") == "Disabled"]
    if disabled:
        return warned("gpu.ecc", f"ECC is disabled on {', '.join(disabled)}",
                      "enable it with `nvidia-smi -e 1` and reboot (memory errors go unnoticed without ECC)")
    if all(value(gpu, "ecc_mode_current") is None for gpu in gpus):
        return passed("gpu.ecc", "ECC is not reported by these GPUs")
    return passed("gpu.ecc", f"{plural(len(gpus), 'GPU')}: no uncorrected ECC errors, no pending row remap")


# ---------------------------------------------------------------- gpu.pcie_link

def narrow_links(gpus: list[Mapping[str, Any]]) -> list[str]:
    """GPUs whose PCIe link trained below its maximum width."""
    bad = []
    for gpu in gpus:
        current, maximum = number(gpu, "pcie_link_width_current"), number(gpu, "pcie_link_width_max")
        if current is not None and maximum is not None and current < maximum:
            bad.append(f"{label(gpu)}: PCIe link x{current}, capable of x{maximum}")
    return bad


def slow_busy_links(gpus: list[Mapping[str, Any]]) -> list[str]:
    """GPUs below their maximum PCIe generation while not idle (idle GPUs drop it to save power)."""
    slow = []
    for gpu in gpus:
        current, maximum = number(gpu, "pcie_link_gen_current"), number(gpu, "pcie_link_gen_max")
        reasons = number(gpu, "clocks_event_reasons_active")
        idle = reasons is not None and bool(reasons & IDLE)
        if current is not None and maximum is not None and current < maximum and not idle:
            slow.append(f"{label(gpu)}: PCIe Gen{current} while busy, capable of Gen{maximum}")
    return slow


def check_pcie_link(facts: Facts, gpus: list[Mapping[str, Any]]) -> Finding:
    """gpu.pcie_link: width below max fails; a lower generation on a busy GPU warns."""
    problem = refused(facts, "gpu.pcie_link", "the PCIe links")
    if problem:
        return problem
    narrow = narrow_links(gpus)
    if narrow:
        slot = bus_key(str(next(gpu for gpu in gpus if narrow_links([gpu])).get("pci_bus_id", "")))
        return failed("gpu.pcie_link", "; ".join(narrow),
                      f"the link trained at a reduced width: reseat the GPU and check its riser, cable and slot "
                      f"(`lspci -vv -s {slot}` shows LnkSta below LnkCap); {DRAIN} until fixed")
    slow = slow_busy_links(gpus)
    if slow:
        return warned("gpu.pcie_link", "; ".join(slow),
                      "a link stuck below its generation under load halves host<->GPU bandwidth: check the "
                      "riser/cable and the BIOS PCIe speed setting, reseat the GPU")
    if all(number(gpu, "pcie_link_width_max") is None for gpu in gpus):
        return passed("gpu.pcie_link", "PCIe link width is not reported by these GPUs")
    return passed("gpu.pcie_link", f"{plural(len(gpus), 'GPU')} at full PCIe link width")


# ---------------------------------------------------------------- gpu.throttle

def throttle_fix(bits: int) -> str:
    """Cooling for thermal slowdowns, power for the power brake; both for plain HW slowdown."""
    steps = []
    if bits & (THERMAL | 0x8):
        steps.append("check cooling: fans, airflow, inlet temperature and heatsink contact "
                     "(`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`)")
    if bits & (POWER_BRAKE | 0x8):
        steps.append("check the power supplies and power feeds (an external power brake slows the GPU)")
    return "; ".join(steps) + f"; {DRAIN} until the slowdown clears: every rank waits for this GPU"


def check_throttle(facts: Facts, gpus: list[Mapping[str, Any]]) -> Finding:
    """gpu.throttle: HW slowdown, HW/SW thermal slowdown or power brake fails; idle, app clocks, power cap pass."""
    problem = refused(facts, "gpu.throttle", "clock slowdowns")
    if problem:
        return problem
    bad, benign, union = [], set(), 0
    for gpu in gpus:
        bits = number(gpu, "clocks_event_reasons_active")
        if bits is None:
            continue
        benign.update(reasons_text(bits, BENIGN_REASONS))
        if bits & sum(FAILING_REASONS):
            union |= bits
            temperature = value(gpu, "temperature_gpu")
            shown = f", {temperature} C" if temperature else ""
            bad.append(f"{label(gpu)}: {' + '.join(reasons_text(bits, FAILING_REASONS))} "
                       f"(clocks_event_reasons.active {bits:#x}{shown})")
    if bad:
        return failed("gpu.throttle", "; ".join(bad), throttle_fix(union))
    note = f" ({', '.join(sorted(benign))} only)" if benign else ""
    return passed("gpu.throttle", f"no GPU reports a HW slowdown, thermal slowdown or power brake{note}")


# ---------------------------------------------------------------- gpu.xid

def window_seconds(value: Any) -> int:
    """expect.xid_window ("24h", "30m", "7d", or seconds) in seconds; unset = 24 h."""
    if value is None:
        return DEFAULT_XID_WINDOW_S
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration")
    return int(match.group(1)) * UNITS[match.group(2)]


def bus_key(bus_id: str) -> str:
    """ "00000000:2A:00.0" and "0000:2a:00" -> "2a:00" (bus:device, as Xid lines name the GPU)."""
    parts = bus_id.lower().split(".")[0].split(":")
    return ":".join(parts[-2:])


def ago(seconds: Any) -> str:
    """ "10 min ago", "3.0 h ago", "age unknown"."""
    if not isinstance(seconds, (int, float)):
        return "age unknown"
    return f"{seconds / 60:.0f} min ago" if seconds < 5400 else f"{seconds / 3600:.1f} h ago"


def gpu_of(event: Mapping[str, Any], gpus: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The GPU an Xid line names by its PCI bus, if nvidia-smi lists it."""
    pci = bus_key(str(event.get("pci") or ""))
    return next((gpu for gpu in gpus if bus_key(str(gpu.get("pci_bus_id", ""))) == pci), None)


def describe_xid(event: Mapping[str, Any], gpus: list[Mapping[str, Any]]) -> str:
    """ "Xid 79 on GPU 1 (00000000:2A:00.0) 10 min ago: GPU has fallen off the bus."."""
    gpu = gpu_of(event, gpus)
    where = label(gpu) if gpu is not None else f"PCI {event.get('pci')}"
    head = f"Xid {event.get('xid')} on {where} {ago(event.get('age_s'))}"
    return f"{head}: {event['text']}" if event.get("text") else head


def recent_xids(xid: Mapping[str, Any], window_s: int) -> list[Mapping[str, Any]]:
    """Events of the xid facts inside the window (an event of unknown age counts as recent)."""
    events = [e for e in xid.get("events") or [] if isinstance(e, Mapping)]
    return [e for e in events if not isinstance(e.get("age_s"), (int, float)) or e["age_s"] <= window_s]


def xid_fix(bad: list[Mapping[str, Any]], gpus: list[Mapping[str, Any]]) -> str:
    """Drain, reset, then diagnostics/RMA; with the hint for each Xid seen."""
    hints = sorted({f"Xid {e['xid']}: {XID_HINTS[e['xid']]}" for e in bad if e.get("xid") in XID_HINTS})
    found = [gpu_of(event, gpus) for event in bad]
    indexes = ",".join(sorted({str(gpu.get("index")) for gpu in found if gpu is not None})) or "<index>"
    return (f"{DRAIN}; reset the GPU (`nvidia-smi -r -i {indexes}`) or reboot; if the Xid comes back, run "
            "`dcgmi diag -r 3` and RMA the GPU" + (" (" + "; ".join(hints) + ")" if hints else ""))


def check_xid(facts: Facts, gpus: list[Mapping[str, Any]], window_s: int, window_text: str) -> Finding:
    """gpu.xid: no Xid of RESET_XIDS within the window; an unreadable log warns."""
    problem = section_problem(facts, "xid")
    if problem is not None:
        return warned("gpu.xid", f"cannot read the kernel log for Xid errors: {problem}",
                      "run preflight as a user who may read it (root; or `sysctl kernel.dmesg_restrict=0`; "
                      "or membership of the adm / systemd-journal group for journalctl)")
    xid = section(facts, "xid")
    recent = recent_xids(xid, window_s)
    bad = [event for event in recent if event.get("xid") in RESET_XIDS]
    if bad:
        shown = "; ".join(describe_xid(event, gpus) for event in bad[:3])
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        return failed("gpu.xid", f"{shown}{more} (within expect.xid_window {window_text})", xid_fix(bad, gpus))
    other = sorted({str(event.get("xid")) for event in recent})
    note = f"; other Xids: {', '.join(other)}" if other else ""
    return passed("gpu.xid", f"no Xid needing a reset in the last {window_text} ({xid.get('source')}{note})")


# ---------------------------------------------------------------- entry point

# A profile that sets any of these expects GPUs, so their health is checked too.
GPU_EXPECTATIONS = ("gpus_per_node", "gpu_model", "min_driver", "xid_window")


def expected_gpus(facts: Facts, profile: Profile) -> list[Mapping[str, Any]]:
    """The GPUs nvidia-smi listed, when the profile expects GPUs ([] otherwise): the
    GPU health checks run on these."""
    expect = settings(profile, "expect")
    if not any(expect.get(key) is not None for key in GPU_EXPECTATIONS):
        return []
    return gpu_list(facts)


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """The four health checks, when the profile expects GPUs and nvidia-smi listed some."""
    gpus = expected_gpus(facts, profile)
    if not gpus:
        return []
    expect = settings(profile, "expect")
    window = expect.get("xid_window")
    findings = [check_ecc(facts, gpus), check_pcie_link(facts, gpus), check_throttle(facts, gpus)]
    try:
        seconds = window_seconds(window)
    except ValueError:
        findings.append(warned("gpu.xid", f"expect.xid_window {window!r} is not a duration",
                               "write it as seconds or with s/m/h/d, e.g. 24h"))
    else:
        findings.append(check_xid(facts, gpus, seconds, str(window or "24h")))
    return [named_drain(finding) for finding in findings]


def named_drain(finding: Finding) -> Finding:
    """The drain step of a fix with the reason `audit --drain` uses.

    The node stays `<node>`: nodes with the same fault must keep the same fix,
    so that the report folds them into one line.
    """
    finding.fix = finding.fix.replace(DRAIN_REASON, f'reason="clusterkit: {finding.id}"')
    return finding
