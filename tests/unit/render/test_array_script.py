"""A sweep's array script (render/array.py through `submit --dry-run --sweep`): the
golden file of its index-to-values mapping, `bash -n` and shellcheck, and each task
run for real in bash (stand-ins for srun, scontrol and python3) with its own values,
port and arguments."""
from __future__ import annotations

import difflib
import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_render import assert_shell_clean

from cluster_kit.cli import cli
from cluster_kit.errors import InputError
from cluster_kit.render.array import (
    array_output,
    array_spec,
    build_array_script,
    split_header,
)

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden" / "array-sweep.sh"
UPDATE_GOLDEN = os.environ.get("CLUSTERKIT_UPDATE_GOLDEN") == "1"
PROFILE = """\
name: sweep-test
slurm: {partition: debug, time: "00:10:00"}
network: {fabric: ethernet, socket_ifname: lo}
environment: {python: python3}
"""
JOB = """\
name: tune
profile: ./sweep-test.yaml
nodes: 1
gpus_per_node: 0
script: train.py
args: ["--lr", "1e-3"]
workdir: {workdir}
output: logs/%x-%j.out
env: {{LR: "1e-3", BS: "32"}}
preflight: false
"""
SWEEP = ("--sweep", "env.LR=1e-3,3e-4", "--sweep", "args.1=1,2,3", "--max-parallel", "2")
FAKES = {
    "srun": '#!/bin/bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n',
    "scontrol": "#!/bin/bash\necho n1\n",
    "python3": '#!/bin/bash\necho "task=$CLUSTERKIT_SWEEP_INDEX LR=$LR BS=$BS port=$MASTER_PORT argv=$*"\n',
}


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder as cwd and HOME, with no CLUSTERKIT_* settings."""
    for name in ("CLUSTERKIT_PATH", "CLUSTERKIT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def ck(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def array_script(folder: Path, *extra: str) -> str:
    (folder / "train.py").write_text("print('hi')\n")
    (folder / "sweep-test.yaml").write_text(PROFILE)
    (folder / "job.yaml").write_text(JOB.format(workdir=folder))
    done = ck("submit", "job.yaml", "--dry-run", *SWEEP, *extra)
    assert done.exit_code == 0, done.stderr
    first, _, script = done.stdout.partition("\n")
    assert first == "# sbatch --parsable < script"
    return script.replace(str(folder), "/scratch/tune")  # the same golden file in any folder


def test_the_array_script_matches_its_golden_file(work: Path) -> None:
    text = array_script(work)
    if UPDATE_GOLDEN:
        GOLDEN.write_text(text)
    expected = GOLDEN.read_text()
    if text != expected:
        diff = difflib.unified_diff(expected.splitlines(keepends=True), text.splitlines(keepends=True),
                                    fromfile="golden/array-sweep.sh", tofile="rendered")
        pytest.fail("array script differs from the golden file (CLUSTERKIT_UPDATE_GOLDEN=1 regenerates it):\n"
                    + "".join(diff))


def test_the_header_maps_each_index_to_its_values(work: Path) -> None:
    text = array_script(work)
    assert "#SBATCH --array=0-5%2\n" in text
    assert "#SBATCH --output=logs/%x-%A_%a.out\n" in text
    mapping = re.findall(r"^#   (\d+): (.*)$", text, re.MULTILINE)
    assert mapping == [("0", "env.LR=1e-3 args.1=1"), ("1", "env.LR=1e-3 args.1=2"), ("2", "env.LR=1e-3 args.1=3"),
                       ("3", "env.LR=3e-4 args.1=1"), ("4", "env.LR=3e-4 args.1=2"), ("5", "env.LR=3e-4 args.1=3")]


def test_the_array_script_passes_bash_n_and_shellcheck(work: Path) -> None:
    assert_shell_clean(array_script(work), work)


def run_task(script: Path, bin_dir: Path, index: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": index, "SLURM_ARRAY_JOB_ID": "4711",
           "SLURM_JOB_ID": str(4711 + int(index or 0)), "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1"}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=False, timeout=30)


def test_each_task_runs_with_its_own_values_and_port(work: Path) -> None:
    script = work / "array.sh"
    script.write_text(array_script(work).replace("/scratch/tune", str(work)))
    bin_dir = work / "bin"
    bin_dir.mkdir()
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    lines = []
    for index in range(6):
        done = run_task(script, bin_dir, str(index))
        assert done.returncode == 0, done.stderr
        lines.append(done.stdout.splitlines()[-1])
    lrs = ["1e-3"] * 3 + ["3e-4"] * 3
    assert lines == [f"task={i} LR={lrs[i]} BS=32 port={20000 + (4711 + i) % 10000} argv=train.py --lr {i % 3 + 1}"
                     for i in range(6)]
    outside = run_task(script, bin_dir, "6")
    assert outside.returncode == 2 and "no sweep values for array task 6" in outside.stderr


def test_a_master_port_of_the_job_is_offset_by_the_index(work: Path) -> None:
    text = array_script(work, "--set", "master_port=29500")
    assert re.findall(r"^MASTER_PORT=(\S+)$", text, re.MULTILINE) == [str(29500 + i) for i in range(6)]


@pytest.mark.parametrize("output, expected", [
    ("logs/%x-%j.out", "logs/%x-%A_%a.out"), ("run.log", "run-%a.log"), ("logs/out", "logs/out-%a"),
    ("t-%A_%a.out", "t-%A_%a.out"), (None, None)])
def test_each_task_gets_its_own_output_file(output: str | None, expected: str | None) -> None:
    assert array_output(output) == expected


def test_array_spec() -> None:
    assert array_spec(3, None) == "0-2"
    assert array_spec(3, 2) == "0-2%2"
    with pytest.raises(InputError):
        array_spec(0, None)


def test_split_header_keeps_the_shebang_and_sbatch_lines() -> None:
    header, body = split_header("#!/bin/bash\n#SBATCH --nodes=1\n# a comment\necho hi\n")
    assert header == ["#!/bin/bash", "#SBATCH --nodes=1"]
    assert body == ["# a comment", "echo hi"]


def test_tasks_with_different_sbatch_options_are_refused() -> None:
    with pytest.raises(InputError, match="task 1 .* changes the job's #SBATCH options"):
        build_array_script(["#!/bin/bash\n#SBATCH --nodes=1\necho\n", "#!/bin/bash\n#SBATCH --nodes=2\necho\n"],
                           [{"nodes": 1}, {"nodes": 2}], "0-1")
