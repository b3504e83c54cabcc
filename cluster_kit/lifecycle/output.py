"""What a job wrote: its output file; every task's for an array job; every attempt's,
in order, for a job with `resilience:`. Read through the runner, where the files are
(the login host's file system, or here), each read going on where the last stopped.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from cluster_kit.errors import ClusterRefused
from cluster_kit.lifecycle import chains, records
from cluster_kit.lifecycle.submission import where_key
from cluster_kit.slurm import jobs

if TYPE_CHECKING:
    from cluster_kit.slurm.runner import Runner


def output_paths(runner: Runner, job_id: str) -> dict[str, str]:
    """{job or task id: output path}: Slurm's, else the job's record.

    Raises ClusterRefused when Slurm does not know the job, or no longer knows its
    output file and clusterkit has no record of it."""
    paths = jobs.job_output_paths(runner, job_id)
    if paths:
        return paths
    record = records.find(job_id, where_key(runner))
    if record is not None and record.outputs:
        wanted = {k: v for k, v in record.outputs.items() if k == job_id}
        return wanted or dict(record.outputs)
    jobs.job_status(runner, job_id)  # a job Slurm does not know at all is said so
    raise ClusterRefused(f"Slurm {runner.where} no longer knows job {job_id}'s output file, "
                         "and clusterkit has no record of it",
                         fix="read the file the job's --output option names")


class Output:
    """What the job's files got since the last read, as one text: each file under a
    `==> LABEL: PATH <==` line where it starts (when there are several: an array's
    tasks, a chain's attempts), as `tail` does.

    A chain's files are its attempts', in order: after the first read, only the
    newest attempt's file and those after it are read again."""

    def __init__(self, runner: Runner, job_id: str) -> None:
        self.runner = runner
        self.job_id = job_id
        self.offsets: dict[str, int] = {}
        self.header: str | None = None
        self.start = 0
        self.line_open = False
        self.started = False

    def read(self, chain: chains.Chain | None = None) -> str:
        """What each file got since the last read (the first read: a chain's headers even
        over empty files)."""
        every, self.started = not self.started, True
        if chain is not None:
            files = chains.attempt_outputs(chain)
            many, first = True, self.start
            self.start = max(self.start, len(files) - 1)
        else:
            files = list(output_paths(self.runner, self.job_id).items())
            many, first = len(files) > 1, 0
        return "".join(self._chunk(label, path, many, every) for label, path in files[first:])

    def _chunk(self, label: str, path: str, many: bool, every: bool) -> str:
        chunk = jobs.read_path(self.runner, path, self.offsets.get(path, 0))
        self.offsets[path] = self.offsets.get(path, 0) + len(chunk.encode())
        text = ""
        header = f"==> {label}: {path} <=="
        if many and (chunk or every) and header != self.header:
            text = ("\n" if self.line_open else "") + header + "\n"
            self.header, self.line_open = header, False
        if chunk:
            self.line_open = not chunk.endswith("\n")
        return text + chunk
