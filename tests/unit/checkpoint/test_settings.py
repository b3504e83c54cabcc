"""What a rank reads from the environment the supervisor sets (settings.py)."""
from __future__ import annotations

import pytest

from cluster_kit.trainer.checkpoint.interval import DEFAULT_RESTART_S, Every
from cluster_kit.trainer.checkpoint.settings import (
    Settings,
    nodes_from_env,
    settings_from_env,
)


def test_a_plain_script_gets_the_defaults() -> None:
    assert settings_from_env({}) == Settings(
        directory=None, attempt=0, chain="", control_dir=None, every=Every("auto"), keep=3,
        mtbf_s=5000 * 3600.0, restart_s=DEFAULT_RESTART_S, nodes=1, rank=0, world_size=1)


def test_a_supervised_rank_reads_what_the_supervisor_exports() -> None:
    env = {"CLUSTERKIT_CHECKPOINT_DIR": "/scratch/run1/ckpt", "CLUSTERKIT_ATTEMPT": "2",
           "CLUSTERKIT_CHAIN_ID": "4711", "CLUSTERKIT_CONTROL_DIR": "/rec/attempt-2",
           "CLUSTERKIT_CHECKPOINT_EVERY": "30m", "CLUSTERKIT_KEEP_CHECKPOINTS": "5",
           "CLUSTERKIT_MTBF_S": "28440", "CLUSTERKIT_RESTART_S": "8.5", "SLURM_JOB_NUM_NODES": "16",
           "RANK": "7", "WORLD_SIZE": "64"}
    assert settings_from_env(env) == Settings(
        directory="/scratch/run1/ckpt", attempt=2, chain="4711", control_dir="/rec/attempt-2",
        every=Every("seconds", 1800.0), keep=5, mtbf_s=28440.0, restart_s=8.5, nodes=16, rank=7,
        world_size=64)


def test_without_a_chain_id_the_record_folder_names_the_chain() -> None:
    env = {"CLUSTERKIT_CONTROL_DIR": "/scratch/logs/clusterkit-4711/attempt-3/"}
    assert settings_from_env(env).chain == "clusterkit-4711"
    assert settings_from_env(dict(env, CLUSTERKIT_CHAIN_ID="4711")).chain == "4711"


def test_without_the_supervisors_mtbf_it_is_one_nodes_over_the_nodes() -> None:
    assert settings_from_env({"SLURM_NNODES": "4"}).mtbf_s == 5000 * 3600 / 4


@pytest.mark.parametrize("env, nodes", [
    ({}, 1), ({"SLURM_JOB_NUM_NODES": "8"}, 8), ({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "4"}, 4),
    ({"WORLD_SIZE": "16"}, 1), ({"SLURM_JOB_NUM_NODES": "2", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "4"}, 2),
])
def test_the_node_count(env: dict[str, str], nodes: int) -> None:
    assert nodes_from_env(env) == nodes


@pytest.mark.parametrize("name, value, message", [
    ("CLUSTERKIT_CHECKPOINT_EVERY", "soon", "CLUSTERKIT_CHECKPOINT_EVERY: checkpoint_every: 'soon' is not auto"),
    ("CLUSTERKIT_KEEP_CHECKPOINTS", "0", "CLUSTERKIT_KEEP_CHECKPOINTS='0' is not a whole number >= 1"),
    ("CLUSTERKIT_KEEP_CHECKPOINTS", "two", "CLUSTERKIT_KEEP_CHECKPOINTS='two' is not a whole number >= 1"),
    ("CLUSTERKIT_ATTEMPT", "-1", "CLUSTERKIT_ATTEMPT='-1' is not a whole number >= 0"),
    ("CLUSTERKIT_MTBF_S", "0", "CLUSTERKIT_MTBF_S='0' is not a number >= 1"),
    ("CLUSTERKIT_RESTART_S", "x", "CLUSTERKIT_RESTART_S='x' is not a number >= 0"),
])
def test_a_malformed_value_names_its_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        settings_from_env({name: value})
