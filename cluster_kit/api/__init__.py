"""The Python API: submit a job (or a sweep as one array job) from a script or a
notebook, and follow it.

    import cluster_kit
    job = cluster_kit.submit("job.yaml", overrides={"env.LR": "3e-4"})
    result = job.wait()            # JobResult: exit_code, state, explanation, ...
    print("".join(job.logs()))

The same implementation as `clusterkit submit` (lifecycle/request.py): overrides are
validated like the job file, preflight routes around failing nodes, every job gets
a record. Nothing here prints or exits: failures raise `ClusterKitError` subclasses
whose `exit_code` is the CLI's and whose `fix` says what to do.
"""
from cluster_kit.api.job import Job, JobResult
from cluster_kit.api.submitting import submit, submit_sweep
from cluster_kit.errors import ClusterKitError

__all__ = ["ClusterKitError", "Job", "JobResult", "submit", "submit_sweep"]
