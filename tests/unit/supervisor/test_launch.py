"""Where an attempt runs inside its allocation: its nodes, srun's line, its port."""
from __future__ import annotations

import pytest

from cluster_kit.supervisor import decide, launch, record

SRUN = ["srun", "--ntasks-per-node=2", '--ntasks=6', "--kill-on-bad-exit=1", "bash", "-c",
        'export RANK="$SLURM_PROCID"; exec "$@"', "clusterkit-task", "/venv/bin/python", "train.py", "--ntasks=9"]


@pytest.mark.parametrize(("usable", "nodes", "least", "plan"), [
    (["n1", "n2", "n3"], 2, 2, ["n1", "n2"]),  # the spare waits
    (["n1", "n3"], 2, 2, ["n1", "n3"]),  # the spare in place of n2
    (["n1"], 2, 2, None),  # no spare left: a new job
    (["n1"], 2, 1, ["n1"]),  # min_nodes 1: on with one node
    ([], 2, 1, None),
])
def test_the_nodes_of_the_next_attempt(usable: list[str], nodes: int, least: int, plan: list[str] | None) -> None:
    assert launch.step_nodes(usable, nodes, least) == plan


def test_srun_runs_on_exactly_the_steps_nodes() -> None:
    argv = launch.step_argv(SRUN, ["n1", "n3"])
    assert argv[:5] == ["srun", "--nodes=2", "--ntasks=4", "--nodelist=n[1,3]", "--ntasks-per-node=2"]
    assert argv[5:] == ["--kill-on-bad-exit=1", *SRUN[4:]]  # the script's own --ntasks=9 is the script's


def test_torchruns_one_task_per_node_and_a_launch_that_is_not_srun() -> None:
    torchrun = ["/usr/bin/srun", "--ntasks-per-node=1", '--ntasks=3', "--cpus-per-task=16", "bash", "-c", "x"]
    assert launch.step_argv(torchrun, ["n2", "n3", "n4"])[:4] == [
        "/usr/bin/srun", "--nodes=3", "--ntasks=3", "--nodelist=n[2-4]"]
    assert launch.step_argv(["mpirun", "-n", "4", "x"], ["n1"]) == ["mpirun", "-n", "4", "x"]


@pytest.mark.parametrize(("base", "number", "port"), [("29500", 0, 29500), ("29500", 3, 29503),
                                                      ("65534", 3, 65531)])
def test_each_attempt_in_the_allocation_has_a_port_of_its_own(base: str, number: int, port: int) -> None:
    assert launch.step_port(base, number) == port


def test_the_chains_history_for_the_checkpoint_interval() -> None:
    attempts = [
        {"ended": "hang", "started_at": 100.0, "ended_at": 400.0, "detected_after_s": 20.0},
        {"ended": "crash", "started_at": 405.0, "ended_at": 1005.0, "detected_after_s": 1.0},
        {"ended": "time_limit", "started_at": 1035.0, "ended_at": 1635.0},
        {"ended": "running", "started_at": 1700.0},
    ]
    run_s, failures, restart_s = decide.chain_history([record.AttemptRecord.from_dict(a) for a in attempts])
    assert (run_s, failures) == (1500.0, 2)
    assert restart_s == pytest.approx(((405 - 400 + 20) + (1035 - 1005 + 1)) / 2)
    assert decide.chain_history([]) == (0.0, 0, None)


def test_the_steps_of_a_job_leave_the_guard_out() -> None:
    from cluster_kit.supervisor import slurmctl

    text = "235.0|bash\n235.batch|batch\n235.1|clusterkit-guard\n235.2|bash\n235.extern|extern\n"
    assert slurmctl.parse_steps(text) == ["0", "2"]
