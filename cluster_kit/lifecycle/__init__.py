"""One job lifecycle for every command: submit, follow, explain, cancel.

`submit_job` (request.py) is the one submit of `clusterkit submit` and of the
Python API (`cluster_kit.submit`): overrides, sweeps as array jobs, dependencies.

`submit`, `bench allreduce` and `bench ddp` submit and wait through here, so a
job Slurm can never start is cancelled the same way everywhere, every job gets
a record, and every ended job is explained the same way (Slurm's state, the
first failing task, the job's exit code). A job with `resilience:` is followed
through its chain of attempts (chains.py) by `wait`, `status`, `logs` and `diagnose`.

`__all__` is the room's surface: the names below, and the modules other rooms
import (records, chains, and diagnosis and chain_diagnosis, which load only when
asked for).
"""
from cluster_kit.lifecycle.chains import (
                                          Chain,
                                          ChainOutput,
                                          find_chain,
                                          read_chain,
                                          remember_chain,
                                          restart_line,
)
from cluster_kit.lifecycle.follow import (
                                          FORGOTTEN,
                                          Outcome,
                                          cancel,
                                          chain_outcome,
                                          explain_status,
                                          job_outcome,
                                          settled_chain,
                                          state_changes,
                                          status_or_record,
                                          wait,
)
from cluster_kit.lifecycle.records import JobRecord
from cluster_kit.lifecycle.request import SubmitRequest, Submitted, submit_job
from cluster_kit.lifecycle.submission import (
                                          output_dir,
                                          refuse_never_start,
                                          submit,
                                          where_key,
)

__all__ = [
                                          "FORGOTTEN",
                                          "Chain",
                                          "ChainOutput",
                                          "JobRecord",
                                          "Outcome",
                                          "SubmitRequest",
                                          "Submitted",
                                          "cancel",
                                          "chain_diagnosis",
                                          "chain_outcome",
                                          "chains",
                                          "diagnosis",
                                          "explain_status",
                                          "find_chain",
                                          "job_outcome",
                                          "output_dir",
                                          "read_chain",
                                          "records",
                                          "refuse_never_start",
                                          "remember_chain",
                                          "restart_line",
                                          "settled_chain",
                                          "state_changes",
                                          "status_or_record",
                                          "submit",
                                          "submit_job",
                                          "wait",
                                          "where_key",
]
