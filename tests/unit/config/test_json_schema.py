"""`clusterkit schema`: the JSON Schema agrees with the validator on real files and values."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from cluster_kit.cli import cli
from cluster_kit.config import json_schema, specs
from cluster_kit.config import spec as config_spec
from cluster_kit.config.load import is_job, validate_files
from cluster_kit.config.search import SearchPath
from cluster_kit.config.yamlfile import load, loads

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "tests" / "data" / "config"
SHIPPED = sorted([*ROOT.glob("profiles/*.yaml"), *ROOT.glob("examples/*.yaml"),
                  *CONFIG.glob("good-*.yaml")])


def validator(kind: str) -> jsonschema.Draft202012Validator:
    built = json_schema.build(kind)
    jsonschema.Draft202012Validator.check_schema(built)
    return jsonschema.Draft202012Validator(built)


VALIDATORS = {kind: validator(kind) for kind in json_schema.KINDS}


def schema_errors(data: Any, kind: str) -> list[str]:
    return [error.message for error in VALIDATORS[kind].iter_errors(data)]


def spec_errors(data: dict[str, Any], kind: str) -> list[str]:
    problems = [m for _, m in config_spec.check(data, specs.JOB if kind == "job" else specs.PROFILE)]
    if kind == "job":
        problems += [f"missing {key}" for key in specs.JOB_REQUIRED if key not in data]
    return problems


def test_the_shipped_files_are_found() -> None:
    names = {path.name for path in SHIPPED}
    assert {"roce-v2.yaml", "local-dev.yaml", "cpu-ddp.yaml", "good-job.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_profile_and_job_validates(path: Path) -> None:
    doc = load(path)
    kind = "job" if is_job(doc.data) else "profile"
    assert not validate_files([path], SearchPath.from_environment([CONFIG]))
    assert schema_errors(doc.data, kind) == []


@pytest.mark.parametrize(("name", "kind"), [("bad-profile.yaml", "profile"), ("bad-job.yaml", "job")])
def test_the_known_bad_files_fail_both(name: str, kind: str) -> None:
    data = load(CONFIG / name).data
    assert spec_errors(data, kind)
    assert len(schema_errors(data, kind)) >= 5, schema_errors(data, kind)


# One mistake each, on top of a valid file: the validator and the schema both refuse it.
BAD_PROFILES = [
    "nodes: 'gpu 01'", "extra_key: 1", "ssh: {port: 70000}", "ssh: {host_key_policy: trust-all}",
    "ssh: {fanout: 0}", "ssh: {connect_timeout: -1}", "ssh: {colour: red}", "login: {host: 'a b'}",
    "slurm: {partition: 'gpu$(reboot)'}", "slurm: {account: \"a\\nb\"}", "slurm: {gpus_per_node: -1}",
    "slurm: {gpus_per_node: 'h100:'}", "slurm: {time: '25:61:00'}", "slurm: {mem: 64GB}",
    "slurm: {exclusive: always}", "slurm: {mail_typo: END}", "slurm: {job_name: x}",
    "slurm: {sbatch: {resrvation: x}}", "slurm: {sbatch: {nodes: 2}}", "slurm: {partition_name: x}",
    "network: {fabric: ib}", "network: {ib_hca: ['mlx5 1']}", "network: {ib_hca: mlx5_0}",
    "network: {gid_index: -1}", "network: {ib_timeout: 32}", "network: {socket_ifname: 'eth0 eth1'}",
    "network: {nccl_env: {NCCL_IB_TIMOUT: 22}}", "network: {nccl_env: {NCCL_IB_HCA: x}}",
    "network: {nccl_env: {NCCL_IB_TC: true}}", "environment: {env: {9LIVES: x}}",
    "environment: {env: {BAD: \"two\\nlines\"}}", "environment: {modules: cuda}",
    "environment: {python: ''}", "environment: {python: ~/venv/bin/python}", "expect: {min_driver: 535.40}", "expect: {nccl: at least 2.18}",
    "expect: {memlock: lots}", "expect: {peermem: yes please}", "expect: {gpus_per_node: 0}",
    "expect: {ib_rate_gbps: 0}", "expect: {gpu_model: 5}",
]
BAD_JOBS = [
    "nodes: 0", "launcher: mpirun", "time: 90:00:00:00", "output: logs/$(id).out",
    "env: {9LIVES: x}", "nccl: {debug: LOUD}", "nccl: {ib_timeout: 40}", "nccl: {colour: red}",
    "slurm: {job-name: other}", "args: [[1]]", "preflight: maybe", "master_port: 80",
    "template: ''", "unknown: 1", "gpus_per_node: -8", "environment: {python: ~/venv/bin/python}",
    "environment: {colour: red}", "environment: {setup: '. venv/bin/activate'}",
    "resilience: 5", "resilience: {max_restart: 2}", "resilience: {max_restarts: -1}",
    "resilience: {hang_timeout: 0}", "resilience: {exclude: all}", "resilience: {grace: 70000}",
    "resilience: {grace: 1.5}", "resilience: {checkpoint_dir: ~/ckpt}",
    "cuda_graphs: maybe", "cuda_graphs: 1", "cuda_graphs: {colour: red}", "cuda_graphs: {compile: 1}",
    "cuda_graphs: {compile: reduce-overhead}", "cuda_graphs: {compile: {mode: max-autotune}}",
    "cuda_graphs: {compile: {fullgraph: 1}}", "cuda_graphs: {compile: {dynamic: maybe}}",
    "cuda_graphs: {compile: {colour: red}}", "cuda_graphs: {compile: {options: {triton.cudagraphs: true}}}",
    "cuda_graphs: {compile: {options: {'a b': 1}}}", "cuda_graphs: {compile: {options: {x: [1]}}}",
]


@pytest.mark.parametrize("line", BAD_PROFILES)
def test_a_bad_profile_value_fails_both(line: str) -> None:
    data = {"name": "p", **loads(line).data}
    assert spec_errors(data, "profile"), line
    assert schema_errors(data, "profile"), line


@pytest.mark.parametrize("line", BAD_JOBS)
def test_a_bad_job_value_fails_both(line: str) -> None:
    data = {"profile": "local-dev", "script": "train.py", **loads(line).data}
    assert spec_errors(data, "job"), line
    assert schema_errors(data, "job"), line


def test_a_job_without_its_required_keys_fails_both() -> None:
    assert spec_errors({"nodes": 2}, "job")
    assert len(schema_errors({"nodes": 2}, "job")) == len(specs.JOB_REQUIRED) == 2


# Values every scalar check is tried with: the schema must accept all the check accepts.
VALUES: list[Any] = [
    0, 1, 8, 22, 31, 32, 65535, 70000, -1, 1.5, 0.0, True, False, None, "", " ", "x", "8", "8M", "64G",
    "lots", "unlimited", "UNLIMITED", "04:00:00", "2-12:30", "25:61:00", "h100:8", "h100:", "mlx5_0:1",
    "mlx5 1", "gpu[001-064]", "gpu[01-", "535.104.05", "535.x", ">=2.18", ">=2.18,<3", "at least", "eth0", "=eth0,eth1",
    "^docker", "a$(b)", "two\nlines", "user", "topo", "INFO", "info", "roce", "srun", "strict", "[1]",
    "NCCL_IB_TC", "mail_type", "mail-type", "--qos", "job-name", "WANDB_MODE", "9LIVES", [1], {"a": 1},
]


def every_field(spec: config_spec.Spec, path: str = "") -> list[tuple[str, config_spec.Field]]:
    if isinstance(spec, config_spec.Section):
        return [item for key, sub in spec.fields.items() for item in every_field(sub, f"{path}.{key}")] + (
            every_field(spec.extra.value, f"{path}.*") if spec.extra else []) + (
            [(f"{path}(shorthand)", spec.shorthand)] if spec.shorthand else [])
    if isinstance(spec, config_spec.ListOf):
        return every_field(spec.item, f"{path}[]")
    if isinstance(spec, config_spec.MapOf):
        return every_field(spec.value, f"{path}.*")
    return [(path, spec)]


FIELDS = every_field(specs.PROFILE) + every_field(specs.JOB)


@pytest.mark.parametrize(("path", "field"), FIELDS, ids=[path for path, _ in FIELDS])
def test_the_schema_accepts_every_value_its_check_accepts(path: str, field: config_spec.Field) -> None:
    fragment = jsonschema.Draft202012Validator(json_schema.field_schema(field))
    for value in VALUES:
        if field.check(value) is None and not (isinstance(value, str) and "\n" in value):
            assert fragment.is_valid(value), (path, value)


@pytest.mark.parametrize(("path", "field"), FIELDS, ids=[path for path, _ in FIELDS])
def test_the_schema_refuses_what_its_check_refuses(path: str, field: config_spec.Field) -> None:
    """Exact agreement except where JSON Schema cannot say it: a hostlist's brackets
    must balance, and JSON has no integers apart from numbers (0.0 is one there)."""
    fragment = jsonschema.Draft202012Validator(json_schema.field_schema(field))
    for value in VALUES:
        if field.check(value) is not None and value != "gpu[01-" \
                and not (isinstance(value, float) and value.is_integer()):
            assert not fragment.is_valid(value), (path, value, field.check(value))


def schema_paths(node: dict[str, Any], path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out = set()
    for key, sub in (node.get("properties") or {}).items():
        out.add(path + (key,))
        out |= schema_paths(sub, path + (key,))
    for option in node.get("anyOf") or []:  # a section with a shorthand scalar
        out |= schema_paths(option, path)
    return out


@pytest.mark.parametrize("kind", json_schema.KINDS)
def test_every_spec_key_is_in_the_schema_with_a_description(kind: str) -> None:
    built = json_schema.build(kind)
    spec = specs.JOB if kind == "job" else specs.PROFILE
    paths = json_schema.spec_paths(spec)
    assert set(paths) <= schema_paths(built)
    missing = [".".join(p) for p in paths if not specs.describe(kind, ".".join(p))]
    assert missing == []


def test_every_description_names_a_real_key() -> None:
    real = {"", "job"} | {".".join(p) for p in json_schema.spec_paths(specs.PROFILE)} \
        | {"job." + ".".join(p) for p in json_schema.spec_paths(specs.JOB)}
    assert set(specs.DESCRIPTIONS) - real == set()


def test_unknown_keys_are_closed_where_the_validator_closes_them() -> None:
    profile = json_schema.build("profile")
    assert profile["additionalProperties"] is False
    assert profile["properties"]["ssh"]["additionalProperties"] is False
    assert profile["properties"]["network"]["properties"]["fabric"]["enum"] == ["infiniband", "roce", "ethernet"]
    assert "NCCL_IB_TC" in profile["properties"]["network"]["properties"]["nccl_env"]["properties"]
    assert "NCCL_IB_HCA" not in profile["properties"]["network"]["properties"]["nccl_env"]["properties"]


def every_check(spec: config_spec.Spec) -> list[Any]:
    if isinstance(spec, config_spec.Section):
        return [c for sub in spec.fields.values() for c in every_check(sub)] + (
            every_check(spec.extra) if spec.extra else []) + (
            [spec.shorthand.check] if spec.shorthand else [])
    if isinstance(spec, config_spec.ListOf):
        return every_check(spec.item)
    if isinstance(spec, config_spec.MapOf):
        return [spec.key_check, *every_check(spec.value)]
    return [spec.check]


def test_every_check_carries_its_json_fragment() -> None:
    checks = every_check(specs.PROFILE) + every_check(specs.JOB)
    assert len(checks) > 60
    assert [c for c in checks if not isinstance(c, config_spec.Rule) or not c.json] == []


def test_a_check_without_a_fragment_accepts_anything_in_the_schema() -> None:
    assert json_schema.field_schema(config_spec.Field(lambda value: None)) == {}


# Files the YAML loader refuses, or whose top level is no mapping, never reach a schema.
OTHER_FILES = sorted(path for path in CONFIG.glob("*.yaml")
                     if path.name not in ("bad-yaml.yaml", "duplicate.yaml", "empty.yaml", "list-top.yaml"))


@pytest.mark.parametrize("path", OTHER_FILES, ids=lambda p: p.name)
def test_the_schema_and_the_spec_agree_on_each_test_file(path: Path) -> None:
    """Good or bad, each file of tests/data/config is judged alike (one file, no extends)."""
    data = load(path).data
    kind = "job" if is_job(data) else "profile"
    assert bool(spec_errors(data, kind)) == bool(schema_errors(data, kind)), path.name


# What `clusterkit schema KIND` must print, written out here, not taken from json_schema.build.
PRINTED = {
    "profile": {"title": "clusterkit profile", "required": None, "good": ROOT / "profiles" / "roce-v2.yaml",
                "bad": CONFIG / "bad-profile.yaml",
                "keys": ["environment", "expect", "extends", "login", "name", "network", "nodes", "slurm", "ssh"]},
    "job": {"title": "clusterkit job", "required": ["profile", "script"], "good": CONFIG / "good-job.yaml",
            "bad": CONFIG / "bad-job.yaml",
            "keys": ["args", "container", "cuda_graphs", "env", "environment", "gpus_per_node", "launcher",
                     "master_port", "name", "nccl", "nodes", "output", "preflight", "profile", "resilience",
                     "script", "slurm", "template", "time", "workdir"]},
}


@pytest.mark.parametrize("kind", json_schema.KINDS)
def test_the_command_prints_the_schema(kind: str) -> None:
    result = CliRunner().invoke(cli, ["schema", kind])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    expected = PRINTED[kind]
    jsonschema.Draft202012Validator.check_schema(printed)
    assert printed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert (printed["title"], printed.get("required")) == (expected["title"], expected["required"])
    assert sorted(printed["properties"]) == expected["keys"]
    assert printed["additionalProperties"] is False
    check = jsonschema.Draft202012Validator(printed)
    assert list(check.iter_errors(load(expected["good"]).data)) == []
    assert list(check.iter_errors(load(expected["bad"]).data))
    assert not check.is_valid({**load(expected["good"]).data, "colour": "red"})


def test_the_command_refuses_an_unknown_kind() -> None:
    result = CliRunner().invoke(cli, ["schema", "cluster"])
    assert result.exit_code == 2
    assert "'profile', 'job'" in result.output
