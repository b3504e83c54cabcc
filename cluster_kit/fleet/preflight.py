"""Preflight: run the probe on every node, evaluate the checks, build the report.

The network part is passed in (`fan_out`), so the report logic is plain data in,
plain data out; the CLI hands it `remote.fan_out`.
"""
from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cluster_kit.checks import Finding, evaluate, node_status
from cluster_kit.checks.findings import STATUS_ORDER
from cluster_kit.ssh import unresolved_fix

NO_PYTHON_EXIT = 127

FanOut = Callable[..., list[Any]]


def probe_source() -> str:
    """The probe script's text, as sent to `python3 -` on each node."""
    return (Path(__file__).parent.parent / "node" / "probe.py").read_text()


def build_probe_command(python: str, deep: bool = False) -> str:
    """The remote command that runs the probe read from stdin.

    `python` is the job's interpreter: the probe looks for libnccl in its
    site-packages too, and imports torch with it when `deep` (which also runs
    DCGM's quick diagnostic, `--dcgm`: only here, never in a job). The probe itself
    runs on the node's python3, or RHEL's platform-python where that is all
    there is; neither found exits 127 with "python3 not found".
    """
    args = ["--python", python] + (["--deep", python, "--dcgm"] if deep else [])
    script = ('for p in python3 /usr/libexec/platform-python; do '
              'if command -v "$p" >/dev/null 2>&1; then exec "$p" - "$@"; fi; done; '
              'echo "python3 not found" >&2; exit 127')
    return shlex.join(["sh", "-c", script, "clusterkit-probe", *args])


def parse_probe_output(stdout: str) -> dict[str, Any]:
    """The facts JSON printed by the probe (the last JSON line, to skip login banners)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return dict(json.loads(line))
    raise ValueError("the probe printed no JSON")


def node_findings(result: Any, profile: dict[str, Any], deep: bool) -> tuple[str, list[Finding], dict[str, Any] | None]:
    """Status, findings and facts of one node from its SSH result."""
    if not result.ok and result.exit_status is None:
        error = result.error or "no answer"
        fix = getattr(result, "fix", None) or _reach_fix(error, result.host)
        return "unreachable", [Finding("ssh.reachable", "unreachable", error, fix)], None
    if result.exit_status == NO_PYTHON_EXIT and "python3" in (result.stderr or ""):
        return "fail", [Finding("probe.python", "fail", "python3 not found on the node",
                                "install python3 (any 3.6+) on the node image")], None
    try:
        facts = parse_probe_output(result.stdout or "")
    except ValueError as exc:
        detail = (result.stderr or "").strip().splitlines()[-1:] or [str(exc)]
        return "fail", [Finding("probe.run", "fail", f"the probe failed: {detail[0]}",
                                "run `clusterkit probe` on the node to see the full error")], None
    findings = evaluate(facts, profile, deep=deep)
    return node_status(findings), findings, facts


def _reach_fix(error: str, host: str) -> str:
    """The fix of an unreachable node, for SSH failures whose step named none."""
    if "does not resolve" in error:
        return unresolved_fix(host, "the jump host" if "jump host" in error else "this machine")
    if "has changed" in error.lower():
        return ("verify the node's new host key out of band, then remove its old line from known_hosts "
                "(ssh-keygen -R NODE) and record the new key")
    if "host key" in error.lower():
        return "verify the node's host key out of band, then add it to known_hosts"
    if "auth" in error.lower():
        return AUTH_FIX
    return REACH_FIX


# Fixes that name the profile's keys; a command without a profile (init) says its own.
AUTH_FIX = "check ssh.user and ssh.identity_file (or ssh-agent) in the profile"
REACH_FIX = "check that the node is up and sshd answers (ssh.connect_timeout, ssh.proxy_jump)"


def node_entry(result: Any, profile: dict[str, Any], deep: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One entry of the report's `nodes` list (SPEC shape) and the node's facts."""
    status, findings, facts = node_findings(result, profile, deep)
    entry = {"node": result.host, "status": status, "elapsed_s": round(result.elapsed_s, 2),
             "checks": [asdict(f) for f in findings]}
    return entry, facts


def summarise(entries: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Counts of node statuses, every status present."""
    counts = {s: 0 for s in STATUS_ORDER}
    for entry in entries:
        counts[entry["status"]] += 1
    return counts


def run_preflight(hosts: Sequence[str], profile: dict[str, Any], fan_out: FanOut, *,
                  deep: bool = False, on_result: Callable[..., object] | None = None,
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Probe `hosts` through `fan_out` and evaluate them.

    Returns the SPEC's preflight report and a {node: facts} map (facts of the
    nodes that answered), which audit reuses.
    """
    python = (profile.get("environment") or {}).get("python") or "python3"
    results = fan_out(list(hosts), build_probe_command(python, deep),
                      stdin=probe_source().encode(), on_result=on_result)
    entries, facts = [], {}
    for result in results:
        entry, node_facts = node_entry(result, profile, deep)
        entries.append(entry)
        if node_facts is not None:
            facts[result.host] = node_facts
    report = {"profile": profile.get("name"), "nodes": entries, "summary": summarise(entries)}
    return report, facts


def exit_code(report: dict[str, Any]) -> int:
    """0 when no node failed or was unreachable, else 1 (warnings allowed)."""
    summary = report["summary"]
    return 1 if summary["fail"] or summary["unreachable"] else 0
