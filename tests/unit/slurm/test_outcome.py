"""How a job ended, read from real Slurm 22.05 text (tests/data/slurm/).

`output_rank_raised.out` is the output of a 2-node x 2-rank gloo job on the dev
cluster whose rank 3 raised; `output_time_limit.out` a 2-node srun job stopped
by its 1-minute limit. The array cases are a 3-task array whose task 0 exited 1.
"""
from __future__ import annotations

from pathlib import Path

from test_slurm import DATA, Replay, out

from cluster_kit.lifecycle import job_outcome
from cluster_kit.slurm import jobs, outcome
from cluster_kit.slurm.builders import ExitCode


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_the_rank_that_raised_is_the_first_failure_not_the_ones_srun_stopped() -> None:
    verdict = outcome.parse_job_output(text("output_rank_raised.out"))
    assert [(f.node, f.tasks, f.what) for f in verdict.failures] == [
        ("n2", (3,), "Exited with exit code 1"), ("n2", (2,), "Terminated"), ("n1", (0, 1), "Terminated")]
    first = verdict.first_failure
    assert first is not None and (first.node, first.tasks, first.exit_code) == ("n2", (3,), 1)
    assert first.describe() == "rank 3 on n2 exited with exit code 1"
    assert first.describe(ranks=False) == "task 3 on n2 exited with exit code 1"
    assert verdict.cause is None  # a STEP banner without a cause


def test_a_rank_raising_reads_as_that_rank_not_exit_code_143() -> None:
    verdict = outcome.parse_job_output(text("output_rank_raised.out"))
    assert outcome.explain("2", "FAILED", 143, verdict) == (
        "job 2 finished with exit code 143: FAILED; first failure: rank 3 on n2 exited with exit code 1")


def test_the_time_limit_is_named_and_no_task_is_blamed_for_it_first() -> None:
    verdict = outcome.parse_job_output(text("output_time_limit.out"))
    assert verdict.cause == "TIME LIMIT"
    assert verdict.failures and all(f.collateral for f in verdict.failures)
    assert verdict.first_failure is None  # Slurm stopped every rank: none is to blame
    assert outcome.explain("5", "TIMEOUT", 143, verdict) == (
        "job 5 finished with exit code 143: TIMEOUT (reached its time limit)")


def test_killed_by_a_signal_and_node_failure_and_oom_lines() -> None:
    log = ("srun: error: n1: task 0: Segmentation fault (core dumped)\n"
           "srun: error: Node failure on n2\n"
           "slurmstepd: error: Detected 2 oom_kill events in StepId=7.0. Some of the step tasks "
           "have been OOM Killed.\n"
           "slurmstepd-n1: error: *** JOB 7 ON n1 CANCELLED AT 2026-12-04T04:02:36 DUE TO NODE FAILURE ***\n")
    verdict = outcome.parse_job_output(log)
    assert verdict.first_failure is not None and verdict.first_failure.exit_code is None
    assert verdict.first_failure.describe() == "rank 0 on n1 died: Segmentation fault (core dumped)"
    assert (verdict.failed_nodes, verdict.oom_kills, verdict.cause) == (("n2",), 2, "NODE FAILURE")
    sentence = outcome.explain("7", "NODE_FAIL", 1, verdict)
    assert "NODE_FAIL (a node failed)" in sentence and "failed node(s): n2" in sentence


def test_a_completed_job_blames_no_one() -> None:
    assert outcome.explain("3", "COMPLETED", 0, outcome.parse_job_output("")) == (
        "job 3 finished with exit code 0: COMPLETED")


# ---------------------------------------------------------------- array jobs


def test_an_array_with_a_failed_task_is_not_a_success() -> None:
    runner = Replay.of("squeue_array_failed_task", "scontrol_show_job_array_failed_task")
    status = jobs.job_status(runner, "4")
    assert [t.job_id for t in status.tasks] == ["4_0", "4_1", "4_2"]
    assert status.finished and status.state == "FAILED" and status.exit_status == 1
    assert [t.job_id for t in status.failed_tasks] == ["4_0"]
    assert status.tasks[0].exit_code == ExitCode(1, 0)
    assert jobs.job_output_paths(runner, "4") == {
        "4_0": "/tmp/try/logs/arr-4_0.out", "4_1": "/tmp/try/logs/arr-4_1.out",
        "4_2": "/tmp/try/logs/arr-4_2.out"}


def test_an_array_with_tasks_left_to_run_is_running() -> None:
    runner = Replay.of("squeue_array_pending_tasks")
    status = jobs.job_status(runner, "8")
    assert status.source == "squeue" and not status.finished and status.state == "RUNNING"
    assert [t.job_id for t in status.tasks] == ["8_0", "8_[1-2%1]"]
    assert status.tasks[1].reason == "JobArrayTaskLimit"


def test_the_array_outcome_names_the_failed_task() -> None:
    runner = Replay.of("squeue_array_failed_task", "scontrol_show_job_array_failed_task",
                       "tail_array_task_0", "tail_array_task_1", "tail_array_task_2")
    result = job_outcome(runner, jobs.job_status(runner, "4"))
    assert result.exit_status == 1 and result.state == "FAILED"
    assert result.explanation == ("array job 4: 1 of 3 task(s) did not complete; "
                                  "job 4_0 finished with exit code 1: FAILED")
    assert [t["job_id"] for t in result.as_dict()["tasks"]] == ["4_0", "4_1", "4_2"]


def test_recorded_scontrol_of_the_raised_rank_job_gives_srun_exit_143() -> None:
    runner = Replay.of("squeue_rank_raised", "scontrol_show_job_rank_raised")
    status = jobs.job_status(runner, "2")
    assert (status.state, status.exit_status, status.stdout_path) == ("FAILED", 143, "/tmp/try/logs/raise-2.out")
    assert Path(DATA / "output_rank_raised.out").read_text().count("srun: error:") == 3
    assert out("squeue_time_limit").startswith("5|TIMEOUT|TimeLimit|")


# ---------------------------------------------------------------- diagnose (one attempt)


def test_diagnose_blames_the_rank_that_raised_with_its_last_line() -> None:
    from cluster_kit.lifecycle import diagnosis

    blamed = diagnosis.culprit("crash", None, text("output_rank_raised.out"), ranks=True)
    assert blamed == {"ranks": [3], "hosts": ["n2"],
                      "evidence": "rank 3 on n2 exited with exit code 1; its last line: "
                                  "RuntimeError: boom on rank 3"}
    assert diagnosis.advice_for("crash", blamed, "2") == ["read the failing rank's traceback: clusterkit logs 2"]


def test_diagnose_blames_no_one_for_a_time_limit() -> None:
    from cluster_kit.lifecycle import diagnosis, outcome

    runner = Replay.of("squeue_time_limit", "scontrol_show_job_time_limit")
    status = jobs.job_status(runner, "5")
    assert outcome.ended_as(status) == "time_limit"
    assert diagnosis.culprit("time_limit", None, text("output_time_limit.out"), ranks=True) is None
    raised = jobs.job_status(Replay.of("squeue_rank_raised", "scontrol_show_job_rank_raised"), "2")
    assert outcome.ended_as(raised) == "crash"
    running = jobs.job_status(Replay.of("squeue_running"), "22")
    assert outcome.ended_as(running) == "running"


def test_a_task_its_array_does_not_have_is_an_unknown_job_with_the_fix() -> None:
    import pytest

    from cluster_kit.errors import ClusterRefused

    runner = Replay.of("squeue_array_task_missing", "scontrol_show_job_array_task_missing",
                       sacct_disabled=["sacct", "--parsable2", "--noheader", "--jobs=313_5",
                                       "--format=JobID,State,ExitCode,Elapsed,NodeList,JobName"])
    with pytest.raises(ClusterRefused, match="does not know job 313_5") as info:
        jobs.job_status(runner, "313_5")
    assert info.value.fix


def test_a_node_failure_names_the_node_and_blames_no_rank() -> None:
    # n2 set DOWN under a running 2-node job: srun's and slurmstepd's real lines
    # (slurmstepd adds ", SEE SLURMCTLD LOG FOR DETAILS"); Slurm then requeued it.
    verdict = outcome.parse_job_output(text("output_node_failure.out"))
    assert (verdict.failed_nodes, verdict.cause, verdict.first_failure) == (("n2",), "NODE FAILURE", None)
    assert outcome.explain("315", "NODE_FAIL", 1, verdict) == (
        "job 315 finished with exit code 1: NODE_FAIL (a node failed); "
        "Slurm stopped it due to node failure; failed node(s): n2")
    requeued = jobs.job_status(Replay.of("squeue_requeued_node_failure",
                                         "scontrol_show_job_requeued_node_failure"), "315")
    assert (requeued.state, requeued.reason, requeued.finished) == ("PENDING", "BeginTime", False)


def test_srun_task_ranges_are_read_and_written_back_as_srun_writes_them() -> None:
    log = ("srun: error: n2: tasks 4-6,9: Exited with exit code 2\n"
           "srun: error: n1: tasks 0-1,3: Terminated\n"
           "slurmstepd: error: Detected 1 oom_kill event in StepId=8.0. Some of the step tasks have been OOM Killed.\n"
           "slurmstepd: error: Detected 2 oom_kill events in StepId=8.1. Some of the step tasks have been OOM Killed.\n")
    verdict = outcome.parse_job_output(log)
    assert [f.tasks for f in verdict.failures] == [(4, 5, 6, 9), (0, 1, 3)]
    first = verdict.first_failure
    assert first is not None
    assert first.describe() == "ranks 4-6,9 on n2 exited with exit code 2"
    assert first.describe(ranks=False) == "tasks 4-6,9 on n2 exited with exit code 2"
    assert verdict.failures[1].describe() == "ranks 0-1,3 on n1 died: Terminated"
    two = outcome.parse_job_output(text("output_rank_raised.out")).failures[2]
    assert two.describe(ranks=False) == "tasks 0-1 on n1 died: Terminated"
    assert verdict.oom_kills == 3  # one line per step, added up
    assert outcome.explain("8", "OUT_OF_MEMORY", None, verdict) == (
        "job 8 ended: OUT_OF_MEMORY (ran out of memory); first failure: ranks 4-6,9 on n2 exited with "
        "exit code 2; 3 task(s) killed for using too much memory")


def test_states_as_sacct_and_squeue_write_them() -> None:
    assert outcome.base_state("CANCELLED by 0") == "CANCELLED"
    assert outcome.base_state("CANCELLED+") == "CANCELLED"  # sacct's mark of a cut column
    assert outcome.base_state("") == ""
    assert outcome.explain("9", "", 0, None) == "job 9 finished with exit code 0: UNKNOWN"
    two_nodes = outcome.parse_job_output("srun: error: Node failure on n2\nsrun: error: Node failure on n3\n")
    assert outcome.explain("9", "completed", 0, two_nodes) == (
        "job 9 finished with exit code 0: COMPLETED; failed node(s): n2, n3")


def test_a_completed_job_names_no_first_failure_even_if_a_task_failed() -> None:
    verdict = outcome.parse_job_output("srun: error: n1: task 1: Exited with exit code 2\n")
    assert outcome.explain("9", "COMPLETED", 0, verdict) == "job 9 finished with exit code 0: COMPLETED"
    assert outcome.explain("9", "FAILED", 2, verdict).endswith("; first failure: rank 1 on n1 exited with exit code 2")
