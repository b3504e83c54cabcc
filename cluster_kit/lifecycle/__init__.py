"""One job lifecycle for every command: submit, follow, explain, cancel.

`submit`, `bench allreduce` and `bench ddp` submit and wait through here, so a
job Slurm can never start is cancelled the same way everywhere, every job gets
a record, and every ended job is explained the same way (Slurm's state, the
first failing task, the job's exit code).
"""
from cluster_kit.lifecycle.follow import (
                                          Outcome,
                                          explain_status,
                                          job_outcome,
                                          state_changes,
                                          status_or_record,
                                          wait,
)
from cluster_kit.lifecycle.records import JobRecord
from cluster_kit.lifecycle.submission import refuse_never_start, submit, where_key

__all__ = ["JobRecord", "Outcome", "explain_status", "job_outcome", "refuse_never_start",
           "state_changes", "status_or_record", "submit", "wait", "where_key"]
