"""One job lifecycle for every command: submit, follow, explain, cancel.

`submit_job` (request.py) is the one submit of `clusterkit submit` and of the
Python API (`cluster_kit.submit`): overrides, sweeps as array jobs, dependencies.

`submit`, `bench allreduce` and `bench ddp` submit and wait through here, so a
job Slurm can never start is cancelled the same way everywhere, every job gets
a record, and every ended job is explained the same way (Slurm's state, the
first failing task, the job's exit code). A job with `resilience:` is followed
through its chain of attempts (chains.py) by the one loop of follow_loop.py, behind
`submit --wait`, `logs -f`, `Job.wait()` and `Job.logs(follow=True)`; `look` is that
loop's first step, all that `status` needs.

`__all__` is the room's surface: the names below, and the modules other rooms
import (records, chains, and diagnosis and chain_diagnosis, which load only when
asked for).
"""
from cluster_kit.lifecycle.chains import (
    Chain,
    find_chain,
    read_chain,
    remember_chain,
    restart_line,
)
from cluster_kit.lifecycle.follow_loop import (
    Ended,
    Following,
    Look,
    Polled,
    Restarted,
    Wrote,
    cancel,
    follow,
    look,
    settled_chain,
    state_changes,
    wait,
)
from cluster_kit.lifecycle.outcome import (
    FORGOTTEN,
    Outcome,
    chain_outcome,
    explain_status,
    job_outcome,
    status_or_record,
)
from cluster_kit.lifecycle.output import Output, output_paths
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
    "Ended",
    "Following",
    "JobRecord",
    "Look",
    "Outcome",
    "Output",
    "Polled",
    "Restarted",
    "SubmitRequest",
    "Submitted",
    "Wrote",
    "cancel",
    "chain_diagnosis",
    "chain_outcome",
    "chains",
    "diagnosis",
    "explain_status",
    "find_chain",
    "follow",
    "job_outcome",
    "look",
    "output_dir",
    "output_paths",
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
