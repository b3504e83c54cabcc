"""A Slurm for chains of attempts: recorded Slurm text, the test's job ids, files read for real.

Slurm's commands are answered with what Slurm 22.05 printed (tests/data/slurm), the
recorded job id, node list and output path written over with the test's; every other
command (cat, find, grep, tail, mkdir: the attempts record and output files) runs here
on the test's folder. Attempts records come from tests/data/attempts, their output
paths moved into that folder.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_kit.slurm.runner import Completed, LocalRunner
from cluster_kit.supervisor import record

DATA = Path(__file__).resolve().parents[2] / "data"
SLURM = DATA / "slurm"
CASES = json.loads((SLURM / "cases.json").read_text())
# How a job stands, as the recorded (squeue, scontrol) answers of a job that stood so.
PHASES = {
    "pending": ("squeue_pending", "scontrol_show_job_pending"),
    "running": ("squeue_running", "scontrol_show_job_running"),
    "completed": ("squeue_completed", "scontrol_show_job_completed"),
    "failed": ("squeue_failed", "scontrol_show_job_failed"),          # FAILED, exit code 3
    "killed": ("squeue_rank_raised", "scontrol_show_job_rank_raised"),  # FAILED, exit code 143
    "cancelled": ("squeue_cancelled", "scontrol_show_job_cancelled"),
}
UNKNOWN = {"squeue": "squeue_unknown", "scontrol": "scontrol_show_job_unknown", "sacct": "sacct_disabled"}


def recorded(case: str) -> tuple[int, str, str]:
    return (CASES[case]["returncode"], (SLURM / f"{case}.stdout").read_text(),
            (SLURM / f"{case}.stderr").read_text())


def recorded_id(case: str) -> str:
    argv = CASES[case]["argv"]
    return next((a.split("=", 1)[1] for a in argv if a.startswith("--jobs=")), argv[-1])


@dataclass
class Job:
    phases: list[str]
    output: str
    nodes: str | None = None
    seen: int = 0  # squeue answers given

    @property
    def phase(self) -> str:
        return self.phases[min(max(self.seen - 1, 0), len(self.phases) - 1)]


@dataclass
class ChainCluster:
    """Runs Slurm's commands from recordings and the rest here; `calls` keeps every argv."""

    where: str = "on this machine"
    jobs: dict[str, Job] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)
    submitted: list[str] = field(default_factory=list)  # ids sbatch hands out, in order
    interrupt_at: tuple[str, int] | None = None  # (job id, squeue call): Ctrl-C there

    def job(self, job_id: str, *phases: str, output: Path | str, nodes: str | None = None) -> None:
        """Slurm knows `job_id`: each squeue of it moves to the next phase (the last one stays)."""
        self.jobs[job_id] = Job(list(phases), str(output), nodes)

    def run(self, argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0) -> Completed:
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "sbatch":
            return Completed(argv, 0, f"{self.submitted.pop(0)}\n", "")
        if argv[0] == "scancel":  # every job it names was running
            return Completed(argv, *recorded("scancel_running"))
        if argv[0] in UNKNOWN:
            return self.slurm(argv)
        return LocalRunner().run(argv, stdin=stdin, timeout=timeout)

    def ran(self, program: str) -> list[list[str]]:
        return [argv for argv in self.calls if argv[0] == program]

    def slurm(self, argv: list[str]) -> Completed:
        job_id = next((a.split("=", 1)[1] for a in argv if a.startswith("--jobs=")), argv[-1])
        job = self.jobs.get(job_id)
        if job is None or argv[0] == "sacct":
            return Completed(argv, *recorded(UNKNOWN[argv[0]]))
        if argv[0] == "squeue":
            job.seen += 1
            if self.interrupt_at == (job_id, job.seen):
                raise KeyboardInterrupt
        case = PHASES[job.phase][0 if argv[0] == "squeue" else 1]
        code, out, err = recorded(case)
        return Completed(argv, code, self.swap(out, recorded_id(case), job_id, job), err)

    @staticmethod
    def swap(text: str, old: str, new: str, job: Job) -> str:
        """The recorded text with the test's job id, nodes and output path."""
        text = re.sub(rf"(?m)^{old}\|", f"{new}|", text)
        text = text.replace(f"JobId={old} ", f"JobId={new} ")
        text = re.sub(r"(?m)^(\s+Std(?:Out|Err))=.*$", lambda m: f"{m.group(1)}={job.output}", text)
        if job.nodes is not None:
            text = re.sub(r"(?m)^(\s+NodeList)=.*$", lambda m: f"{m.group(1)}={job.nodes}", text)
            text = re.sub(r"(?m)^(\d+\|[A-Z_]+\|[^|]*)\|[^|]*\|", lambda m: f"{m.group(1)}|{job.nodes}|", text)
        return text


def plant_chain(name: str, logs: Path, **changes: Any) -> dict[str, Any]:
    """tests/data/attempts/NAME.json in its record folder beside `logs`' output files
    (each attempt's output moved into `logs`, written with a few lines); the record."""
    data = json.loads((DATA / "attempts" / f"{name}.json").read_text())
    data.update(changes)
    for attempt in data["attempts"]:
        attempt["output"] = str(logs / Path(attempt["output"]).name)
        Path(attempt["output"]).write_text(f"attempt {attempt['attempt']} of job {data['job_id']} starts\n"
                                           f"step 5 loss 0.91 (job {attempt['slurm_job_id']})\n")
    return save_chain(logs, data)


def save_chain(logs: Path, data: dict[str, Any]) -> dict[str, Any]:
    """Write the record as the supervisor does (0600 in a 0700 folder)."""
    folder = record.folder_for(str(logs / "train.out"), data["job_id"])
    record.make_private_dir(folder)
    record.save(folder, record.ChainRecord.from_dict(data))
    return data


def running(data: dict[str, Any], attempts: int) -> dict[str, Any]:
    """The record as it stood while attempt `attempts - 1` ran."""
    data = json.loads(json.dumps(data))
    data["attempts"] = data["attempts"][:attempts]
    last = data["attempts"][-1]
    for key in ("ended_at", "exit_code", "culprit", "excluded", "stacks", "detected_after_s", "why",
                "next_job_id"):
        last.pop(key, None)
    last["ended"] = "running"
    data["final"] = None
    return data
