"""Blame names the node Slurm knows: a host name a rank wrote becomes the allocation's Slurm name.

Issue 36: on a cluster whose host names are FQDNs, a hung rank's node was never
excluded (its `gpu002.cluster.local` is not the allocation's `n2`), and the restart
ran on the culprit. The nodes are tests/data/slurm/scontrol_show_node_fqdn.stdout.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from supervised import step as next_step

from cluster_kit.slurm import builders
from cluster_kit.slurm.node_names import slurm_names
from cluster_kit.supervisor import decide, record
from cluster_kit.supervisor.record import AttemptRecord

NODES = builders.parse_scontrol_show_nodes(
    (Path(__file__).resolve().parents[2] / "data" / "slurm" / "scontrol_show_node_fqdn.stdout").read_text())
RESILIENCE = {"max_restarts": 2, "hang_timeout": 20.0, "exclude": "blamed", "grace": 20,
              "max_time_requeues": 1, "checkpoint_dir": None}


def named(culprit: dict) -> dict:
    return decide.on_slurm_names(culprit, slurm_names(culprit["hosts"], NODES))


def test_a_hung_ranks_host_name_is_excluded_as_its_slurm_name() -> None:
    hang = decide.culprit_of([5], ["gpu002.cluster.local"], "rank 5 is not in all_reduce #812 that ranks 0-4,6-7 wait in")
    blamed = named(hang)
    assert blamed == dict(hang, hosts=["n2"])
    rec = record.new_record("7", RESILIENCE)
    rec.attempts.append(AttemptRecord.from_dict({"attempt": 0, "ended": "hang", "culprit": decide.recorded_culprit(blamed)}))
    step = next_step(rec, "hang", decide.excludable(blamed, ["n1", "n2"]), RESILIENCE, 1)
    assert (step["exclude"], step["why"]) == (["n2"], "a hang: restart 1 of max_restarts 2 without n2")


def test_a_host_that_is_no_node_of_the_allocation_is_kept_apart_and_never_excluded() -> None:
    blamed = named(decide.culprit_of([1, 6], ["gpu001", "vm"], "..."))
    assert (blamed["hosts"], blamed["unmatched_hosts"]) == (["n1"], ["vm"])
    assert decide.recorded_culprit(blamed)["unmatched_hosts"] == ["vm"]
    assert decide.excludable(blamed, ["n1", "n2"])["hosts"] == ["n1"]
    assert decide.on_slurm_names(None, {}) is None
    assert "unmatched_hosts" not in named(decide.culprit_of([0], ["n3"], "..."))


def test_when_slurm_does_not_answer_the_allocations_names_are_still_blamed(monkeypatch: pytest.MonkeyPatch) -> None:
    from cluster_kit.supervisor import ending, slurmctl

    asked: list[list[str]] = []

    def refuse(argv: list[str], **_: object) -> str:
        asked.append(argv)
        raise RuntimeError("scontrol show node failed: Unable to contact slurm controller (connect failure)")

    monkeypatch.setattr(slurmctl, "slurm", refuse)
    monkeypatch.setattr(ending.time, "sleep", lambda s: None)
    blamed = ending.slurm_names(decide.culprit_of([3], ["n2", "gpu009.cluster.local"], "..."), ["n1", "n2"])
    assert len(asked) == ending.NODE_TABLE_TRIES  # asked again before giving up
    assert (blamed["hosts"], blamed["unmatched_hosts"]) == (["n2"], ["gpu009.cluster.local"])
