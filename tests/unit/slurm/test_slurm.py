"""Builders and parsers of cluster_kit.slurm.builders on verbatim Slurm 22.05 text.

tests/data/slurm/ holds what sbatch, squeue, sacct, scontrol, scancel and sinfo
printed on a real cluster (recorded by tests/data/slurm/capture.py, which runs
exactly the argv the builders make). The runner-level functions are checked by
replaying those recordings; tests/integration runs them against a live Slurm.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from cluster_kit.errors import ClusterRefused
from cluster_kit.slurm import builders as slurm
from cluster_kit.slurm import jobs
from cluster_kit.slurm import runner as slurm_runner
from cluster_kit.slurm.builders import ExitCode

DATA = Path(__file__).resolve().parents[2] / "data" / "slurm"
CASES: dict[str, dict] = json.loads((DATA / "cases.json").read_text())


def out(case: str) -> str:
    return (DATA / f"{case}.stdout").read_text()


def err(case: str) -> str:
    return (DATA / f"{case}.stderr").read_text()


# ---------------------------------------------------------------- fixtures are real


def test_every_recorded_case_has_its_files() -> None:
    for case, meta in CASES.items():
        assert (DATA / f"{case}.stdout").exists() and (DATA / f"{case}.stderr").exists()
        assert meta["argv"][0] in {"sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "tail"}


def test_recorded_argv_is_what_the_builders_make_now() -> None:
    """The fixtures stay valid only while the builders ask for the same format."""
    assert CASES["squeue_running"]["argv"] == slurm.build_squeue("22")
    assert CASES["sacct_failed"]["argv"] == slurm.build_sacct("29")
    assert CASES["scontrol_show_job_failed"]["argv"] == slurm.build_scontrol_show_job("21")
    assert CASES["scancel_running"]["argv"] == slurm.build_scancel("22")
    assert CASES["sinfo_nodes"]["argv"] == slurm.build_sinfo_nodes("debug")


# ---------------------------------------------------------------- sbatch


def test_build_sbatch_turns_options_into_long_options() -> None:
    argv = slurm.build_sbatch({"job-name": "llama ft", "nodes": 4, "gpus_per_node": 8,
                               "exclusive": True, "reservation": None, "requeue": False})
    assert argv == ["sbatch", "--parsable", "--job-name=llama ft", "--nodes=4",
                    "--gpus-per-node=8", "--exclusive"]


def test_build_sbatch_test_only_and_plain() -> None:
    assert slurm.build_sbatch(test_only=True) == ["sbatch", "--parsable", "--test-only"]
    assert slurm.build_sbatch(parsable=False) == ["sbatch"]


@pytest.mark.parametrize("value", ["a\nb", "x\r", "a\x00"])
def test_build_sbatch_refuses_newlines(value: str) -> None:
    with pytest.raises(ValueError, match="newline"):
        slurm.build_sbatch({"comment": value})


@pytest.mark.parametrize("name", ["Bad", "a b", "", "x=y", "9x"])
def test_build_sbatch_refuses_bad_option_names(name: str) -> None:
    with pytest.raises(ValueError, match="option name"):
        slurm.build_sbatch({name: "1"})


def test_parse_sbatch_parsable_and_plain() -> None:
    assert slurm.parse_sbatch(out("sbatch_parsable")) == "19"
    assert slurm.parse_sbatch(out("sbatch_plain")) == "20"
    assert slurm.parse_sbatch("12345;cluster2\n") == "12345"  # multi-cluster form


def test_parse_sbatch_without_an_id_raises() -> None:
    with pytest.raises(ValueError, match="no job id"):
        slurm.parse_sbatch(out("sbatch_refused"))


def test_sbatch_refusal_message_is_slurms() -> None:
    assert CASES["sbatch_refused"]["returncode"] == 1
    message = slurm.slurm_error_message(err("sbatch_refused"))
    assert message == "Batch job submission failed: Requested node configuration is not available"
    assert "sinfo" in (slurm.fix_for(message) or "")


@pytest.mark.parametrize("case", ["test_only_ok", "test_only_ok_busy"])
def test_parse_test_only_estimate(case: str) -> None:
    assert out(case) == "" and CASES[case]["returncode"] == 0
    result = slurm.parse_sbatch_test_only(err(case))
    assert (result.processors, result.nodes, result.partition) == (2, "n[1-2]", "debug")
    assert result.message.startswith(f"Job {result.job_id} to start at {result.start} ")


@pytest.mark.parametrize("case", ["test_only_impossible", "test_only_too_many_gpus"])
def test_test_only_refusal(case: str) -> None:
    assert CASES[case]["returncode"] == 1
    with pytest.raises(ValueError):
        slurm.parse_sbatch_test_only(err(case))
    message = slurm.slurm_error_message(err(case))
    assert message == "allocation failure: Requested node configuration is not available"


# ---------------------------------------------------------------- squeue

SQUEUE_CASES = [
    ("squeue_pending", "23", "PENDING", "pending", "Resources", ""),
    ("squeue_running", "22", "RUNNING", "running", "None", "n[1-2]"),
    ("squeue_completed", "19", "COMPLETED", "terminal", "None", "n[1-2]"),
    ("squeue_failed", "21", "FAILED", "terminal", "NonZeroExitCode", "n1"),
    ("squeue_cancelled", "22", "CANCELLED", "terminal", "None", "n[1-2]"),
    ("squeue_cancelled_pending", "23", "CANCELLED", "terminal", "Resources", ""),
    ("squeue_timeout", "18", "TIMEOUT", "terminal", "TimeLimit", "n1"),
]


@pytest.mark.parametrize("case,job_id,state,phase,reason,nodes", SQUEUE_CASES)
def test_parse_squeue(case: str, job_id: str, state: str, phase: str, reason: str, nodes: str) -> None:
    [row] = slurm.parse_squeue(out(case))
    assert (row.job_id, row.state, row.reason, row.nodes) == (job_id, state, reason, nodes)
    assert slurm.job_phase(row.state) == phase
    assert row.partition == "debug"


def test_parse_squeue_keeps_a_job_name_with_the_delimiter() -> None:
    [row] = slurm.parse_squeue(out("squeue_failed"))
    assert row.name == "ck fail|x"


def test_parse_squeue_timeout_fields() -> None:
    [row] = slurm.parse_squeue(out("squeue_timeout"))
    assert (row.elapsed, row.time_limit, row.num_nodes) == ("1:24", "1:00", "1")


def test_squeue_unknown_job() -> None:
    assert CASES["squeue_unknown"]["returncode"] == 1
    assert slurm.is_unknown_job(err("squeue_unknown"))
    assert slurm.parse_squeue(out("squeue_unknown")) == []


# ---------------------------------------------------------------- sacct


def test_parse_sacct_completed() -> None:
    rows = slurm.parse_sacct(out("sacct_completed"), err("sacct_completed"))
    assert isinstance(rows, list)
    assert [(r.job_id, r.state, r.exit_code, r.is_step) for r in rows] == [
        ("28", "COMPLETED", ExitCode(0, 0), False), ("28.batch", "COMPLETED", ExitCode(0, 0), True)]


def test_parse_sacct_failed_job_with_steps() -> None:
    rows = slurm.parse_sacct(out("sacct_failed"))
    assert isinstance(rows, list)
    job = slurm.sacct_job_row(rows, "29")
    assert job is not None
    assert (job.state, job.exit_code, job.nodes, job.name) == ("FAILED", ExitCode(3, 0), "n[1-2]", "ck fail|x")
    assert [r.job_id for r in rows] == ["29", "29.batch", "29.0"]
    assert rows[2].state == "COMPLETED" and rows[2].name == "true"


def test_parse_sacct_cancelled_by_user() -> None:
    rows = slurm.parse_sacct(out("sacct_cancelled"))
    assert isinstance(rows, list)
    job = slurm.sacct_job_row(rows, "30")
    assert job is not None and job.state == "CANCELLED by 0"
    assert slurm.base_state(job.state) == "CANCELLED" and slurm.job_phase(job.state) == "terminal"
    assert rows[1].exit_code == ExitCode(0, 15)


def test_a_requeued_job_is_its_last_run() -> None:
    """Job 2 was requeued while running (`scontrol requeue`), then ran again to the end.

    `--duplicates` lists every run, oldest first: the first is REQUEUED (its batch
    step CANCELLED by the requeue), the last COMPLETED. Plain sacct (build_sacct)
    shows only the last run.
    """
    rows = slurm.parse_sacct(out("sacct_requeued_duplicates"))
    assert isinstance(rows, list)
    assert [(r.job_id, r.state) for r in rows if not r.is_step] == [("2", "REQUEUED"), ("2", "COMPLETED")]
    job = slurm.sacct_job_row(rows, "2")
    assert job is not None
    assert (job.state, job.exit_code, job.elapsed, job.nodes) == ("COMPLETED", ExitCode(0, 0), "00:00:04", "a[1-2]")
    plain = slurm.parse_sacct(out("sacct_requeued"))
    assert isinstance(plain, list) and CASES["sacct_requeued"]["argv"] == slurm.build_sacct("2")
    assert slurm.sacct_job_row(plain, "2") == job
    assert slurm.sacct_job_row(plain, "3") is None


def test_parse_sacct_running() -> None:
    rows = slurm.parse_sacct(out("sacct_running"))
    assert isinstance(rows, list)
    assert {slurm.job_phase(r.state) for r in rows} == {"running"}


def test_parse_sacct_unknown_job_is_empty() -> None:
    assert slurm.parse_sacct(out("sacct_unknown"), err("sacct_unknown")) == []


def test_parse_sacct_accounting_disabled() -> None:
    assert CASES["sacct_disabled"]["returncode"] == 1
    result = slurm.parse_sacct(out("sacct_disabled"), err("sacct_disabled"))
    assert result == slurm.AccountingDisabled("Slurm accounting storage is disabled")


def test_parse_exit_code() -> None:
    assert slurm.parse_exit_code("0:15") == ExitCode(0, 15)
    assert str(ExitCode(3, 0)) == "3:0"
    with pytest.raises(ValueError):
        slurm.parse_exit_code("3")


# ---------------------------------------------------------------- scontrol show job


def job(case: str) -> dict[str, str]:
    [record] = slurm.parse_scontrol_show_job(out(case))
    return record


def test_scontrol_values_with_blanks_and_delimiters() -> None:
    record = job("scontrol_show_job_failed")
    assert record["JobName"] == "ck fail|x"
    assert record["WorkDir"] == "/tmp/slurm-capture/work/dir with space"
    assert record["StdOut"] == "/tmp/slurm-capture/work/out/ck fail|x-21.out"
    assert record["StdErr"] == "/tmp/slurm-capture/work/out/ck fail|x-21.err"
    assert record["Command"] == "(null)"
    assert (record["JobState"], record["Reason"], record["ExitCode"]) == ("FAILED", "NonZeroExitCode", "3:0")


def test_scontrol_keys_with_colons_slashes_and_nested_equals() -> None:
    record = job("scontrol_show_job_running")
    assert record["AllocNode:Sid"].startswith("localhost:")
    assert record["CPUs/Task"] == "1"
    assert record["ReqB:S:C:T"] == "0:0:*:*"
    assert record["TRES"].startswith("cpu=")
    assert "cpu" not in record and "mem" not in record
    assert record["Power"] == ""
    assert (record["JobState"], record["NodeList"], record["BatchHost"]) == ("RUNNING", "n[1-2]", "n1")


@pytest.mark.parametrize("case,state,reason,exit_code,nodes", [
    ("scontrol_show_job_pending", "PENDING", "Resources", "0:0", ""),
    ("scontrol_show_job_completed", "COMPLETED", "None", "0:0", "n[1-2]"),
    ("scontrol_show_job_cancelled", "CANCELLED", "None", "0:15", "n[1-2]"),
    ("scontrol_show_job_cancelled_pending", "CANCELLED", "Resources", "0:0", ""),
    ("scontrol_show_job_timeout", "TIMEOUT", "TimeLimit", "0:15", "n1"),
])
def test_scontrol_states(case: str, state: str, reason: str, exit_code: str, nodes: str) -> None:
    record = job(case)
    assert (record["JobState"], record["Reason"], record["ExitCode"], record["NodeList"]) == (
        state, reason, exit_code, nodes)


def test_scontrol_unknown_job() -> None:
    assert CASES["scontrol_show_job_unknown"]["returncode"] == 1
    assert slurm.is_unknown_job(err("scontrol_show_job_unknown"))
    assert slurm.parse_scontrol_show_job(out("scontrol_show_job_unknown")) == []


def test_scontrol_several_records_and_a_reason_with_blanks() -> None:
    text = ("JobId=1 JobName=a\n   JobState=PENDING Reason=held by admin Dependency=(null)\n\n"
            "JobId=2 JobName=b\n   Reason=ReqNodeNotAvail,_UnavailableNodes:n1\n")
    records = slurm.parse_scontrol_show_job(text)
    assert [r["JobId"] for r in records] == ["1", "2"]
    assert records[0]["Reason"] == "held by admin" and records[0]["Dependency"] == "(null)"
    assert records[1]["Reason"] == "ReqNodeNotAvail,_UnavailableNodes:n1"


# ---------------------------------------------------------------- exit codes


@pytest.mark.parametrize("state,exit_code,expected", [
    ("COMPLETED", ExitCode(0, 0), 0),
    ("FAILED", ExitCode(3, 0), 3),
    ("FAILED", ExitCode(0, 9), 137),
    ("CANCELLED by 0", ExitCode(0, 0), 1),
    ("CANCELLED", ExitCode(0, 15), 143),
    ("TIMEOUT", ExitCode(0, 15), 143),
    ("NODE_FAIL", ExitCode(0, 0), 1),
    ("OUT_OF_MEMORY", ExitCode(0, 125), 253),
    ("FAILED", None, 1),
])
def test_job_exit_code(state: str, exit_code: ExitCode, expected: int) -> None:
    assert slurm.job_exit_code(state, exit_code) == expected


def test_job_phase_of_other_states() -> None:
    assert slurm.job_phase("COMPLETING") == "running"
    assert slurm.job_phase("REQUEUE_HOLD") == "pending"
    assert slurm.job_phase("NODE_FAIL") == "terminal"
    assert slurm.job_phase("WHATEVER") == "unknown"


# ---------------------------------------------------------------- scancel


def test_parse_scancel() -> None:
    assert slurm.parse_scancel(err("scancel_running")).error is None
    assert slurm.parse_scancel(err("scancel_pending")).error is None
    assert slurm.parse_scancel(err("scancel_completed")).already_finished
    assert slurm.parse_scancel(err("scancel_unknown")).unknown_job
    assert CASES["scancel_unknown"]["returncode"] == 0  # why --verbose is needed


def test_build_scancel_signal() -> None:
    assert slurm.build_scancel("7", "USR1") == ["scancel", "--verbose", "--signal=USR1", "7"]
    with pytest.raises(ValueError):
        slurm.build_scancel("7; rm -rf /")


# ---------------------------------------------------------------- nodes


def test_parse_sinfo_nodes() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes"))
    assert [(r.node, r.state, r.reason, r.drained) for r in rows] == [
        ("n1", "idle", "", False), ("n2", "idle", "", False)]


def test_parse_sinfo_drained_node_keeps_its_reason() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes_drained"))
    assert rows[1].drained and rows[1].reason == "clusterkit: gpu.driver 535.104.05 differs from 550.54.15"
    assert slurm.parse_sinfo_nodes(out("sinfo_nodes_unknown_partition")) == []


def test_build_scontrol_update_nodes() -> None:
    assert CASES["scontrol_update_drain"]["argv"] == slurm.build_scontrol_update_nodes(
        "n2", "drain", "clusterkit: gpu.driver 535.104.05 differs from 550.54.15")
    assert CASES["scontrol_update_resume"]["argv"] == slurm.build_scontrol_update_nodes("n2", "RESUME")
    with pytest.raises(ValueError, match="needs a reason"):
        slurm.build_scontrol_update_nodes("n2", "DRAIN")
    with pytest.raises(ValueError, match="newline"):
        slurm.build_scontrol_update_nodes("n2", "DRAIN", "a\nb")
    with pytest.raises(ValueError, match="use one of"):
        slurm.build_scontrol_update_nodes("n2", "IDLE")
    assert slurm.slurm_error_message(err("scontrol_update_unknown_node")) == (
        "slurm_update error: Invalid node name specified")


# ---------------------------------------------------------------- runner functions on replayed text


class Replay:
    """A runner answering each argv with a recorded case (real Slurm text)."""

    where = "on the replay"

    def __init__(self, answers: Mapping[tuple[str, ...], str]) -> None:
        self.answers = dict(answers)
        self.calls: list[list[str]] = []

    @classmethod
    def of(cls, *cases: str, **extra: Sequence[str]) -> Replay:
        answers = {tuple(CASES[case]["argv"]): case for case in cases}
        answers.update({tuple(argv): case for case, argv in extra.items()})
        return cls(answers)

    def run(self, argv: Sequence[str], stdin: str | None = None,
            timeout: float = 60.0) -> slurm_runner.Completed:
        self.calls.append(list(argv))
        case = self.answers[tuple(argv)]
        return slurm_runner.Completed(list(argv), CASES[case]["returncode"], out(case), err(case))


def test_submit_returns_the_job_id() -> None:
    runner = Replay({tuple(slurm.build_sbatch()): "sbatch_parsable"})
    assert jobs.submit(runner, "#!/bin/bash\ntrue\n") == "19"


def test_submit_refused_carries_slurms_message() -> None:
    runner = Replay({tuple(slurm.build_sbatch()): "sbatch_refused"})
    with pytest.raises(ClusterRefused) as info:
        jobs.submit(runner, "#!/bin/bash\n")
    assert info.value.exit_code == 3
    assert "Requested node configuration is not available" in info.value.message
    assert info.value.fix


def test_submit_test_only() -> None:
    ok = Replay({tuple(slurm.build_sbatch(test_only=True)): "test_only_ok"})
    assert jobs.submit(ok, "", test_only=True).endswith("on nodes n[1-2] in partition debug")
    refused = Replay({tuple(slurm.build_sbatch(test_only=True)): "test_only_impossible"})
    with pytest.raises(ClusterRefused, match="allocation failure: Requested node configuration"):
        jobs.submit(refused, "", test_only=True)


def test_status_of_a_running_job_comes_from_squeue() -> None:
    runner = Replay.of("squeue_running")
    status = jobs.job_status(runner, "22")
    assert (status.state, status.phase, status.source, status.exit_status) == (
        "RUNNING", "running", "squeue", None)
    assert dict(status.items())["nodes"] == "n[1-2]"


def test_status_of_an_ended_job_comes_from_scontrol() -> None:
    runner = Replay.of("squeue_failed", "scontrol_show_job_failed")
    status = jobs.job_status(runner, "21")
    assert (status.state, status.exit_code, status.exit_status, status.source) == (
        "FAILED", ExitCode(3, 0), 3, "scontrol")
    assert status.stdout_path == "/tmp/slurm-capture/work/out/ck fail|x-21.out"


def test_status_falls_back_to_sacct() -> None:
    runner = Replay.of("sacct_failed", squeue_unknown=slurm.build_squeue("29"),
                       scontrol_show_job_unknown=slurm.build_scontrol_show_job("29"))
    status = jobs.job_status(runner, "29")
    assert (status.state, status.exit_status, status.source) == ("FAILED", 3, "sacct")


def test_status_of_a_forgotten_job_without_accounting() -> None:
    runner = Replay.of("squeue_unknown", "scontrol_show_job_unknown",
                       sacct_disabled=slurm.build_sacct("999999"))
    with pytest.raises(ClusterRefused, match="does not know job 999999"):
        jobs.job_status(runner, "999999")


def test_watch_ends_with_the_exit_status() -> None:
    runner = Replay.of("squeue_timeout", "scontrol_show_job_timeout")
    assert [s.exit_status for s in jobs.watch(runner, "18", sleep=lambda _s: None)] == [143]


def test_watch_polls_a_running_job_until_the_caller_stops() -> None:
    runner = Replay.of("squeue_running")
    naps: list[float] = []
    watched = jobs.watch(runner, "22", poll=7.0, sleep=naps.append)
    assert [next(watched).state for _ in range(3)] == ["RUNNING"] * 3 and naps == [7.0, 7.0]


def test_cancel() -> None:
    assert jobs.cancel(Replay.of("scancel_running"), "22") is True
    assert jobs.cancel(Replay.of("scancel_completed"), "19") is False
    with pytest.raises(ClusterRefused, match="Invalid job id specified"):
        jobs.cancel(Replay.of("scancel_unknown"), "999999")


def test_partition_nodes_and_drain() -> None:
    assert jobs.partition_nodes(Replay.of("sinfo_nodes"), "debug") == ["n1", "n2"]
    with pytest.raises(ClusterRefused, match="no nodes"):
        jobs.partition_nodes(Replay.of("sinfo_nodes_unknown_partition"), "nosuch")
    runner = Replay.of("scontrol_update_drain", "scontrol_update_unknown_node")
    jobs.update_nodes(runner, ["n2"], "DRAIN",
                              "clusterkit: gpu.driver 535.104.05 differs from 550.54.15")
    with pytest.raises(ClusterRefused, match="Invalid node name specified"):
        jobs.update_nodes(runner, ["n9"], "DRAIN", "x")


# ---------------------------------------------------------------- the local runner


def test_environment_scrubbing_keeps_the_config_source() -> None:
    env = {"PATH": "/bin", "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_CLUSTERS": "a",
           "SLURM_JOB_ID": "7", "SLURM_MEM_PER_CPU": "100", "SBATCH_PARTITION": "x",
           "SQUEUE_FORMAT": "%i", "SLURM_TIME_FORMAT": "relative", "HOME": "/root",
           "CLUSTERKIT_CONTROL_DIR": "/out/clusterkit-7/attempt-0", "CLUSTERKIT_ATTEMPT": "2"}
    assert slurm_runner.scrubbed_environment(env) == {
        "PATH": "/bin", "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_CLUSTERS": "a",
        "HOME": "/root"}


def test_local_runner_passes_stdin_and_scrubbed_environment() -> None:
    runner = slurm_runner.LocalRunner({"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "KEEP": "1"})
    code = "import os, sys; print(sys.stdin.read(), sorted(k for k in os.environ if 'SLURM' in k or k == 'KEEP'))"
    done = runner.run([sys.executable, "-c", code], stdin="hello")
    assert done.ok and done.stdout.strip() == "hello ['KEEP']"


def test_local_runner_missing_command_is_a_refusal() -> None:
    with pytest.raises(ClusterRefused) as info:
        slurm_runner.LocalRunner().run(["sbatch-does-not-exist"])
    assert info.value.exit_code == 3 and "login.host" in (info.value.fix or "")


def test_local_runner_timeout_is_a_refusal() -> None:
    with pytest.raises(ClusterRefused, match="did not finish within 0.2 s"):
        slurm_runner.LocalRunner().run([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.2)


def test_the_drain_permission_fix_is_only_for_node_updates() -> None:
    message = "Access/permission denied"
    assert slurm.fix_for(message, ["scontrol", "update", "NodeName=gpu1", "State=DRAIN"]) == slurm.NODE_UPDATE_FIX
    assert slurm.fix_for(message, ["scancel", "--verbose", "123"]) is None
    assert slurm.fix_for("Invalid partition name", ["scontrol", "update"]) == "check slurm.partition against `sinfo -s`"


# ---------------------------------------------------------------- what each refusal says
# (survivors of scripts/mutation: docs/mutation.md)


def test_each_refused_value_is_named_in_its_message() -> None:
    refusals = [
        (lambda: slurm.check_job_id("12; rm"), "not a Slurm job id: '12; rm'"),
        (lambda: slurm.build_sinfo_nodes("gpu$(reboot)"),
         "partition 'gpu$(reboot)' has characters Slurm does not take there"),
        (lambda: slurm.build_scontrol_update_nodes("n 1", "DRAIN", "x"),
         "node list 'n 1' has characters Slurm does not take there"),
        (lambda: slurm.build_scontrol_update_nodes("n1", "IDLE"),
         "node state 'IDLE': use one of DRAIN, RESUME, DOWN, UNDRAIN"),
        (lambda: slurm.build_scontrol_update_nodes("n1", "DOWN"), "State=DOWN needs a reason"),
        (lambda: slurm.build_scontrol_update_nodes("n1", "DRAIN", "bad\rDIMM"),
         "node reason 'bad\\rDIMM' contains a newline"),
        (lambda: slurm.build_scancel("12", "usr1"), "not a signal name: 'usr1'"),
        (lambda: slurm.parse_exit_code("3"), "not a Slurm exit code (EXIT:SIGNAL): '3'"),
        (lambda: slurm.parse_sbatch_test_only("sbatch: error: nothing else\n"),
         "sbatch --test-only printed no start estimate: 'sbatch: error: nothing else\\n'"),
        (lambda: slurm.parse_sacct("29|FAILED\n"), "unexpected sacct line: '29|FAILED'"),
        (lambda: slurm.parse_squeue("29|RUNNING\n"), "unexpected squeue line: '29|RUNNING'"),
        (lambda: slurm.parse_sinfo_nodes("n1\n"), "unexpected sinfo line: 'n1'"),
        (lambda: slurm.build_sbatch_options({"time": "1\r"}),
         "sbatch option --time: the value '1\\r' contains a newline"),
    ]
    for call, message in refusals:
        with pytest.raises(ValueError) as raised:
            call()
        assert message in str(raised.value), (message, str(raised.value))


def test_names_with_capitals_and_leading_dashes_are_taken() -> None:
    assert slurm.build_sinfo_nodes("A100-Gpu")[-1] == "--partition=A100-Gpu"
    assert slurm.build_sbatch_options({"--job_name": "x", "exclusive": False, "wait": None,
                                       "requeue": True, "time": "10"}) == [
        "--job-name=x", "--requeue", "--time=10"]


def test_slurm_error_message_joins_lines_and_says_when_there_is_none() -> None:
    assert slurm.slurm_error_message("sbatch: error: one\nsbatch: error: two\n") == "one; two"
    assert slurm.slurm_error_message("", "scontrol: error: on stdout\n") == "on stdout"
    assert slurm.slurm_error_message("\n") == "no message"


def test_the_node_update_fix_needs_the_denial_and_scontrol_update() -> None:
    update = ["scontrol", "update", "NodeName=n1"]
    assert slurm.fix_for("scontrol: error: Invalid user id", update) == slurm.NODE_UPDATE_FIX
    assert slurm.fix_for("scontrol: error: Unexpected message received", update) is None
    assert slurm.fix_for("Invalid user id", ["scontrol", "show"]) is None


def test_never_start_fixes_by_reason() -> None:
    assert slurm.never_start_fix("InvalidQOS", 2, 3) == slurm.NEVER_START_FIXES["InvalidQOS"]
    assert slurm.never_start_fix("Resources", 2, 3) is None
    assert slurm.never_start_fix("PartitionNodeLimit", 4, 3) == (
        "ask for at most 3 node(s) (nodes: in the job file), or use a larger partition (sinfo -s)")
    assert slurm.never_start_fix("PartitionNodeLimit", 3, 3) is None


def test_unknown_job_on_any_line_of_scontrols_answer() -> None:
    assert slurm.is_unknown_job("slurm_load_jobs error: something\nJob 12_5 not found\n")
    assert not slurm.is_unknown_job("Job 12_5 not found yet\n")


def test_a_whole_line_value_keeps_its_own_equals_signs() -> None:
    [record] = slurm.parse_scontrol_show_job("JobId=5 JobName=x\n   Comment=a=b c=d\n")
    assert (record["JobId"], record["Comment"]) == ("5", "a=b c=d")


def test_values_with_capital_x_and_names_with_capitals_are_judged_as_written() -> None:
    assert slurm.build_sbatch_options({"constraint": "XEON&X86"}) == ["--constraint=XEON&X86"]
    assert slurm.build_scontrol_update_nodes("n1", "DRAIN", "XID 79")[-1] == "Reason=XID 79"
    with pytest.raises(ValueError, match="not an sbatch long option name: 'Xtime'"):
        slurm.build_sbatch_options({"Xtime": "10"})
    assert slurm.slurm_error_message("") == "no message"
