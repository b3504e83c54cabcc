"""The scalar checks and the walker of cluster_kit.config.specs, and the YAML loader's traps."""
from __future__ import annotations

from typing import Any

import pytest

from cluster_kit.config import spec, specs, validators
from cluster_kit.config.yamlfile import loads


@pytest.mark.parametrize("value", [
    30, 0, "30", "05:30", "04:00:00", "100:00:00", "2-12", "2-12:30", "2-12:30:15",
    "UNLIMITED", "infinite",
])
def test_every_time_form_sbatch_accepts(value: Any) -> None:
    assert validators.slurm_time()(value) is None


@pytest.mark.parametrize("value", [
    "25:61:00", "1:2:3:4", "2-24", "2-12:60", "1h", "", "-5", -5, 1.5, True, "04:00:00\n",
])
def test_times_sbatch_refuses(value: Any) -> None:
    assert "is not a Slurm time limit" in (validators.slurm_time()(value) or "")


def test_unquoted_times_and_ports_stay_text() -> None:
    """YAML 1.1 reads 04:00:00 as 14400 and 010 as 8; the loader keeps both as written."""
    data = loads("time: 04:00:00\nhca: [mlx5_0:1]\ncode: 010\nn: 8\nx: 1.5\nflag: yes\n").data
    assert data == {"time": "04:00:00", "hca": ["mlx5_0:1"], "code": "010", "n": 8,
                    "x": 1.5, "flag": True}


@pytest.mark.parametrize(("check", "good", "bad"), [
    (validators.memlock(), ["unlimited", "8M", "64G", "1024K", 1024], ["lots", "8MB", -1, True]),
    (validators.slurm_memory(), [0, 16000, "500M", "64G", "1T"], ["64 GB", -1, 1.5]),
    (validators.ib_hca(), ["mlx5_0", "mlx5_0:1", "mlx5_bond_0:1"], ["mlx5 0", "mlx5_0:0", ":1", 5]),
    (validators.gpus(), [0, 1, 8, "h100:8"], [-1, "8", "h100:", "h100:0", True]),
    (validators.dotted_version(), ["535.104.05", "550", 550], [535.40, "535.x", "v550"]),
    (validators.pep440_specifier(), [">=2.18", ">=2.18,<3", "==2.21.5"], ["2.18+", 2.18, "at least"]),
    (validators.integer(0, 31), [0, 22, 31], [32, -1, "22", True]),
    (validators.duration_window(), ["24h", "30m", "7d", "90s", "600", 3600, 604800],
     ["8d", 604801, "1w", "24 h", "-1h", 0, "0h", True, 1.5]),
    (validators.exclusive(), [True, False, "user", "mcs", "topo"], ["yes", 1]),
    (validators.env_name(), ["OMP_NUM_THREADS", "_x", "a1"], ["1A", "A-B", "A B", ""]),
    (validators.sbatch_value(), ["END,FAIL", "afterok:123", "now+1hour", 5, True],
     ["$(id)", "a b", "a;b", "`id`", "x'y"]),
])
def test_scalar_checks(check: spec.Check, good: list[Any], bad: list[Any]) -> None:
    assert [v for v in good if check(v) is not None] == []
    assert [v for v in bad if check(v) is None] == []


def test_hostlist_uses_slurm_syntax() -> None:
    check = validators.hostlist()
    assert check("gpu[001-064],login01") is None
    assert "is not a Slurm hostlist" in (check("gpu[1-") or "")


@pytest.mark.parametrize(("name", "message"), [
    ("NCCL_IB_TC", None),
    ("NCCL_IB_TIMOUT", ("'NCCL_IB_TIMOUT' is not a known NCCL variable; did you mean "
                       "'NCCL_IB_TIMEOUT'?")),
    ("NCCL_FROBNICATE", ("'NCCL_FROBNICATE' is not a known NCCL variable; see the Environment "
                        "Variables page of the NCCL documentation")),
    ("OMP_NUM_THREADS", ("'OMP_NUM_THREADS' is not an NCCL variable (those start with NCCL_); "
                        "put other variables in environment.env")),
    ("NCCL_IB_HCA", "NCCL_IB_HCA is set from network.ib_hca; set it there instead"),
    ("NCCL_DEBUG", "NCCL_DEBUG is set from the job's nccl.debug; set it there instead"),
])
def test_nccl_names(name: str, message: str | None) -> None:
    assert validators.nccl_name()(name) == message


@pytest.mark.parametrize(("key", "message"), [
    ("mail_type", None),
    ("mail-type", None),
    ("reservation", None),
    ("--reservation", "write '--reservation' without the leading dashes: reservation"),
    ("resrvation", "'resrvation' is not an sbatch option; did you mean 'reservation'?"),
    ("gpus-per-node", "'gpus-per-node' has its own key; write it as slurm.gpus_per_node"),
    ("nodes", "--nodes is set from the job's `nodes`; remove it here"),
    ("wrap", "--wrap is set from the rendered script; remove it here"),
])
def test_sbatch_option_names(key: str, message: str | None) -> None:
    assert specs.sbatch_option_name()(key) == message


def test_walker_reports_in_document_order_with_key_paths() -> None:
    data = {"slurm": {"partition": "gpu", "nodez": 1}, "network": {"ib_hca": "mlx5_0"},
            "environment": {"setup": ["ok", 3]}}
    assert spec.check(data, specs.PROFILE) == [
        (("slurm", "nodez"), ("unknown key 'nodez' in slurm; did you mean 'nodes'? valid keys: "
         "partition, account, qos, constraint, gpus_per_node, ntasks_per_node, cpus_per_task, "
         "mem, time, exclusive, nodelist, exclude, sbatch, or any sbatch long option (e.g. mail_type)")),
        (("network", "ib_hca"), "network.ib_hca: expected a list, got a string ('mlx5_0')"),
        (("environment", "setup", 1), "environment.setup[1]: expected a string, got an integer (3)"),
    ]


def test_with_defaults_fills_sections_but_leaves_login_and_job_nccl_absent() -> None:
    profile = spec.with_defaults({"ssh": {"user": "a"}}, specs.PROFILE)
    assert profile["login"] is None
    assert profile["ssh"] == {"user": "a", "port": None, "identity_file": None, "proxy_jump": None,
                              "config_file": None,
                              "known_hosts": None, "host_key_policy": "strict",
                              "connect_timeout": 10, "command_timeout": 60, "fanout": 64}
    login = {"host": "login01", "known_hosts": "/etc/ssh/ssh_known_hosts", "command_timeout": 30}
    assert spec.check({"login": login}, specs.PROFILE) == []  # a login host is trusted like a node
    assert spec.with_defaults({"login": login}, specs.PROFILE)["login"]["host_key_policy"] == "strict"
    job = spec.with_defaults({"nccl": {"ib_timeout": 22}}, specs.JOB)
    assert job["nccl"] == {"ib_timeout": 22}
    assert (job["nodes"], job["launcher"], job["template"], job["preflight"]) == (1, "srun", "ddp", True)


def test_numbers_pass_as_text_on_sbatch_lines_only() -> None:
    """`partition: 123` is written as its text on an #SBATCH line; a user name must be a string."""
    assert validators.sbatch_text(validators.NAME_CHARS)(123) is None
    assert validators.sbatch_text(validators.NAME_CHARS)(True) == "expected a string, got a boolean (True)"
    assert "must not carry" in (validators.sbatch_text(validators.NAME_CHARS)("a b") or "")
    assert validators.safe_string(validators.NAME_CHARS, "a user name")(123) == \
        "expected a string, got an integer (123)"
