"""clusterkit: render, check and submit multi-node PyTorch jobs on Slurm.

The Python API (`submit`, `submit_sweep`, `Job`, `JobResult`, `ClusterKitError`)
is imported on first use, so `import cluster_kit` stays cheap (and this file
stays stdlib-only: it also runs inside jobs, with the in-job checks).
"""
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from cluster_kit.api import Job, JobResult, submit, submit_sweep
    from cluster_kit.errors import (
        CheckFailed,
        ClusterKitError,
        ClusterRefused,
        InputError,
        ValidationError,
    )

_API = {"submit": "cluster_kit.api", "submit_sweep": "cluster_kit.api", "Job": "cluster_kit.api",
        "JobResult": "cluster_kit.api", "ClusterKitError": "cluster_kit.errors",
        "InputError": "cluster_kit.errors", "ValidationError": "cluster_kit.errors",
        "CheckFailed": "cluster_kit.errors", "ClusterRefused": "cluster_kit.errors"}

__all__ = ["CheckFailed", "ClusterKitError", "ClusterRefused", "InputError", "Job", "JobResult",
           "ValidationError", "__version__", "submit", "submit_sweep"]


def __getattr__(name: str) -> Any:
    """The API's names, imported when first used."""
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'cluster_kit' has no attribute {name!r}")
