"""gpu.recovery_action: the driver's own verdict that a GPU needs a reset, a reboot or a drain.

The fact is `gpu_recovery_action` of the probe's one `nvidia-smi --query-gpu`
call (newer drivers; `nvidia-smi --help-query-gpu`: "the GPU Recovery action
recommended to recover from a bad state"). nvidia-smi prints `None` when nothing
is pending, else one of the actions below; `[N/A]` where the GPU or
configuration does not support it. A driver that does not know the field
passes with a note: the other health checks still read that node.
Runs with the other GPU health checks (`gpu_health.GPU_EXPECTATIONS`).
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
    warned,
)
from cluster_kit.checks.gpu_health import (
    DRAIN,
    NOT_REPORTED,
    expected_gpus,
    label,
    named_drain,
)

FIELD = "gpu_recovery_action"
NOTHING_PENDING = "none"
# nvmlDeviceGpuRecoveryAction_t as nvidia-smi spells it, lower-cased, with what to do.
ACTIONS = {
    "gpu reset": "reset the GPU: `nvidia-smi -r -i {indexes}` with no process on it (or reboot the node)",
    "node reboot": "reboot the node: the driver cannot recover the GPU without it",
    "drain p2p": ("let the running job finish without starting new ones (peer-to-peer/NVLink traffic must "
                  "stop), then reset the GPU (`nvidia-smi -r -i {indexes}`) or reboot"),
    "drain and reset": ("let the running job finish without starting new ones, then reset the GPU "
                        "(`nvidia-smi -r -i {indexes}`) or reboot"),
}
SEVERITY = ("node reboot", "gpu reset", "drain and reset", "drain p2p")   # the fix of the first one found wins


def action_of(gpu: Mapping[str, Any]) -> str | None:
    """The GPU's recovery action in lower case ("none", "gpu reset", ...), None when not reported."""
    text = gpu.get(FIELD)
    if text is None or str(text).strip() in NOT_REPORTED:
        return None
    return " ".join(str(text).replace("_", " ").split()).lower()


def recovery_fix(pending: list[tuple[Mapping[str, Any], str]]) -> str:
    """Drain, then the most drastic action asked for, on the GPUs that ask for it."""
    worst = min((action for _, action in pending if action in ACTIONS), key=SEVERITY.index, default=None)
    if worst is None:
        return (f"{DRAIN}; read `nvidia-smi -q` (GPU Recovery Action) and the kernel log, "
                "then reset the GPU or reboot the node")
    indexes = ",".join(str(gpu.get("index", "?")) for gpu, action in pending if action == worst)
    return f"{DRAIN}; " + ACTIONS[worst].format(indexes=indexes) + \
        "; run `dcgmi diag -r 3` before returning it to service"


def check_recovery_action(gpus: list[Mapping[str, Any]]) -> Finding:
    """gpu.recovery_action: every reporting GPU says None; an action fails, an error text warns."""
    actions = [(gpu, action_of(gpu)) for gpu in gpus]
    reported = [(gpu, action) for gpu, action in actions if action is not None]
    if not reported:
        return passed("gpu.recovery_action", "the driver reports no GPU recovery action (field unknown to it or not supported)")
    pending = [(gpu, action) for gpu, action in reported if action in ACTIONS]
    if pending:
        text = "; ".join(f"{label(gpu)} asks for: {gpu.get(FIELD)}" for gpu, _ in pending)
        return failed("gpu.recovery_action", text, recovery_fix(pending))
    odd = [(gpu, action) for gpu, action in reported if action != NOTHING_PENDING]
    if odd:
        text = "; ".join(f"{label(gpu)}: {gpu.get(FIELD)}" for gpu, _ in odd)
        return warned("gpu.recovery_action", f"cannot read the recovery action: {text}", recovery_fix([]))
    return passed("gpu.recovery_action", f"{plural(len(reported), 'GPU')}: no recovery action pending")


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """gpu.recovery_action, when the profile expects GPUs and nvidia-smi listed some."""
    gpus = expected_gpus(facts, profile)
    if not gpus:
        return []
    return [named_drain(check_recovery_action(gpus))]
