"""`--set KEY=VALUE` on validate, render and submit --dry-run, in-process on real files:
nested keys, lists, bad keys and bad values, each reported where it came from."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import clirun
import pytest
from clirun import ck

from cluster_kit.config import overrides
from cluster_kit.config.search import builtin_dir
from cluster_kit.errors import InputError

work = clirun.work  # the fixture: an empty folder as cwd and HOME

LOCAL_DEV = builtin_dir("profiles") / "local-dev.yaml"
JOB = f"""\
name: tune
profile: {LOCAL_DEV}
nodes: 1
gpus_per_node: 0
script: train.py
args: ["--lr", "1e-3"]
output: logs/%x-%j.out
env: {{LR: "1e-3"}}
slurm: {{mail_type: END}}
"""


@pytest.fixture
def job(work: Path) -> Path:
    (work / "train.py").write_text("print('hi')\n")
    path = work / "job.yaml"
    path.write_text(JOB)
    return path


def render(job: Path, *sets: str) -> str:
    done = ck("render", str(job), *[arg for item in sets for arg in ("--set", item)])
    assert done.exit_code == 0, done.stderr
    return done.stdout


def test_a_nested_key_reaches_the_script(job: Path) -> None:
    script = render(job, "env.LR=3e-4", "slurm.mail_type=ALL", "env.BATCH=64")
    assert "export LR=3e-4\n" in script
    assert "export BATCH=64\n" in script  # a new key below an existing mapping
    assert "#SBATCH --mail-type=ALL\n" in script


def test_a_value_is_read_as_yaml_as_in_the_file(job: Path) -> None:
    script = render(job, "time=01:30:00", "nodes=2", "nccl={debug: INFO}")
    assert "#SBATCH --time=01:30:00\n" in script  # a time stays text, as in the files
    assert "#SBATCH --nodes=2\n" in script
    assert "export NCCL_DEBUG=INFO\n" in script


def test_a_list_is_replaced_whole_or_by_item(job: Path) -> None:
    assert render(job, "args=[--lr, 3e-4, --epochs, 2]").rstrip().endswith("train.py --lr 3e-4 --epochs 2")
    assert render(job, "args.1=5e-5").rstrip().endswith("train.py --lr 5e-5")


def test_a_key_the_file_spells_the_other_way_is_overridden(job: Path) -> None:
    job.write_text(JOB.replace("nodes: 1", "nodes: 1\ntime: \"00:05:00\""))
    assert "#SBATCH --time=01:00:00\n" in render(job, "slurm.time=01:00:00")
    assert "#SBATCH --time=02:00:00\n" in render(job, "time=02:00:00")


def test_later_sets_win(job: Path) -> None:
    assert "export LR=2\n" in render(job, "env.LR=1", "env.LR=2")


def test_a_mistyped_key_is_exit_2_naming_the_set_option(job: Path) -> None:
    done = ck("validate", str(job), "--set", "slurm.tme=01:00:00")
    assert done.exit_code == 2
    assert done.stderr.startswith("--set slurm.tme: unknown key 'tme' in slurm; did you mean 'time'?")


def test_a_mistyped_top_level_key_from_the_command_line(job: Path) -> None:
    done = ck("render", str(job), "--set", "nodse=2")
    assert done.exit_code == 2
    assert done.stderr.startswith("--set nodse: unknown key 'nodse'; did you mean 'nodes'?")


def test_a_bad_value_is_exit_2_naming_the_set_option(job: Path) -> None:
    done = ck("submit", str(job), "--dry-run", "--set", "nodes=many")
    assert done.exit_code == 2
    assert "--set nodes: nodes: expected an integer, got a string ('many')" in done.stderr
    bad_list = ck("validate", str(job), "--set", "args=3")
    assert bad_list.exit_code == 2 and "--set args: args: expected a list" in bad_list.stderr


def test_problems_of_the_file_keep_their_line_beside_those_of_sets(job: Path) -> None:
    job.write_text(JOB.replace("nodes: 1", "nodes: 1\nlauncher: mpirun"))
    done = ck("validate", str(job), "--set", "env.9X=1")
    assert done.exit_code == 2
    lines = done.stderr.splitlines()
    assert any(line.startswith(f"{job}:4: launcher:") for line in lines), lines
    assert any(line.startswith("--set env.9X: ") for line in lines), lines


def test_a_key_set_below_a_list_item_names_the_value_of_the_file(job: Path) -> None:
    done = ck("validate", str(job), "--set", "script.path=x.py")
    assert done.exit_code == 2
    assert f"--set script.path: script is 'train.py' ({job}:5), not a mapping" in done.stderr
    out_of_range = ck("validate", str(job), "--set", "args.7=x")
    assert out_of_range.exit_code == 2
    assert f"args is a list of 2 item(s) ({job}:6); 7 is not one of its indexes" in out_of_range.stderr


@pytest.mark.parametrize("bad", ["nodes", "=3", "a..b=1", "env.LR=[1"])
def test_a_malformed_set_is_exit_2(job: Path, bad: str) -> None:
    done = ck("render", str(job), "--set", bad)
    assert done.exit_code == 2
    assert "--set" in done.stderr and "fix:" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_script_set_on_the_command_line_is_named_there(job: Path) -> None:
    done = ck("validate", str(job), "--set", "script=nowhere.py")
    assert done.exit_code == 2
    assert done.stderr.startswith("--set script: ")


def test_validate_with_sets_passes_a_good_job(job: Path) -> None:
    done = ck("validate", str(job), "--set", "env.LR=3e-4")
    assert done.exit_code == 0, done.stderr


def test_after_adds_the_dependency(job: Path) -> None:
    done = ck("submit", str(job), "--dry-run", "--after", "12", "--after", "13:notok")
    assert done.exit_code == 0, done.stderr
    assert "#SBATCH --dependency=afterok:12,afternotok:13\n" in done.stdout


@pytest.mark.parametrize("bad", ["12:maybe", "x12", ""])
def test_a_bad_after_is_exit_2(job: Path, bad: str) -> None:
    done = ck("submit", str(job), "--dry-run", "--after", bad)
    assert done.exit_code == 2
    assert f"--after {bad}" in done.stderr and "fix:" in done.stderr


def test_a_sweep_that_changes_an_sbatch_option_is_refused(job: Path) -> None:
    done = ck("submit", str(job), "--dry-run", "--sweep", "nodes=1,2")
    assert done.exit_code == 2
    assert "task 1 (nodes=2) changes the job's #SBATCH options" in done.stderr


def test_max_parallel_needs_a_sweep(job: Path) -> None:
    done = ck("submit", str(job), "--dry-run", "--max-parallel", "2")
    assert done.exit_code == 2 and "add --sweep" in done.stderr


@pytest.mark.parametrize(("text", "values"), [
    ("env.LR=1e-3,3e-4", ["1e-3", "3e-4"]),
    ('env.NCCL_ALGO=["Ring,Tree", Ring]', ["Ring,Tree", "Ring"]),  # one YAML list: values with commas
    ("args=[[--lr, 1e-3], [--lr, 3e-4]]", [["--lr", "1e-3"], ["--lr", "3e-4"]]),
    ("args=[a],[b]", [["a"], ["b"]]),  # not one list: two values, each a list
    ("env.X= [4, 8] ", [4, 8]),
])
def test_sweep_values_split_on_commas_or_given_as_one_list(text: str, values: list[Any]) -> None:
    assert overrides.parse_sweep(text) == (text.split("=", 1)[0], values)


@pytest.mark.parametrize(("text", "message"), [
    ("env.X=[]", "--sweep env.X: '[]' lists no values"),
    ("env.X=[a, b", ("--sweep env.X: cannot read '[a, b' as a YAML list of values: expected ',' or ']', but got "
                    "'<stream end>'")),
])
def test_a_sweep_list_that_is_empty_or_unclosed_is_refused_whole(text: str, message: str) -> None:
    with pytest.raises(InputError) as refused:
        overrides.parse_sweep(text)
    assert refused.value.message == message


def test_a_swept_value_holding_a_comma_reaches_its_task(job: Path) -> None:
    done = ck("submit", str(job), "--dry-run", "--sweep", 'env.NCCL_ALGO=["Ring,Tree", Ring]')
    assert done.exit_code == 0, done.stderr
    assert "#   0: env.NCCL_ALGO=Ring,Tree\n#   1: env.NCCL_ALGO=Ring\n" in done.stdout
    assert done.stdout.count("export NCCL_ALGO=Ring,Tree\n") == 1
