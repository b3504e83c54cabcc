"""Writes the attempts records of tests/data/attempts as the supervisor would.

The hang's culprit, evidence and stacks come from the supervisor's own diagnosis
(cluster_kit.analysis.culprit) of the recorded dumps in tests/data/flight_recorder/hang,
the crash's from its exception files in tests/data/flight_recorder/crash; what
follows each attempt from cluster_kit.supervisor.decide. The recorded ranks ran on
one machine (`vm`): here ranks 0-1 ran on the job's first node and 2-3 on its second.

    PYTHONPATH=$PWD .venv/bin/python tests/data/attempts/build.py
"""
from __future__ import annotations

import json
from pathlib import Path

from cluster_kit.analysis import culprit, rank_files
from cluster_kit.supervisor import decide, record

HERE = Path(__file__).resolve().parent
RECORDED = HERE.parent / "flight_recorder"
LOGS = "/scratch/alice/run1/logs"
RESILIENCE = {"max_restarts": 3, "hang_timeout": 60.0, "exclude": "blamed", "grace": 120,
              "max_time_requeues": 5, "checkpoint_dir": "/scratch/alice/run1/ckpt"}
STARTED = 1796357500.0


def host_of(rank: int, nodes: list[str]) -> str:
    return nodes[rank // 2]


def attempt(rec: dict, job_id: str, nodes: str, started: float, ended_at: float) -> dict:
    entry = {"attempt": len(rec["attempts"]), "slurm_job_id": job_id, "nodes": nodes, "started_at": started,
             "ended": "running", "output": f"{LOGS}/train-{job_id}.out", "ended_at": ended_at}
    rec["attempts"].append(entry)
    return entry


def finish(rec: dict, entry: dict, ended: str, code: int, blamed: dict | None, next_job_id: str) -> None:
    """What supervisor.job.finish_attempt writes."""
    entry.update(ended=ended, exit_code=code)
    if blamed:
        entry["culprit"] = {k: blamed[k] for k in ("ranks", "hosts", "evidence")}
        entry.update({k: blamed[k] for k in ("stacks", "detected_after_s") if k in blamed})
    step = decide.next_step(rec, ended, blamed, rec["resilience"], code)
    entry["why"] = step["why"]
    if step["action"] == "restart":
        entry["excluded"] = [n for n in step["exclude"] if n not in record.excluded_nodes(rec)]
        entry["next_job_id"] = next_job_id
    else:
        rec["final"] = {"ended": ended, "exit_code": step["exit_code"], "why": step["why"]}


def hang_blame(nodes: list[str]) -> dict:
    files = rank_files.read_dump_folder(str(RECORDED / "hang"), "hang-1")
    verdict = culprit.find_culprit(files, 4)
    hang = decide.culprit_of(verdict.ranks, [host_of(r, nodes) for r in verdict.ranks], verdict.evidence)
    hang["stacks"] = {str(r): f.stack.text.replace("host: vm", f"host: {host_of(r, nodes)}")[-4000:]
                      for r, f in files.items() if f.stack}
    hang["detected_after_s"] = 61.4
    return hang


def crash_blame(nodes: list[str]) -> dict:
    crash = culprit.first_failure(rank_files.read_exceptions(str(RECORDED / "crash")))
    assert crash is not None
    host = host_of(crash.rank, nodes)
    return decide.culprit_of([crash.rank], [host], crash.evidence.replace("(vm)", f"({host})"))


def hang_then_completed() -> dict:
    rec = record.new_record("123", RESILIENCE)
    rec["start_exclude"] = []
    first = attempt(rec, "123", "n[1-2]", STARTED, STARTED + 412.7)
    finish(rec, first, "hang", 143, hang_blame(["n1", "n2"]), "124")
    second = attempt(rec, "124", "n[1,3]", STARTED + 413.2, STARTED + 1630.9)
    finish(rec, second, "completed", 0, None, "")
    return rec


def crash_max_restarts() -> dict:
    rec = record.new_record("130", dict(RESILIENCE, max_restarts=1))
    rec["start_exclude"] = []
    first = attempt(rec, "130", "n[1-2]", STARTED, STARTED + 95.3)
    finish(rec, first, "crash", 1, crash_blame(["n1", "n2"]), "131")
    second = attempt(rec, "131", "n[1,3]", STARTED + 95.9, STARTED + 190.4)
    finish(rec, second, "crash", 1, crash_blame(["n1", "n3"]), "")
    return rec


if __name__ == "__main__":
    for name, build in (("hang_then_completed", hang_then_completed), ("crash_max_restarts", crash_max_restarts)):
        text = json.dumps(build(), indent=1, sort_keys=True) + "\n"
        (HERE / f"{name}.json").write_text(text)
