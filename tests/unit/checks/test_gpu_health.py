"""Degraded-but-up hardware: gpu.ecc, gpu.pcie_link, gpu.throttle, gpu.xid, rdma.port_errors.

Parsers run on real nvidia-smi text captured on an H200 (tests/data/nvidia_smi/,
re-captured with its capture.sh); checks run on the probe facts of
tests/data/facts/ (written by test_probe.py), pass and fail side of each.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.checks import Finding, evaluate, gpu_health, injob
from cluster_kit.fleet import audit, facts
from cluster_kit.node import probe

DATA = Path(__file__).resolve().parents[2] / "data"
SMI = DATA / "nvidia_smi"
REPO = Path(__file__).resolve().parents[3]
HEALTH_IDS = ("gpu.ecc", "gpu.pcie_link", "gpu.throttle", "gpu.xid", "rdma.port_errors")
PROFILE: dict[str, Any] = {
    "name": "ib-ndr",
    "network": {"fabric": "infiniband", "ib_hca": [f"mlx5_{n}:1" for n in range(8)]},
    "expect": {"gpus_per_node": 8, "gpu_model": "H100", "min_driver": "535.104", "ib_rate_gbps": 400,
               "peermem": True},
}


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((DATA / "facts" / f"{name}.json").read_text()))


def captured(name: str) -> tuple[str, str, int]:
    """(command line, stdout, exit code) of one file written by capture.sh."""
    text = (SMI / name).read_text()
    command, _, rest = text.partition("\n")
    stdout, _, tail = rest.partition("# stderr\n")
    code = int(re.search(r"^# rc (\d+)$", tail, re.MULTILINE).group(1))  # type: ignore[union-attr]
    return command.removeprefix("# $ "), stdout, code


def health(facts_: dict[str, Any], profile: dict[str, Any] = PROFILE) -> dict[str, Finding]:
    return {f.id: f for f in evaluate(facts_, profile) if f.id in HEALTH_IDS}


def with_gpu(name: str, index: int, **values: str) -> dict[str, Any]:
    """Facts of `name` with some health values of GPU `index` replaced."""
    data = copy.deepcopy(load(name))
    data["gpu"]["gpus"][index].update(values)
    return data


# ---------------------------------------------------------------- real nvidia-smi text

def test_capture_asked_exactly_the_probes_queries() -> None:
    """If the probe's fields change, re-capture on a GPU machine (capture.sh).

    query-more.txt is the probe's widest query (GPU_MORE_FIELDS and today's clock
    reason names); query-event/-throttle are the narrower ones it asks a driver
    that refuses one of those."""
    more_event, _more_throttle, event, throttle, _base = probe.health_queries()
    assert captured("query-more.txt")[0] == f"nvidia-smi --query-gpu={','.join(more_event)} --format=csv,noheader"
    assert captured("query-event.txt")[0] == f"nvidia-smi --query-gpu={','.join(event)} --format=csv,noheader"
    assert captured("query-throttle.txt")[0] == (
        f"nvidia-smi --query-gpu={','.join(throttle)} --format=csv,noheader")
    assert captured("remapped.txt")[0] == (
        f"nvidia-smi --query-remapped-rows={','.join(probe.REMAPPED_ROWS_FIELDS)} --format=csv,noheader")


def test_real_h200_widened_query_parses_under_both_clock_reason_names() -> None:
    for name, fields in zip(("query-event.txt", "query-throttle.txt"), probe.health_queries()[2:4]):
        _, out, code = captured(name)
        [gpu] = probe.parse_gpu_csv(out, fields)
        assert code == 0
        assert (gpu["name"], gpu["pci_bus_id"], gpu["driver_version"]) == (
            "NVIDIA H200", "00000000:00:06.0", "580.159.04")
        assert (gpu["ecc_mode_current"], gpu["ecc_errors_uncorrected_volatile_total"]) == ("Enabled", "0")
        assert gpu["retired_pages_pending"] == "[N/A]"      # Hopper remaps rows instead
        assert (gpu["pcie_link_width_current"], gpu["pcie_link_width_max"]) == ("16", "16")
        assert gpu["clocks_event_reasons_active"] == "0x0000000000000001"   # idle


def nvidia_smi_q(text: str) -> dict[str, str]:
    """`nvidia-smi -q` as {"Section/Key": value}: an independent reading of the same GPU."""
    values: dict[str, str] = {}
    path: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.startswith("    ") or not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(" : ")
        path = [(d, k) for d, k in path if d < depth]
        if sep:
            values["/".join([k for _, k in path] + [key.strip()])] = value.strip()
        else:
            path.append((depth, key.strip()))
    return values


def test_real_h200_widest_query_says_what_nvidia_smi_q_says() -> None:
    """The probe's one query (GPU_MORE_FIELDS included) against `nvidia-smi -q` of the same H200."""
    _, out, code = captured("query-more.txt")
    [gpu] = probe.parse_gpu_csv(out, probe.health_queries()[0])
    q = nvidia_smi_q(captured("q-full.txt")[1])
    assert code == 0
    assert gpu["uuid"] == q["GPU UUID"]
    assert gpu["vbios_version"] == q["VBIOS Version"] == "96.00.A5.00.1A"
    assert gpu["gpu_recovery_action"] == q["GPU Recovery Action"] == "None"
    assert gpu["persistence_mode"] == q["Persistence Mode"]
    assert gpu["ecc_mode_current"] == q["ECC Mode/Current"]
    assert gpu["clocks_applications_graphics"] == q["Applications Clocks/Graphics"]
    assert gpu["clocks_applications_memory"] == q["Applications Clocks/Memory"]
    assert gpu["pcie_link_gen_current"] == q["PCI/GPU Link Info/PCIe Generation/Current"]
    assert gpu["pcie_link_width_max"] == q["PCI/GPU Link Info/Link Width/Max"].removesuffix("x")


def test_real_h200_without_nvlink_passes_the_new_checks() -> None:
    """A pass-through H200 has no NVLink: `nvlink -s/-e` print nothing and exit 0."""
    assert [captured(name)[1:] for name in ("nvlink-s.txt", "nvlink-e.txt")] == [("", 0), ("", 0)]
    assert probe.parse_nvlink_status("") == {} and probe.parse_nvlink_errors("") == {}
    real = load("real-h200-probe")   # the probe itself, run on that H200 (no --deep)
    profile = {"network": {"fabric": "ethernet", "socket_ifname": "eth0"},
               "expect": {"gpus_per_node": 1, "gpu_model": "H200", "min_driver": "570"}}
    found = {f.id: f for f in evaluate(real, profile)}
    assert (found["gpu.recovery_action"].status, found["gpu.nvlink"].status) == ("pass", "pass")
    assert found["gpu.nvlink"].message == "these GPUs have no NVLink"
    assert real["gpu"]["gpus"][0]["vbios_version"] == "96.00.A5.00.1A"
    assert "topo.gpu_nic" not in found      # no HCA on the machine: nothing to place


def test_real_remapped_rows_and_invalid_field_answers() -> None:
    _, out, _ = captured("remapped.txt")
    assert probe.parse_remapped_rows(out) == {"00000000:00:06.0": {
        "remapped_rows_correctable": "0", "remapped_rows_uncorrectable": "0",
        "remapped_rows_pending": "No", "remapped_rows_failure": "No"}}
    _, out, code = captured("badfield.txt")
    assert code == 2
    assert probe.INVALID_FIELD.search(out).group(1) == "clocks_event_reasons.bogus"  # type: ignore[union-attr]


def test_every_queried_field_is_in_the_real_drivers_help() -> None:
    """nvidia-smi --help-query-gpu / --help-query-remapped-rows of driver 580 name each field."""
    help_text = (SMI / "help.txt").read_text()
    fields = {f for query in probe.health_queries() for f in query} | set(probe.REMAPPED_ROWS_FIELDS)
    missing = [f for f in sorted(fields) if f'"{f}"' not in help_text]
    assert missing == []


def test_dev_cluster_stand_in_columns_are_real_fields() -> None:
    spec = importlib.util.spec_from_file_location("fakehw", REPO / "scripts/devcluster/fakehw.py")
    assert spec and spec.loader
    fakehw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fakehw)
    help_text = (SMI / "help.txt").read_text()
    assert [name for name, _ in fakehw.GPU_HEALTH if f'"{name}"' not in help_text] == []
    assert set(probe.PORT_ERROR_COUNTERS) <= set(fakehw.PORT_COUNTERS)


def test_real_ring_buffer_has_nvrm_lines_but_no_xid() -> None:
    text = (SMI / "kernel.txt").read_text()
    assert "NVRM: loading NVIDIA UNIX Open Kernel Module" in text
    assert probe.parse_dmesg_xids(text, 377.8) == []
    line = "[ 8012.113450] NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, DBE (0x1,0x0)"
    assert probe.parse_dmesg_xids(line, 8612.1) == [
        {"xid": 48, "pci": "0000:18:00", "text": "pid='<unknown>', name=<unknown>, DBE (0x1,0x0)", "age_s": 600.0}]


# ---------------------------------------------------------------- each node fails exactly its check

@pytest.mark.parametrize(("node", "check_id", "words"), [
    ("gpu-ecc", "gpu.ecc", ["GPU 2 (00000000:3A:00.0)", "2 uncorrected volatile ECC errors", "row remap pending"]),
    ("gpu-x8", "gpu.pcie_link", ["GPU 5 (00000000:AB:00.0): PCIe link x8, capable of x16"]),
    ("gpu-throttle", "gpu.throttle", ["GPU 3 (00000000:5D:00.0): HW slowdown + HW thermal slowdown",
                                      "0x48", "91 C"]),
    ("gpu-xid", "gpu.xid", ["Xid 79 on GPU 1 (00000000:2A:00.0) 10 min ago: pid=48213, name=python, GPU has",
                            "fallen off the bus."]),
    ("ib-flap", "rdma.port_errors", ["mlx5_1 port 1: symbol_error 4021 (> 100), link_error_recovery 112 (> 10),",
                                     "link_downed 37 (> 5)"]),
])
def test_degraded_node_fails_exactly_its_check(node: str, check_id: str, words: list[str]) -> None:
    findings = evaluate(load(node), PROFILE)
    bad = {f.id: f for f in findings if f.status != "pass"}
    assert list(bad) == [check_id]
    for word in words:
        assert word in bad[check_id].message
    assert bad[check_id].fix


@pytest.mark.parametrize("node", ["ib-ok", "gpu-powercap"])
def test_healthy_and_power_capped_nodes_pass_every_health_check(node: str) -> None:
    found = health(load(node))
    assert set(found) == set(HEALTH_IDS)
    assert {f.status for f in found.values()} == {"pass"}, found


def test_power_cap_and_idle_are_named_but_pass() -> None:
    assert health(load("gpu-powercap"))["gpu.throttle"].message == (
        "no GPU reports a HW slowdown, thermal slowdown or power brake (SW power cap only)")


# ---------------------------------------------------------------- fixes name the concrete step

def test_fixes_are_concrete() -> None:
    assert "nvidia-smi -r -i 2" in health(load("gpu-ecc"))["gpu.ecc"].fix
    assert "reseat the GPU" in health(load("gpu-x8"))["gpu.pcie_link"].fix
    assert "`lspci -vv -s ab:00`" in health(load("gpu-x8"))["gpu.pcie_link"].fix
    throttle = health(load("gpu-throttle"))["gpu.throttle"].fix
    assert "check cooling" in throttle and "power supplies" in throttle   # HW slowdown: either cause
    xid = health(load("gpu-xid"))["gpu.xid"].fix
    assert "nvidia-smi -r -i 1`" in xid and "fallen off the bus: also reseat it" in xid
    assert '`scontrol update nodename=<node> state=drain reason="clusterkit: gpu.xid"`' in xid
    port = health(load("ib-flap"))["rdma.port_errors"].fix
    assert "mlxlink -d mlx5_1 -p 1" in port and "perfquery" in port and "replace the cable or transceiver" in port


def test_thermal_only_points_at_cooling_and_power_brake_at_power() -> None:
    thermal = health(with_gpu("ib-ok", 0, clocks_event_reasons_active="0x0000000000000040"))["gpu.throttle"]
    assert thermal.status == "fail" and "check cooling" in thermal.fix and "power supplies" not in thermal.fix
    brake = health(with_gpu("ib-ok", 0, clocks_event_reasons_active="0x0000000000000080"))["gpu.throttle"]
    assert "HW power brake slowdown" in brake.message and "power supplies" in brake.fix
    sw_thermal = health(with_gpu("ib-ok", 0, clocks_event_reasons_active="0x20"))["gpu.throttle"]
    assert sw_thermal.status == "fail" and "SW thermal slowdown" in sw_thermal.message


def test_application_clocks_and_sync_boost_never_fail() -> None:
    found = health(with_gpu("ib-ok", 0, clocks_event_reasons_active="0x0000000000000016"))["gpu.throttle"]
    assert found.status == "pass"


# ---------------------------------------------------------------- edges

def test_lower_pcie_generation_passes_when_idle_and_warns_when_busy() -> None:
    idle = with_gpu("ib-ok", 4, pcie_link_gen_current="1")
    assert health(idle)["gpu.pcie_link"].status == "pass"
    busy = with_gpu("ib-ok", 4, pcie_link_gen_current="3", clocks_event_reasons_active="0x0000000000000000")
    found = health(busy)["gpu.pcie_link"]
    assert found.status == "warn"
    assert found.message == "GPU 4 (00000000:9A:00.0): PCIe Gen3 while busy, capable of Gen5"


def test_row_remap_failure_means_rma() -> None:
    found = health(with_gpu("ib-ok", 6, remapped_rows_failure="Yes"))["gpu.ecc"]
    assert found.status == "fail" and "row remapping FAILED" in found.message and "RMA" in found.fix


def test_ecc_disabled_warns_and_unsupported_ecc_passes() -> None:
    assert health(with_gpu("ib-ok", 0, ecc_mode_current="Disabled"))["gpu.ecc"].status == "warn"
    no_ecc = copy.deepcopy(load("ib-ok"))
    for gpu in no_ecc["gpu"]["gpus"]:
        gpu.update(ecc_mode_current="[N/A]", ecc_errors_uncorrected_volatile_total="[N/A]")
    assert health(no_ecc)["gpu.ecc"].message == "ECC is not reported by these GPUs"


def test_a_driver_that_refused_the_fields_warns_instead_of_guessing() -> None:
    data = copy.deepcopy(load("ib-ok"))
    data["gpu"]["health_error"] = "nvidia-smi refused the health fields: persistence_mode"
    found = health(data)
    assert {found[i].status for i in ("gpu.ecc", "gpu.pcie_link", "gpu.throttle")} == {"warn"}


def test_xid_window_and_harmless_xids() -> None:
    short = dict(PROFILE, expect=dict(PROFILE["expect"], xid_window="5m"))
    found = health(load("gpu-xid"), short)["gpu.xid"]
    assert found.status == "pass"
    assert found.message == "no Xid needing a reset in the last 5m (dmesg; other Xids: 13)"
    assert health(load("gpu-xid"))["gpu.xid"].message.endswith("(within expect.xid_window 24h)")
    assert gpu_health.window_seconds("7d") == 604800 and gpu_health.window_seconds(90) == 90
    unvalidated = dict(PROFILE, expect=dict(PROFILE["expect"], xid_window="a day"))
    assert health(load("gpu-xid"), unvalidated)["gpu.xid"].status == "warn"


def test_unreadable_kernel_log_warns_with_how_to_read_it() -> None:
    data = copy.deepcopy(load("ib-ok"))
    data["xid"] = {"status": "error", "error": "kernel log unreadable: dmesg: read kernel buffer failed: "
                   "Operation not permitted; journalctl not found on PATH"}
    found = health(data)["gpu.xid"]
    assert found.status == "warn" and "Operation not permitted" in found.message
    assert "dmesg_restrict" in found.fix


def test_thresholds_come_from_expect_and_unlisted_ports_only_warn() -> None:
    lenient = dict(PROFILE, expect=dict(PROFILE["expect"], ib_error_thresholds={
        "link_downed": 40, "link_error_recovery": 200, "symbol_error": 5000}))
    assert health(load("ib-flap"), lenient)["rdma.port_errors"].status == "pass"
    unlisted = dict(PROFILE, network={"fabric": "infiniband"})
    assert health(load("ib-flap"), unlisted)["rdma.port_errors"].status == "warn"
    other_port = dict(PROFILE, network={"fabric": "infiniband", "ib_hca": ["mlx5_0:1"]})
    assert health(load("ib-flap"), other_port)["rdma.port_errors"].status == "pass"


def test_no_gpu_expectation_no_gpu_health_checks() -> None:
    assert [f.id for f in evaluate(load("gpu-ecc"), {"network": {"fabric": "infiniband"}})
            if f.id.startswith("gpu.")] == []


# ---------------------------------------------------------------- facts and audit

def test_flat_facts_keep_steady_health_values_and_mark_counters_per_node() -> None:
    flat = facts.flatten(load("gpu-x8"))
    assert flat["gpu.5.pcie_link_width_current"] == "8" and flat["gpu.5.pcie_link_width_max"] == "16"
    assert "gpu.5.temperature_gpu" not in flat and "gpu.0.retired_pages_pending" not in flat
    assert flat["xid.source"] == "dmesg" and flat["xid.count"] == "0" and flat["xid.reset_codes"] == "none"
    assert flat["gpu.5.slowdown"] == "none"
    assert facts.flatten(load("gpu-throttle"))["gpu.3.slowdown"] == "hw_slowdown,hw_thermal_slowdown"
    assert facts.flatten(load("gpu-powercap"))["gpu.3.slowdown"] == "none"      # SW power cap
    assert facts.flatten(load("gpu-xid"))["xid.reset_codes"] == "79"             # not the Xid 13
    assert flat["rdma.mlx5_1.1.counters.link_downed"] == "0"
    assert facts.is_per_node("rdma.mlx5_1.1.counters.link_downed")
    assert not facts.is_per_node("gpu.5.pcie_link_width_current")


def test_audit_drift_shows_the_x8_gpu() -> None:
    flat = {"n1": facts.flatten(load("ib-ok")), "n2": facts.flatten(load("ib-ok")),
            "n3": facts.flatten(load("gpu-x8"))}
    flat["n4"] = facts.flatten(load("gpu-throttle"))
    flat["n5"] = facts.flatten(load("gpu-xid"))
    drift = {d["fact"]: d for d in audit.compute_drift(flat)}
    assert drift["gpu.5.pcie_link_width_current"]["outliers"] == {"n3": "8"}
    assert drift["gpu.3.slowdown"]["outliers"] == {"n4": "hw_slowdown,hw_thermal_slowdown"}
    assert drift["xid.reset_codes"]["outliers"] == {"n5": "79"}
    assert not any("temperature" in fact or "clocks_event" in fact for fact in drift)


def test_audit_changes_show_counter_growth_since_the_baseline() -> None:
    baseline = {"nodes": {"gpu007": facts.flatten(load("ib-ok"))}}
    changes = audit.diff_baseline(baseline, {"gpu007": facts.flatten(load("ib-flap"))})
    grown = {c["fact"]: c["growth"] for c in changes if "growth" in c}
    assert grown == {"rdma.mlx5_1.1.counters.link_downed": 37, "rdma.mlx5_1.1.counters.link_error_recovery": 112,
                     "rdma.mlx5_1.1.counters.symbol_error": 4021}
    assert "rdma.mlx5_1.1.counters.link_downed 0 -> 37 (+37) on gpu007" in audit.summarize_changes(changes)


# ---------------------------------------------------------------- in-job preflight

def test_injob_bundle_runs_the_same_health_checks(tmp_path: Path) -> None:
    """The zip app the sbatch script embeds fails the Xid node and passes the power-capped one."""
    bundle = tmp_path / "checks.pyz"
    bundle.write_bytes(injob.build_bundle(PROFILE))
    lines = []
    torch = load("real-h200")["torch"]  # the job's probe imports torch (--deep): a real H200's answer
    for node, name in (("n1", "gpu-powercap"), ("n2", "gpu-xid"), ("n3", "ib-flap")):
        data = load(name)
        data["slurm_node"] = node
        data["torch"] = torch
        lines.append(json.dumps(data))
    (tmp_path / "facts.jsonl").write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, "-I", str(bundle), str(tmp_path / "facts.jsonl"), "n1", "n2", "n3"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)
    assert done.returncode == 1
    assert "clusterkit preflight: n1: pass" in done.stderr
    assert "clusterkit preflight: n2: fail" in done.stderr
    assert "gpu.xid: Xid 79 on GPU 1 (00000000:2A:00.0)" in done.stderr
    assert "clusterkit preflight: n3: fail" in done.stderr
    assert "rdma.port_errors: mlx5_1 port 1: symbol_error 4021" in done.stderr


def test_validate_names_file_line_for_bad_health_settings(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nexpect:\n  xid_window: 2w\n  ib_error_thresholds:\n    link_downed: -1\n"
                    "    link_flaps: 3\n")
    done = subprocess.run([sys.executable, "-m", "cluster_kit", "validate", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    out = done.stdout + done.stderr
    assert f"{path}:3: expect.xid_window: '2w' is not a time window" in out
    assert f"{path}:5: expect.ib_error_thresholds.link_downed: -1 is too small; use 0 or more" in out
    assert f"{path}:6: unknown key 'link_flaps' in expect.ib_error_thresholds; valid keys: symbol_error" in out


# ---------------------------------------------------------------- whole findings, as a user reads them

def drain(check_id: str) -> str:
    """The drain step of a fix, with the reason `audit --drain` writes."""
    return ("drain the node (`clusterkit audit --drain --apply`, or "
            f'`scontrol update nodename=<node> state=drain reason="clusterkit: {check_id}"`)')


def test_ecc_finding_names_each_gpu_its_problems_and_the_indexes_to_reset() -> None:
    data = with_gpu("gpu-ecc", 5, retired_pages_pending="Yes")      # a pre-Ampere GPU retires pages
    found = health(data)["gpu.ecc"]
    assert (found.status, found.message) == ("fail", ("GPU 2 (00000000:3A:00.0): 2 uncorrected volatile ECC errors, "
                                             "row remap pending; GPU 5 (00000000:AB:00.0): page retirement pending"))
    assert found.fix == (
        f"{drain('gpu.ecc')}, then reset the GPU (`nvidia-smi -r -i 2,5` with no process on it) or reboot, "
        "so the pending row remap / page retirement takes effect; run `dcgmi diag -r 3` before returning it "
        "to service; uncorrected errors that come back mean RMA")


def test_a_row_remap_failure_anywhere_makes_the_fix_an_rma() -> None:
    data = with_gpu("gpu-ecc", 6, remapped_rows_failure="Yes")
    found = health(data)["gpu.ecc"]
    assert found.message.endswith("; GPU 6 (00000000:BA:00.0): row remapping FAILED")
    assert found.fix == (f"the GPU's memory has no spare rows left: {drain('gpu.ecc')} and RMA the GPU "
                         "(`nvidia-smi -q -d ROW_REMAPPER` shows it)")


def test_ecc_disabled_names_every_gpu_without_it() -> None:
    data = with_gpu("ib-ok", 0, ecc_mode_current="Disabled")
    data["gpu"]["gpus"][7]["ecc_mode_current"] = "Disabled"
    found = health(data)["gpu.ecc"]
    assert (found.status, found.message, found.fix) == (
        "warn", "ECC is disabled on GPU 0 (00000000:18:00.0), GPU 7 (00000000:DB:00.0)",
        "enable it with `nvidia-smi -e 1` and reboot (memory errors go unnoticed without ECC)")


def test_healthy_gpus_pass_with_their_count_and_unreported_fields_say_so() -> None:
    found = health(load("ib-ok"))
    assert found["gpu.ecc"].message == "8 GPUs: no uncorrected ECC errors, no pending row remap"
    assert found["gpu.pcie_link"].message == "8 GPUs at full PCIe link width"
    one = copy.deepcopy(load("ib-ok"))
    one["gpu"]["gpus"] = one["gpu"]["gpus"][:1]
    one_gpu = dict(PROFILE, expect=dict(PROFILE["expect"], gpus_per_node=1))
    assert health(one, one_gpu)["gpu.ecc"].message == "1 GPU: no uncorrected ECC errors, no pending row remap"
    assert health(one, one_gpu)["gpu.pcie_link"].message == "1 GPU at full PCIe link width"
    for gpu in one["gpu"]["gpus"]:
        gpu.update(pcie_link_width_current="[N/A]", pcie_link_width_max="[N/A]")
    unreported = health(one, one_gpu)["gpu.pcie_link"]
    assert (unreported.status, unreported.message) == ("pass", "PCIe link width is not reported by these GPUs")


def test_refused_health_fields_name_what_cannot_be_checked() -> None:
    data = copy.deepcopy(load("ib-ok"))
    error = "nvidia-smi refused the health fields: clocks_event_reasons.active"
    data["gpu"]["health_error"] = error
    found = health(data)
    fix = "upgrade the NVIDIA driver, or read the values by hand with `nvidia-smi -q -d ECC,PCIE,PERFORMANCE`"
    assert [(found[i].status, found[i].message, found[i].fix) for i in ("gpu.ecc", "gpu.pcie_link", "gpu.throttle")] == [
        ("warn", f"cannot check ECC: {error}", fix),
        ("warn", f"cannot check the PCIe links: {error}", fix),
        ("warn", f"cannot check clock slowdowns: {error}", fix)]


def test_two_narrow_links_are_both_named_and_the_first_ones_slot_is_shown() -> None:
    data = with_gpu("gpu-x8", 1, pcie_link_width_current="4")
    found = health(data)["gpu.pcie_link"]
    assert found.message == ("GPU 1 (00000000:2A:00.0): PCIe link x4, capable of x16; "
                             "GPU 5 (00000000:AB:00.0): PCIe link x8, capable of x16")
    assert found.fix == ("the link trained at a reduced width: reseat the GPU and check its riser, cable and slot "
                         f"(`lspci -vv -s 2a:00` shows LnkSta below LnkCap); {drain('gpu.pcie_link')} until fixed")


def test_two_slow_busy_links_warn_with_the_whole_fix() -> None:
    data = with_gpu("ib-ok", 2, pcie_link_gen_current="4", clocks_event_reasons_active="0x0")
    data["gpu"]["gpus"][4].update(pcie_link_gen_current="3", clocks_event_reasons_active="0x0")
    found = health(data)["gpu.pcie_link"]
    assert (found.status, found.message) == ("warn", ("GPU 2 (00000000:3A:00.0): PCIe Gen4 while busy, capable of "
                                             "Gen5; GPU 4 (00000000:9A:00.0): PCIe Gen3 while busy, capable of Gen5"))
    assert found.fix == ("a link stuck below its generation under load halves host<->GPU bandwidth: check the "
                         "riser/cable and the BIOS PCIe speed setting, reseat the GPU")


def test_throttled_gpus_after_an_unreported_one_are_all_named_and_both_causes_fixed() -> None:
    data = with_gpu("ib-ok", 0, clocks_event_reasons_active="[N/A]")
    data["gpu"]["gpus"][3].update(clocks_event_reasons_active="0x40", temperature_gpu="[N/A]")
    data["gpu"]["gpus"][5].update(clocks_event_reasons_active="0x80", temperature_gpu="70")
    found = health(data)["gpu.throttle"]
    assert found.message == ("GPU 3 (00000000:5D:00.0): HW thermal slowdown (clocks_event_reasons.active 0x40); "
                             "GPU 5 (00000000:AB:00.0): HW power brake slowdown (clocks_event_reasons.active 0x80, "
                             "70 C)")
    assert found.fix == ("check cooling: fans, airflow, inlet temperature and heatsink contact "
                         "(`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`); check the power supplies and power feeds "
                         "(an external power brake slows the GPU); "
                         f"{drain('gpu.throttle')} until the slowdown clears: every rank waits for this GPU")


def test_an_idle_bit_beside_a_slowdown_does_not_change_its_cause() -> None:
    brake = health(with_gpu("ib-ok", 1, clocks_event_reasons_active="0x81"))["gpu.throttle"]
    assert brake.fix == ("check the power supplies and power feeds (an external power brake slows the GPU); "
                         f"{drain('gpu.throttle')} until the slowdown clears: every rank waits for this GPU")
    thermal = health(with_gpu("ib-ok", 1, clocks_event_reasons_active="0x41"))["gpu.throttle"]
    assert thermal.status == "fail" and "power supplies" not in thermal.fix and "check cooling" in thermal.fix


def test_the_pass_names_the_benign_reasons_seen_or_none() -> None:
    busy = copy.deepcopy(load("ib-ok"))
    for gpu in busy["gpu"]["gpus"]:
        gpu["clocks_event_reasons_active"] = "0x0"
    assert health(busy)["gpu.throttle"].message == "no GPU reports a HW slowdown, thermal slowdown or power brake"
    capped = with_gpu("ib-ok", 1, clocks_event_reasons_active="0x4")
    assert health(capped)["gpu.throttle"].message == (
        "no GPU reports a HW slowdown, thermal slowdown or power brake (SW power cap, idle only)")


def xid_facts(*events: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(load("ib-ok"))
    data["xid"]["events"] = list(events)
    data["xid"]["total"] = len(events)
    return data


def test_xid_whole_finding_with_ages_hints_and_every_gpu_to_reset() -> None:
    data = xid_facts({"xid": 48, "pci": "0000:3a:00", "text": "DBE (0x1,0x0)", "age_s": 3000.0},
                     {"xid": 79, "pci": "0000:ab:00", "text": "GPU has fallen off the bus.", "age_s": 5400.0},
                     {"xid": 79, "pci": "0000:18:00", "text": "GPU has fallen off the bus.", "age_s": 5580.0})
    found = health(data)["gpu.xid"]
    assert found.message == ("Xid 48 on GPU 2 (00000000:3A:00.0) 50 min ago: DBE (0x1,0x0); "
                             "Xid 79 on GPU 5 (00000000:AB:00.0) 1.5 h ago: GPU has fallen off the bus.; "
                             "Xid 79 on GPU 0 (00000000:18:00.0) 1.6 h ago: GPU has fallen off the bus. "
                             "(within expect.xid_window 24h)")
    assert found.fix == (f"{drain('gpu.xid')}; reset the GPU (`nvidia-smi -r -i 0,2,5`) or reboot; if the Xid "
                         "comes back, run `dcgmi diag -r 3` and RMA the GPU (Xid 48: a double-bit ECC error; "
                         "Xid 79: the GPU has fallen off the bus: also reseat it and check its riser and power "
                         "cables)")


def test_more_than_three_xids_show_three_and_count_the_rest() -> None:
    events = [{"xid": 79, "pci": "0000:18:00", "text": "GPU has fallen off the bus.", "age_s": 60.0 * n}
              for n in range(1, 5)]
    found = health(xid_facts(*events))["gpu.xid"]
    assert found.message.count("Xid 79 on GPU 0") == 3
    assert found.message.endswith("3 min ago: GPU has fallen off the bus. (and 1 more) "
                                  "(within expect.xid_window 24h)")
    four = health(xid_facts(*events, *events[:1]))["gpu.xid"]
    assert "(and 2 more)" in four.message


def test_an_xid_of_a_gpu_nvidia_smi_no_longer_lists() -> None:
    """A GPU that fell off the bus is gone from nvidia-smi: the Xid names its PCI address."""
    found = health(xid_facts({"xid": 56, "pci": "0000:99:00"}))["gpu.xid"]
    assert found.message == "Xid 56 on PCI 0000:99:00 age unknown (within expect.xid_window 24h)"
    assert found.fix == (f"{drain('gpu.xid')}; reset the GPU (`nvidia-smi -r -i <index>`) or reboot; if the Xid "
                         "comes back, run `dcgmi diag -r 3` and RMA the GPU")


def test_the_kernel_text_of_an_xid_is_kept_to_its_last_character() -> None:
    """The text ends the line as the kernel wrote it, capital X and colon included;
    an Xid without text ends at its age."""
    found = health(xid_facts({"xid": 79, "pci": "0000:18:00", "text": "fallen off: PCI_X", "age_s": 60.0},
                             {"xid": 48, "pci": "0000:18:00", "text": "DBE at:", "age_s": 120.0},
                             {"xid": 79, "pci": "0000:18:00", "text": "", "age_s": 180.0}))["gpu.xid"]
    assert found.message == ("Xid 79 on GPU 0 (00000000:18:00.0) 1 min ago: fallen off: PCI_X; "
                             "Xid 48 on GPU 0 (00000000:18:00.0) 2 min ago: DBE at:; "
                             "Xid 79 on GPU 0 (00000000:18:00.0) 3 min ago (within expect.xid_window 24h)")


def test_xid_pass_lists_the_other_xids_or_nothing() -> None:
    assert health(load("ib-ok"))["gpu.xid"].message == "no Xid needing a reset in the last 24h (dmesg)"
    found = health(xid_facts({"xid": 31, "pci": "0000:18:00", "age_s": 10.0},
                             {"xid": 13, "pci": "0000:18:00", "age_s": 20.0}))["gpu.xid"]
    assert found.message == "no Xid needing a reset in the last 24h (dmesg; other Xids: 13, 31)"


def test_unreadable_kernel_log_and_bad_window_whole_warnings() -> None:
    data = copy.deepcopy(load("ib-ok"))
    data["xid"] = {"status": "error", "error": "kernel log unreadable: dmesg: read kernel buffer failed"}
    found = health(data)["gpu.xid"]
    assert (found.message, found.fix) == (
        "cannot read the kernel log for Xid errors: kernel log unreadable: dmesg: read kernel buffer failed",
        ("run preflight as a user who may read it (root; or `sysctl kernel.dmesg_restrict=0`; "
        "or membership of the adm / systemd-journal group for journalctl)"))
    unvalidated = dict(PROFILE, expect=dict(PROFILE["expect"], xid_window="a day"))
    found = health(load("ib-ok"), unvalidated)["gpu.xid"]
    assert (found.status, found.message, found.fix) == (
        "warn", "expect.xid_window 'a day' is not a duration", "write it as seconds or with s/m/h/d, e.g. 24h")
    with pytest.raises(ValueError):
        gpu_health.window_seconds(True)     # `xid_window: yes` is no duration, not 1 s
