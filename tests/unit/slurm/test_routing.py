"""Candidate nodes, routing around failing ones, never-start reasons, launch shapes.

The Slurm text is recorded from the dev cluster's Slurm 22.05 (tests/data/slurm/):
sinfo with a drained node, and squeue of a 3-node job on the 2-node partition,
which shows PartitionConfig first and PartitionNodeLimit a moment later.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from test_slurm import CASES, Replay, err, out

from cluster_kit.config.launch import launch_shape
from cluster_kit.errors import ClusterRefused
from cluster_kit.fleet import routing
from cluster_kit.hostlist import NodeSet
from cluster_kit.slurm import builders as slurm
from cluster_kit.slurm import jobs
from cluster_kit.slurm import runner as slurm_runner


def node(name: str, status: str, *checks: tuple[str, str]) -> dict[str, Any]:
    """A node entry of preflight JSON (SPEC shape)."""
    return {"node": name, "status": status, "elapsed_s": 0.2,
            "checks": [{"id": cid, "status": cst, "message": f"{cid} says {cst}", "fix": "..."}
                       for cid, cst in checks]}


def report(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"profile": "p", "nodes": list(entries), "summary": {}}


# ---------------------------------------------------------------- candidates


def test_drained_node_of_sinfo_is_no_candidate() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes_drained"))
    got = routing.candidate_nodes(["n1", "n2"], rows)
    assert got.nodes == ["n1"]
    assert got.left_out == {"n2": "Slurm state drained (clusterkit: gpu.driver 535.104.05 differs from 550.54.15)"}


def test_profile_nodes_outside_the_partition_and_excluded_ones_are_left_out() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes"))
    got = routing.candidate_nodes(["n1", "n2", "gpu9"], rows, exclude=["n1"])
    assert got.nodes == ["n2"] and not got.required
    assert got.left_out == {"n1": "in slurm.exclude", "gpu9": "not in the partition (sinfo)"}


def test_nodelist_replaces_the_pool_and_is_required() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes"))
    got = routing.candidate_nodes(["n1", "n2"], rows, nodelist=["n2"])
    assert (got.nodes, got.required) == (["n2"], True)


def test_candidates_take_node_sets_as_they_take_lists() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes"))
    got = routing.candidate_nodes(NodeSet("n[1-2],gpu9"), rows, exclude=NodeSet("n1"))
    assert got == routing.candidate_nodes(["n1", "n2", "gpu9"], rows, exclude=["n1"])
    required = routing.candidate_nodes(NodeSet("n[1-2]"), rows, nodelist=NodeSet("n2"))
    assert (required.nodes, required.required) == (["n2"], True)
    assert not routing.candidate_nodes(NodeSet("n[1-2]"), rows, nodelist=NodeSet()).required


@pytest.mark.parametrize(("state", "usable"), [
    ("idle", True), ("mixed", True), ("allocated", True), ("completing", True),
    ("idle*", False), ("down*", False), ("drained", False), ("draining", False),
    ("mixed+drain", False), ("fail", False), ("failing", False), ("future", False),
])
def test_node_usable(state: str, usable: bool) -> None:
    assert routing.node_usable(slurm.NodeRow("n1", state, "")) is usable


# ---------------------------------------------------------------- routes


def test_one_failing_node_of_two_is_excluded_for_a_one_node_job() -> None:
    candidates = routing.Candidates(["n1", "n2"])
    got = routing.plan_route(candidates, report(
        node("n1", "pass", ("gpu.count", "pass")),
        node("n2", "fail", ("gpu.count", "pass"), ("rdma.port_state", "fail"))), 1)
    assert (got.refusal, got.excluded, got.exclude_expr, got.healthy) == (
        None, {"n2": ["rdma.port_state"]}, "n2", 1)


def test_too_few_healthy_nodes_refuses_and_says_how_many_would_fit() -> None:
    candidates = routing.Candidates(["n1", "n2"])
    got = routing.plan_route(candidates, report(
        node("n1", "warn", ("gpu.xid", "warn")),
        node("n2", "unreachable", ("ssh.reachable", "unreachable"))), 2)
    assert got.refusal == "only 1 healthy node(s) of 2 for a 2-node job; failing: n2 (ssh.reachable)"
    assert routing.refusal_fix(got, candidates) == (
        "ask for at most 1 node(s), fix the failing nodes (clusterkit preflight --nodes n2), "
        "or submit with --no-preflight")


def test_strict_refuses_on_any_failing_node() -> None:
    candidates = routing.Candidates(["n1", "n2"])
    got = routing.plan_route(candidates, report(
        node("n1", "pass"), node("n2", "fail", ("gpu.ecc", "fail"))), 1, strict=True)
    assert got.refusal == "--strict: failing node(s) n2 (gpu.ecc)"
    assert routing.refusal_fix(got, candidates).startswith("drop --strict to submit with --exclude=n2")


def test_a_failing_node_that_nodelist_requires_refuses() -> None:
    candidates = routing.Candidates(["n1", "n2"], required=True)
    got = routing.plan_route(candidates, report(node("n1", "pass"), node("n2", "fail", ("gpu.ecc", "fail"))), 1)
    assert got.refusal == "slurm.nodelist names failing node(s) n2 (gpu.ecc)"
    assert routing.refusal_fix(got, candidates).startswith("remove n2 from slurm.nodelist")


def test_the_jobs_own_excludes_stay_and_failing_ones_fold_in() -> None:
    candidates = routing.Candidates([f"gpu{i:03d}" for i in range(2, 8)])
    got = routing.plan_route(candidates, report(
        node("gpu003", "fail", ("rdma.link_rate", "fail")),
        node("gpu004", "fail", ("rdma.link_rate", "fail"))), 2, job_exclude=["gpu001"])
    assert got.refusal is None and got.exclude_expr == "gpu[001,003-004]"


def test_a_healthy_fleet_routes_nothing_even_when_the_job_is_larger() -> None:
    got = routing.plan_route(routing.Candidates(["n1", "n2"]), report(node("n1", "pass"), node("n2", "pass")), 3)
    assert (got.refusal, got.excluded, got.exclude_expr) == (None, {}, None)


def test_a_node_not_responding_is_never_given_the_job_unchecked() -> None:
    # n2 drained and resumed: `idle*` for a moment. Submit checks only n1, so n2
    # must be excluded, or the job may land on it once it answers again.
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes_not_responding"))
    assert [(r.node, r.state) for r in rows] == [("n1", "idle"), ("n2", "idle*")]
    candidates = routing.candidate_nodes(["n1", "n2"], rows)
    assert candidates.nodes == ["n1"] and candidates.unchecked == {"n2": routing.UNCHECKED_STATE}
    got = routing.plan_route(candidates, report(node("n1", "pass")), 1)
    assert (got.refusal, got.exclude_expr, got.excluded) == (None, "n2", {"n2": ["slurm.state"]})
    assert got.unchecked == {"n2": "Slurm state idle*"}


def test_too_few_checked_nodes_refuse_and_name_the_unchecked_one() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes_not_responding"))
    candidates = routing.candidate_nodes(["n1", "n2"], rows)
    got = routing.plan_route(candidates, report(node("n1", "pass")), 2)
    assert got.refusal == "only 1 healthy node(s) of 1 for a 2-node job; not checked: n2 (Slurm state idle*)"
    assert routing.refusal_fix(got, candidates).startswith("wait until Slurm can use n2 again (sinfo -n n2)")


def test_partition_nodes_outside_the_profiles_nodes_are_excluded() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes"))
    candidates = routing.candidate_nodes(["n1"], rows)
    assert candidates.left_out == {"n2": "in the partition, not in the profile's nodes"}
    got = routing.plan_route(candidates, report(node("n1", "pass")), 1, job_exclude=["n9"])
    assert (got.refusal, got.exclude) == (None, ["n9", "n2"])
    assert got.excluded == {"n2": [routing.UNCHECKED_POOL]}


# ---------------------------------------------------------------- never-start reasons


def test_partition_node_limit_never_clears_only_beyond_the_partitions_size() -> None:
    row = slurm.parse_squeue(out("squeue_partition_node_limit"))[0]
    assert (row.reason, row.num_nodes, row.partition) == ("PartitionNodeLimit", "3", "debug")
    assert slurm.never_start_fix(row.reason, 3, 2).startswith("ask for at most 2 node(s)")
    assert slurm.never_start_fix(row.reason, 2, 2) is None  # a node is down: it clears
    assert slurm.never_start_fix("Resources", 3, 2) is None
    assert slurm.never_start_fix("None", 1, 2) is None


class Sequenced(Replay):
    """A Replay whose squeue answers walk through several recorded cases."""

    def __init__(self, squeue_cases: Sequence[str], **extra: Sequence[str]) -> None:
        super().__init__({tuple(argv): case for case, argv in extra.items()})
        self.squeue_cases = list(squeue_cases)

    def run(self, argv: Sequence[str], stdin: str | None = None,
            timeout: float = 60.0) -> slurm_runner.Completed:
        if argv[0] == "squeue":
            self.calls.append(list(argv))
            case = self.squeue_cases.pop(0) if len(self.squeue_cases) > 1 else self.squeue_cases[0]
            return slurm_runner.Completed(list(argv), CASES[case]["returncode"], out(case), err(case))
        return super().run(argv, stdin, timeout)


def test_settle_polls_past_partition_config_and_the_job_can_never_start() -> None:
    runner = Sequenced(["squeue_partition_config", "squeue_partition_node_limit"],
                       sinfo_nodes=slurm.build_sinfo_nodes("debug"))
    status = jobs.settle(runner, "2", sleep=lambda _s: None)
    assert status.reason == "PartitionNodeLimit"
    refused = jobs.never_start_refusal(runner, status)
    assert refused is not None and refused.exit_code == 3
    assert refused.message == ("Slurm on the replay can never start job 2: pending with reason "
                               "PartitionNodeLimit: it asks for 3 nodes, partition debug has 2")


def test_watch_cancels_a_job_that_can_never_start() -> None:
    runner = Sequenced(["squeue_partition_node_limit"], sinfo_nodes=slurm.build_sinfo_nodes("debug"),
                       scancel_pending=slurm.build_scancel("2"))
    with pytest.raises(ClusterRefused, match="PartitionNodeLimit.*; cancelled it"):
        list(jobs.watch(runner, "2", sleep=lambda _s: None, cancel_never_start=True))
    assert runner.calls[-1] == slurm.build_scancel("2")


def test_status_never_shows_reason_none() -> None:
    status = jobs.JobStatus("3", "PENDING", "None", "", "0:00", None, None, "squeue")
    assert "reason" not in dict(status.items())


def test_unknown_job_names_where_slurm_runs() -> None:
    runner = Replay.of("squeue_unknown", "scontrol_show_job_unknown",
                       sacct_disabled=slurm.build_sacct("999999"))
    with pytest.raises(ClusterRefused) as info:
        jobs.job_status(runner, "999999")
    assert info.value.message == "Slurm on the replay does not know job 999999"


# ---------------------------------------------------------------- launch shape


@pytest.mark.parametrize(("launcher", "gpus", "ntasks", "cpus", "shape"), [
    ("torchrun", 8, 1, 12, (1, 8, 96)),
    ("torchrun", 2, 1, 3, (1, 2, 6)),
    ("torchrun", None, 1, 4, (1, 1, 4)),
    ("torchrun", None, 4, 12, (1, 4, 48)),
    ("srun", 8, 8, 12, (8, 8, 12)),
    ("srun", 8, None, None, (8, 8, None)),
    ("srun", None, None, 2, (1, 1, 2)),
])
def test_launch_shape(launcher: str, gpus: Any, ntasks: Any, cpus: Any, shape: tuple) -> None:
    got = launch_shape({"launcher": launcher, "gpus_per_node": gpus, "ntasks_per_node": ntasks,
                        "slurm": {"cpus_per_task": cpus}})
    assert (got.tasks_per_node, got.workers_per_node, got.cpus_per_task) == shape


def test_a_node_outside_the_profile_is_to_be_added_not_waited_for() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes_not_responding"))  # n1 idle, n2 idle*
    candidates = routing.candidate_nodes(["n1"], rows)  # a profile that lists only n1
    got = routing.plan_route(candidates, report(node("n1", "pass")), 2)
    assert candidates.unchecked == {"n2": routing.UNCHECKED_POOL}
    assert routing.refusal_fix(got, candidates) == (
        "add n2 to the profile's nodes, ask for at most 1 node(s), or submit with --no-preflight")


# ---------------------------------------------------------------- survivors of scripts/mutation


def test_without_sinfo_every_pool_node_is_a_candidate() -> None:
    got = routing.candidate_nodes(["n1", "n2"], None, exclude=["n2"])
    assert (got.nodes, got.left_out, got.unchecked) == (["n1"], {"n2": "in slurm.exclude"}, {})


def test_failing_nodes_of_entries_without_checks_and_of_an_empty_report() -> None:
    assert routing.failing_nodes({}) == {}
    assert routing.failing_nodes({"nodes": [{"node": "n3", "status": "unreachable"},
                                            {"node": "n1", "status": "pass"}]}) == {"n3": ["unreachable"]}


def test_descriptions_list_every_node_and_check() -> None:
    assert routing.describe({"n2": ["rdma.port_state", "gpu.count"], "n7": ["ssh.reachable"]}) == (
        "n2 (rdma.port_state, gpu.count), n7 (ssh.reachable)")
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes_drained"))
    candidates = routing.candidate_nodes(["n1"], rows + [slurm.NodeRow("n3", "down*", "Not responding")])
    assert routing.describe_unchecked(candidates) == "n[2-3] (in the partition, not in the profile's nodes)"
    both = routing.candidate_nodes(["n1", "n2"], rows + [slurm.NodeRow("n3", "idle", "")])
    assert routing.describe_unchecked(both) == (
        "n2 (Slurm state drained (clusterkit: gpu.driver 535.104.05 differs from 550.54.15)), "
        "n3 (in the partition, not in the profile's nodes)")


def test_the_fix_when_nodes_are_unchecked_failing_or_none_is_healthy() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes_drained"))
    outside = routing.candidate_nodes(["n1"], rows)
    route = routing.plan_route(outside, report(), 2)
    assert routing.refusal_fix(route, outside) == (
        "add n2 to the profile's nodes, ask for at most 1 node(s), or submit with --no-preflight")
    drained = routing.candidate_nodes(["n1", "n2"], rows + [slurm.NodeRow("n3", "idle", "")])
    route = routing.plan_route(drained, report(), 2)
    assert routing.refusal_fix(route, drained) == (
        "wait until Slurm can use n2 again (sinfo -n n2) and submit again, add n3 to the profile's nodes, "
        "ask for at most 1 node(s), or submit with --no-preflight")
    failing_too = routing.plan_route(outside, report(node("n1", "fail", ("gpu.count", "fail"))), 1)
    assert routing.refusal_fix(failing_too, outside) == (
        "fix the failing nodes (clusterkit preflight --nodes n[1-2]), or submit with --no-preflight")


def test_the_fix_when_the_only_unchecked_node_is_drained() -> None:
    rows = slurm.parse_sinfo_nodes(out("sinfo_nodes_drained"))
    drained = routing.candidate_nodes(["n1", "n2"], rows)
    route = routing.plan_route(drained, report(), 2)
    assert routing.refusal_fix(route, drained) == (
        "wait until Slurm can use n2 again (sinfo -n n2) and submit again, ask for at most 1 node(s), "
        "or submit with --no-preflight")
