"""The dev cluster's planted kernel-log lines keep their age however long the machine
and the cluster have been up: the stand-in dmesg (scripts/devcluster/dmesg.py) and
the probe read one clock, faked here through $CLUSTERKIT_PROBE_ROOT/proc/uptime."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cluster_kit.checks.gpu_health import ago
from cluster_kit.node import probe

STAND_IN = Path(__file__).resolve().parents[3] / "scripts" / "devcluster" / "dmesg.py"
XID_79 = "NVRM: Xid (PCI:0000:2a:00): 79, pid=0, name=python, GPU has fallen off the bus."
XID_13 = "NVRM: Xid (PCI:0000:2a:00): 13, pid=0, name=python, Graphics Exception"


@pytest.mark.parametrize(("uptime_s", "ages"), [
    (90.0, [90.0, 90.0]),            # a machine booted 90 s ago: both lines at boot
    (420.0, [420.0, 300.0]),         # 7 min: the 10-minute line at boot
    (3600.0, [600.0, 300.0]),        # a cluster up for an hour
    (30 * 86400.0, [600.0, 300.0]),  # a month
])
def test_planted_lines_are_read_back_at_their_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uptime_s: float, ages: list[float],
) -> None:
    node = tmp_path / "node"
    (node / "bin").mkdir(parents=True)
    shutil.copy(STAND_IN, node / "bin" / "dmesg")
    (node / "bin" / "dmesg").chmod(0o755)
    (node / "dmesg.txt").write_text(f"600\t{XID_79}\n300\t{XID_13}\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "uptime").write_text(f"{uptime_s:.2f} 1.00\n")
    monkeypatch.setenv("PATH", f"{node / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv(probe.ROOT_ENV, str(tmp_path))

    events, why = probe.dmesg_xids()
    assert why == "" and events is not None
    assert [(e["xid"], e["age_s"]) for e in events] == [(79, ages[0]), (13, ages[1])]
    assert ago(events[0]["age_s"]) == ago(min(600.0, uptime_s))
