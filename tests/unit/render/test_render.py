"""render.py and the built-in templates: golden scripts, quoting, and real bash runs.

Golden files live in tests/data/golden/; after an intended template change,
regenerate them with `CLUSTERKIT_UPDATE_GOLDEN=1 pytest tests/unit/test_render.py`
and review the diff.

The execution tests run the rendered script for real in bash with stand-ins for
`srun` (runs the step's command once per task with the SLURM_* variables Slurm
would set, and hands stdin to every task like `--input=all`), `scontrol` and the
job's Python (records argv and environment as JSON).
"""

from __future__ import annotations

import base64
import difflib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from cluster_kit.errors import InputError
from cluster_kit.render.environment import build_heredoc, render_script
from cluster_kit.render.quoting import sbatch_value, shq
from cluster_kit.render.settings import nccl_environment, sbatch_directives

ROOT = Path(__file__).resolve().parents[3]
TEMPLATES = [ROOT / "templates"]
GOLDEN = ROOT / "tests" / "data" / "golden"
UPDATE_GOLDEN = os.environ.get("CLUSTERKIT_UPDATE_GOLDEN") == "1"
HOSTILE = [
    "$(touch {canary})",
    "`touch {canary}`",
    'it\'s "quoted" $HOME ${PATH} \\ ; | & > < * ?',
    "two words",
    "line one\nline two",
    "",
    "-n",
]


def hostile(canary: object) -> list[str]:
    """HOSTILE with {canary} replaced by a file that must never be created."""
    return [value.replace("{canary}", str(canary)) for value in HOSTILE]


def make_settings(**changes: Any) -> dict[str, Any]:
    """Effective job settings with every key of docs/architecture.md present.

    Keyword arguments replace top-level keys; for the nested `slurm`,
    `network` and `environment` dicts they update the defaults instead.
    """
    settings: dict[str, Any] = {
        "name": "llama-ft",
        "profile_name": "ib-ndr",
        "nodes": 4,
        "gpus_per_node": 8,
        "ntasks_per_node": None,
        "launcher": "srun",
        "script": "train.py",
        "args": ["--epochs", "3"],
        "workdir": "/scratch/alice/run1",
        "output": "logs/%x-%j.out",
        "preflight": False,
        "cuda_graphs": False,
        "template": "ddp",
        "master_port": None,
        "slurm": {
            "partition": "gpu",
            "account": "proj123",
            "qos": "normal",
            "constraint": "h100",
            "cpus_per_task": 12,
            "mem": 0,
            "time": "04:00:00",
            "exclusive": True,
            "extra": {"mail-type": "END"},
        },
        "network": {
            "fabric": "infiniband",
            "ib_hca": ["mlx5_0:1", "mlx5_3:1"],
            "gid_index": None,
            "ib_timeout": 22,
            "socket_ifname": "ib0",
            "nccl_env": {},
            "debug": None,
        },
        "environment": {
            "modules": ["cuda/12.4"],
            "setup": ["source /opt/venvs/train/bin/activate"],
            "python": "python3",
            "env": {"OMP_NUM_THREADS": "8"},
        },
        "expect": {"gpus_per_node": 8, "gpu_model": "H100"},
    }
    for key, value in changes.items():
        if key in ("slurm", "network", "environment"):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    return settings


ROCE: dict[str, Any] = {
    "fabric": "roce",
    "ib_hca": ["mlx5_0:1", "mlx5_1:1"],
    "gid_index": 3,
    "ib_timeout": None,
    "socket_ifname": "eth0",
    "nccl_env": {"NCCL_IB_TC": "106", "NCCL_IB_QPS_PER_CONNECTION": 4},
    "debug": "INFO",
}
TCP: dict[str, Any] = {
    "fabric": "ethernet",
    "ib_hca": [],
    "gid_index": None,
    "ib_timeout": None,
    "socket_ifname": "eth0",
    "nccl_env": {},
    "debug": "WARN",
}
GOLDEN_CASES: dict[str, dict[str, Any]] = {
    "srun-ib": make_settings(),
    "torchrun-ib": make_settings(launcher="torchrun", cuda_graphs=True),
    "srun-roce": make_settings(
        profile_name="roce-h100", network=ROCE, master_port=29500
    ),
    "srun-tcp": make_settings(
        name="cpu ddp",
        profile_name="tcp-only",
        nodes=2,
        gpus_per_node=None,
        ntasks_per_node=2,
        network=TCP,
        slurm={"exclusive": False, "extra": {}, "constraint": None, "mem": "16G"},
        environment={"modules": [], "setup": [], "env": {}},
    ),
    "torchrun-tcp": make_settings(
        launcher="torchrun",
        profile_name="tcp-only",
        gpus_per_node=None,
        ntasks_per_node=4,
        network=TCP,
        workdir=None,
        output=None,
    ),
}
PROBE = (
    "import json, os\n"
    'print(json.dumps({"slurm_node": os.environ["SLURMD_NODENAME"], "pad": "x" * 3000}))\n'
)


def render(settings: dict[str, Any], **kwargs: Any) -> str:
    return render_script(settings, TEMPLATES, **kwargs)


def assert_golden(name: str, text: str) -> None:
    """Compare with tests/data/golden/NAME.sh line by line (or rewrite it)."""
    path = GOLDEN / f"{name}.sh"
    if UPDATE_GOLDEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    expected = path.read_text() if path.exists() else ""
    if text != expected:
        diff = difflib.unified_diff(
            expected.splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile=f"golden/{name}.sh",
            tofile="rendered",
        )
        pytest.fail(
            "rendered script differs from the golden file "
            "(CLUSTERKIT_UPDATE_GOLDEN=1 regenerates it):\n" + "".join(diff)
        )


def assert_shell_clean(text: str, tmp_path: Path) -> None:
    """`bash -n` and (when installed) `shellcheck` accept the script, warnings included."""
    script = tmp_path / "job.sh"
    script.write_text(text)
    syntax = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert syntax.returncode == 0, syntax.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (CI installs it)")
    lint = subprocess.run(
        ["shellcheck", str(script)], capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


# ---------------------------------------------------------------------------
# Golden scripts


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_rendered_script_matches_golden(name: str) -> None:
    assert_golden(name, render(GOLDEN_CASES[name]))


def test_preflight_script_matches_golden() -> None:
    settings = make_settings(preflight=True)
    checks = base64.encodebytes(b"not really a zip").decode()
    assert_golden(
        "srun-ib-preflight", render(settings, probe_source=PROBE, checks_source=checks)
    )


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_rendered_script_passes_bash_n_and_shellcheck(
    name: str, tmp_path: Path
) -> None:
    assert_shell_clean(render(GOLDEN_CASES[name]), tmp_path)


def test_preflight_script_passes_bash_n_and_shellcheck(tmp_path: Path) -> None:
    text = render(
        make_settings(preflight=True), probe_source=PROBE, checks_source="QUJD\n"
    )
    assert_shell_clean(text, tmp_path)


def test_hostile_values_script_passes_shellcheck(tmp_path: Path) -> None:
    values = hostile("/tmp/x")
    settings = make_settings(
        args=values,
        environment={
            "env": {f"V{i}": v for i, v in enumerate(values)},
            "python": values[0],
        },
    )
    assert_shell_clean(render(settings), tmp_path)


# ---------------------------------------------------------------------------
# Executing the rendered script with stand-ins for Slurm


STUB_SRUN = r"""#!/bin/bash
# Stand-in srun: runs the step's command once per task with Slurm's task variables.
per_node=""; ntasks=""; input_all=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ntasks-per-node=*) per_node="${1#*=}" ;;
    --ntasks=*) ntasks="${1#*=}" ;;
    --input=all) input_all=1 ;;
    --*) ;;
    *) break ;;
  esac
  shift
done
per_node="${per_node:-1}"
ntasks="${ntasks:-$(( SLURM_JOB_NUM_NODES * per_node ))}"
stdin_copy="$(mktemp)"
if [ "$input_all" = 1 ]; then cat > "$stdin_copy"; fi
nodes=(n1 n2 n3 n4)
outputs=()
rc=0
for ((task = 0; task < ntasks; task++)); do
  node=$(( task / per_node ))
  outputs+=("$(mktemp)")
  SLURM_PROCID=$task SLURM_LOCALID=$(( task % per_node )) SLURM_NODEID=$node \
    SLURM_NTASKS=$ntasks SLURM_NNODES=$SLURM_JOB_NUM_NODES SLURMD_NODENAME="${nodes[$node]}" \
    "$@" < "$stdin_copy" > "${outputs[-1]}" || rc=$?
done
# Like Slurm's line-buffered I/O: whole lines in pieces of at most 1 KiB (a
# longer line is cut), the tasks' pieces interleaved.
python3 - "${outputs[@]}" <<'MERGE'
import sys
parts = [open(name, "rb").read() for name in sys.argv[1:]]
while any(parts):
    for i, part in enumerate(parts):
        cut = part.rfind(b"\n", 0, 1024) + 1 or 1024
        sys.stdout.buffer.write(part[:cut])
        parts[i] = part[cut:]
MERGE
rm -f "$stdin_copy" "${outputs[@]}"
exit "$rc"
"""
STUB_SCONTROL = """#!/bin/bash
# Stand-in scontrol: `scontrol show hostnames LIST` for the test's n[1-2].
[ "$1 $2" = "show hostnames" ] || exit 2
printf 'n1\\nn2\\n'
"""
STUB_PYTHON = """#!{python}
# Stand-in for the job's Python: records argv and environment per task.
import json, os, sys
if sys.argv[1:2] and sys.argv[1].endswith(".pyz"):
    os.execv({python!r}, [{python!r}] + sys.argv[1:])
key = os.environ.get("RANK") or "node" + os.environ.get("SLURM_NODEID", "?")
with open(os.path.join(os.environ["RECORD_DIR"], key + ".json"), "w") as out:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, out)
"""


class FakeCluster:
    """A PATH with stub srun/scontrol/python and the SLURM_* variables of a 2-node job."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.records = root / "records"
        self.canary = root / "pwned"
        self.bin.mkdir()
        self.records.mkdir()
        self._stub("srun", STUB_SRUN)
        self._stub("scontrol", STUB_SCONTROL)
        self.python = self._stub(
            "python-stub", STUB_PYTHON.format(python=sys.executable)
        )

    def _stub(self, name: str, text: str) -> Path:
        path = self.bin / name
        path.write_text(text)
        path.chmod(0o755)
        return path

    def run(self, script: str, nodes: int = 2) -> subprocess.CompletedProcess[str]:
        path = self.root / "job.sh"
        path.write_text(script)
        env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "HOME": str(self.root),
            "RECORD_DIR": str(self.records),
            "SLURM_JOB_ID": "12345",
            "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURM_JOB_NUM_NODES": str(nodes),
        }
        return subprocess.run(
            ["bash", str(path)],
            env=env,
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
        )

    def record(self, key: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads((self.records / f"{key}.json").read_text())
        return result

    def recorded(self) -> list[str]:
        return sorted(p.stem for p in self.records.glob("*.json"))


@pytest.fixture
def cluster(tmp_path: Path) -> FakeCluster:
    return FakeCluster(tmp_path)


def local_settings(cluster: FakeCluster, **changes: Any) -> dict[str, Any]:
    """Settings that run here: no modules or setup, the stub Python."""
    changes.setdefault("environment", {})
    changes["environment"] = {
        "modules": [],
        "setup": [],
        "python": str(cluster.python),
        "env": {},
        **changes["environment"],
    }
    return make_settings(**changes)


def test_srun_script_gives_each_task_its_rank(cluster: FakeCluster) -> None:
    settings = local_settings(cluster, nodes=2, gpus_per_node=1, args=["--steps", "5"])
    result = cluster.run(render(settings))
    assert result.returncode == 0, result.stderr
    assert cluster.recorded() == ["0", "1"]
    for rank in (0, 1):
        record = cluster.record(str(rank))
        env = record["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (
            str(rank),
            "0",
            "2",
        )
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (
            "n1",
            str(20000 + 12345 % 10000),
        )
        assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_3:1"
        assert record["argv"] == ["train.py", "--steps", "5"]


def test_master_port_setting_overrides_the_derived_port(cluster: FakeCluster) -> None:
    settings = local_settings(cluster, nodes=2, gpus_per_node=1, master_port=29400)
    assert cluster.run(render(settings)).returncode == 0
    assert cluster.record("1")["env"]["MASTER_PORT"] == "29400"


def test_torchrun_script_hosts_the_store_on_node_zero_only(
    cluster: FakeCluster,
) -> None:
    settings = local_settings(cluster, launcher="torchrun", nodes=2, gpus_per_node=4)
    result = cluster.run(render(settings))
    assert result.returncode == 0, result.stderr
    assert cluster.recorded() == ["node0", "node1"]
    for node in (0, 1):
        argv = cluster.record(f"node{node}")["argv"]
        assert argv[:2] == ["-m", "torch.distributed.run"]
        assert "--nnodes=2" in argv and "--nproc-per-node=4" in argv
        assert "--rdzv-endpoint=n1:22345" in argv and "--rdzv-id=12345" in argv
        assert f"--rdzv-conf=is_host={1 if node == 0 else 0}" in argv
        assert argv[-3:] == ["train.py", "--epochs", "3"]
        assert "RANK" not in cluster.record(f"node{node}")["env"]


def test_cuda_graphs_flag_reaches_the_trainer(cluster: FakeCluster) -> None:
    settings = local_settings(cluster, nodes=1, gpus_per_node=1, cuda_graphs=True)
    assert cluster.run(render(settings), nodes=1).returncode == 0
    assert cluster.record("0")["env"]["CLUSTERKIT_CUDA_GRAPHS"] == "1"


# A job file's `cuda_graphs:` -> the exported variable -> what build_step compiles with.
GRAPHS_COMPILE = [
    ("true", None, None),
    ("{compile: false}", None, None),
    ("{compile: true}", "1", {}),
    ("{compile: default}", "1", {}),
    ("{compile: max-autotune-no-cudagraphs}", "max-autotune-no-cudagraphs",
     {"mode": "max-autotune-no-cudagraphs"}),
    (("{compile: {fullgraph: true, dynamic: false, options: {coordinate_descent_tuning: true, "
     "'triton.max_tiles': 2}}}"),
     '{"dynamic":false,"fullgraph":true,"options":{"coordinate_descent_tuning":true,"triton.max_tiles":2}}',
     {"fullgraph": True, "dynamic": False, "options": {"coordinate_descent_tuning": True, "triton.max_tiles": 2}}),
]


@pytest.mark.parametrize(("written", "exported", "options"), GRAPHS_COMPILE, ids=[g[0] for g in GRAPHS_COMPILE])
def test_cuda_graphs_compile_reaches_build_step_as_written(
    cluster: FakeCluster, written: str, exported: str | None, options: dict[str, Any] | None
) -> None:
    from cluster_kit.config import spec, specs
    from cluster_kit.config.effective import graphs_compile_env
    from cluster_kit.config.yamlfile import loads
    from cluster_kit.trainer import compile_options

    data = loads(f"cuda_graphs: {written}").data
    assert spec.check(data, specs.JOB) == []
    job = spec.with_defaults(data, specs.JOB)
    value = graphs_compile_env(job["cuda_graphs"])
    assert value == exported
    settings = local_settings(cluster, nodes=1, gpus_per_node=1, cuda_graphs=True, cuda_graphs_compile=value)
    assert cluster.run(render(settings), nodes=1).returncode == 0
    env = cluster.record("0")["env"]
    assert env["CLUSTERKIT_CUDA_GRAPHS"] == "1"
    assert env.get("CLUSTERKIT_CUDA_GRAPHS_COMPILE") == exported
    assert compile_options.options_from_env(env) == options


def test_hostile_values_arrive_intact_and_run_nothing(cluster: FakeCluster) -> None:
    values = hostile(cluster.canary)
    env = {f"HOSTILE_{i}": value for i, value in enumerate(values)}
    settings = local_settings(
        cluster,
        name=values[0],
        nodes=1,
        gpus_per_node=1,
        script=values[1],
        args=values,
        workdir=f"/tmp/a b/{values[0]}",
        environment={"env": env, "modules": [values[0]]},
        network={"socket_ifname": values[2], "nccl_env": {"NCCL_IB_TC": values[0]}},
    )
    # `module` is a shell function on clusters; here one that only records.
    script = render(settings).replace(
        "set -euo pipefail\n",
        'set -euo pipefail\nmodule() { printf "%s\\n" "$@" > "$RECORD_DIR/module.args"; }\n',
    )
    result = cluster.run(script, nodes=1)
    assert result.returncode == 0, result.stderr
    assert not cluster.canary.exists()
    record = cluster.record("0")
    assert record["argv"] == [values[1], *values]
    assert all(record["env"][name] == value for name, value in env.items())
    assert record["env"]["NCCL_SOCKET_IFNAME"] == values[2]
    assert record["env"]["NCCL_IB_TC"] == values[0]
    assert (cluster.records / "module.args").read_text() == f"load\n{values[0]}\n"


def sbatch_words(line: str) -> list[str]:
    """Split an `#SBATCH` line's options the way sbatch does (opt.c, _get_argument)."""
    words, word, quote, escape, i = [], None, "", False, 0
    rest = line[len("#SBATCH") :]
    while i < len(rest):
        ch = rest[i]
        i += 1
        if escape:
            word, escape = (word or "") + ch, False
        elif ch == "\\":
            escape = True
        elif quote:
            if ch == quote:
                quote = ""
            else:
                word = (word or "") + ch
        elif ch in "\"'":
            quote, word = ch, word or ""
        elif ch == "#":
            break
        elif ch.isspace():
            if word is not None:
                words.append(word)
            word = None
        else:
            word = (word or "") + ch
    assert not quote, f"unmatched quote in {line!r}"
    return words + ([word] if word is not None else [])


@pytest.mark.parametrize(
    "value", [v for v in hostile("/tmp/x") if "\n" not in v] + ["a#b", "x\\"]
)
def test_sbatch_lines_read_back_as_the_value(value: str) -> None:
    settings = make_settings(name=value or "x", workdir=f"/tmp/a b/{value}")
    lines = [
        line for line in render(settings).splitlines() if line.startswith("#SBATCH")
    ]
    options = dict(sbatch_words(line)[0].split("=", 1) for line in lines if "=" in line)
    assert options["--job-name"] == (value or "x")
    assert options["--chdir"] == f"/tmp/a b/{value}"
    assert all(len(sbatch_words(line)) == 1 for line in lines)


# ---------------------------------------------------------------------------
# The in-job preflight


def checks_bundle() -> str:
    """A zip app with the injob contract: `checks.pyz FACTS NODE...`, exit 1 on a silent node."""
    main = textwrap.dedent(
        """
        import json, sys
        seen = {json.loads(l)["slurm_node"] for l in open(sys.argv[1]) if l.startswith("{")}
        bad = [n for n in sys.argv[2:] if n not in seen]
        for node in sys.argv[2:]:
            print("clusterkit preflight: %s: %s" % (node, "fail" if node in bad else "pass"))
        sys.exit(1 if bad else 0)
        """
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("__main__.py", main)
    return base64.encodebytes(buf.getvalue()).decode()


def test_preflight_passes_then_training_starts(cluster: FakeCluster) -> None:
    settings = local_settings(cluster, nodes=2, gpus_per_node=1, preflight=True)
    script = render(settings, probe_source=PROBE, checks_source=checks_bundle())
    result = cluster.run(script)
    assert result.returncode == 0, result.stderr
    assert "clusterkit preflight: n2: pass" in result.stdout
    assert cluster.recorded() == ["0", "1"]


def test_preflight_failure_on_one_node_stops_the_job(cluster: FakeCluster) -> None:
    probe = PROBE.replace("print(", 'os.environ["SLURMD_NODENAME"] == "n2" or print(')
    settings = local_settings(cluster, nodes=2, gpus_per_node=1, preflight=True)
    result = cluster.run(
        render(settings, probe_source=probe, checks_source=checks_bundle())
    )
    assert result.returncode == 1
    assert "clusterkit preflight: n2: fail" in result.stdout
    assert "training was not started" in result.stderr
    assert cluster.recorded() == []


def test_preflight_is_left_out_without_a_probe() -> None:
    text = render(make_settings(preflight=True))
    assert (
        'srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" --input=all'
        not in text
    )
    assert "no probe was embedded" in text


def test_heredoc_delimiter_never_occurs_in_the_source() -> None:
    source = "CLUSTERKIT_PROBE\nCLUSTERKIT_PROBE_1\nx = 'CLUSTERKIT_PROBE_2'"
    heredoc = build_heredoc(source, "CLUSTERKIT_PROBE")
    assert heredoc.delimiter not in source
    assert heredoc.body == source + "\n"


def test_probe_source_containing_the_delimiter_is_written_intact(
    cluster: FakeCluster,
) -> None:
    probe = PROBE + "# CLUSTERKIT_PROBE\n'''\nCLUSTERKIT_PROBE\n'''\n"
    settings = local_settings(cluster, nodes=2, gpus_per_node=1, preflight=True)
    script = render(settings, probe_source=probe, checks_source=checks_bundle())
    copy = script.replace(
        'rm -rf "$clusterkit_preflight"', 'cp "$clusterkit_preflight/probe.py" .'
    )
    assert cluster.run(copy).returncode == 0
    assert (cluster.root / "probe.py").read_text() == probe


# ---------------------------------------------------------------------------
# Filters and mappings


@pytest.mark.parametrize(
    ("network", "expected"),
    [
        (
            {"fabric": "infiniband", "ib_hca": ["mlx5_0:1", "mlx5_3:1"]},
            [("NCCL_IB_HCA", "=mlx5_0:1,mlx5_3:1")],
        ),
        ({"ib_hca": "^mlx5_2"}, [("NCCL_IB_HCA", "^mlx5_2")]),
        (
            {"fabric": "roce", "gid_index": 3, "ib_timeout": 22},
            [("NCCL_IB_GID_INDEX", "3"), ("NCCL_IB_TIMEOUT", "22")],
        ),
        ({"gid_index": 0}, [("NCCL_IB_GID_INDEX", "0")]),
        (
            {"socket_ifname": "eth0"},
            [("NCCL_SOCKET_IFNAME", "eth0"), ("GLOO_SOCKET_IFNAME", "eth0")],
        ),
        ({"debug": "INFO"}, [("NCCL_DEBUG", "INFO")]),
        ({"fabric": "ethernet"}, [("NCCL_IB_DISABLE", "1")]),
        (
            {"nccl_env": {"NCCL_IB_TC": 41, "NCCL_NVLS_ENABLE": False}},
            [("NCCL_IB_TC", "41"), ("NCCL_NVLS_ENABLE", "0")],
        ),
        (
            {"ib_hca": ["mlx5_0"], "nccl_env": {"NCCL_IB_HCA": "mlx5_9"}},
            [("NCCL_IB_HCA", "mlx5_9")],
        ),
        (
            {
                "fabric": "roce",
                "ib_hca": [],
                "gid_index": None,
                "nccl_env": {},
                "debug": None,
            },
            [],
        ),
    ],
)
def test_nccl_environment_mapping(
    network: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    assert list(nccl_environment(network).items()) == expected


def test_nccl_environment_order_is_fixed() -> None:
    env = nccl_environment({**ROCE, "fabric": "ethernet", "ib_timeout": 20})
    assert list(env) == [
        "NCCL_IB_DISABLE",
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
        "NCCL_IB_TIMEOUT",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "NCCL_DEBUG",
        "NCCL_IB_TC",
        "NCCL_IB_QPS_PER_CONNECTION",
    ]


def test_nccl_env_name_that_is_not_a_variable_is_refused() -> None:
    with pytest.raises(InputError, match="not a valid environment variable name"):
        nccl_environment({"nccl_env": {"NCCL_X; touch /tmp/pwned": "1"}})


def test_env_name_that_is_not_a_variable_is_refused() -> None:
    settings = make_settings(environment={"env": {"A=B": "1"}})
    with pytest.raises(InputError, match="not a valid environment variable name"):
        render(settings)


def test_sbatch_directives_order_flags_and_extra() -> None:
    directives = sbatch_directives(
        make_settings(slurm={"extra": {"requeue": True, "mail-type": "END"}})
    )
    assert [option for option, _ in directives] == [
        "job-name", "nodes", "ntasks-per-node", "gpus-per-node", "cpus-per-task", "mem",
        "time", "partition", "account", "qos", "constraint", "exclusive", "output", "chdir",
        "requeue", "mail-type",
    ]  # fmt: skip
    assert dict(directives)["exclusive"] == "" and dict(directives)["mem"] == "0"
    assert dict(directives)["ntasks-per-node"] == "8"


@pytest.mark.parametrize(
    ("launcher", "gpus", "ntasks", "expected"),
    [
        ("srun", 8, None, "8"),
        ("torchrun", 8, None, "1"),
        ("srun", None, None, "1"),
        ("srun", 8, 2, "2"),
    ],
)
def test_default_tasks_per_node(
    launcher: str, gpus: Any, ntasks: Any, expected: str
) -> None:
    settings = make_settings(
        launcher=launcher, gpus_per_node=gpus, ntasks_per_node=ntasks
    )
    assert dict(sbatch_directives(settings))["ntasks-per-node"] == expected


def test_sbatch_option_name_is_checked() -> None:
    with pytest.raises(InputError, match="not an sbatch long option"):
        sbatch_directives(make_settings(slurm={"extra": {"--x\n#SBATCH": "1"}}))


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b", "a\tb"])
@pytest.mark.parametrize(
    ("change", "setting"),
    [
        ({"name": "{bad}"}, "name"),
        ({"workdir": "/x/{bad}"}, "workdir"),
        ({"output": "{bad}"}, "output"),
        ({"slurm": {"partition": "{bad}"}}, "slurm.partition"),
        ({"slurm": {"extra": {"reservation": "{bad}"}}}, "slurm.sbatch.reservation"),
    ],
)
def test_control_character_in_an_sbatch_value_is_an_input_error(
    bad: str, change: dict[str, Any], setting: str
) -> None:
    filled = json.loads(json.dumps(change).replace("{bad}", json.dumps(bad)[1:-1]))
    with pytest.raises(InputError) as info:
        render(make_settings(**filled))
    assert setting in info.value.message and "one line" in info.value.message


def test_hetjob_word_in_an_sbatch_value_is_refused() -> None:
    with pytest.raises(InputError, match="heterogeneous-job separator"):
        render(make_settings(name="my-HetJob"))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gpu", "gpu"),
        ("logs/%x-%j.out", "logs/%x-%j.out"),
        ("a b", '"a b"'),
        ('a"\\', '"a\\"\\\\"'),
    ],
)
def test_sbatch_value_quotes_only_when_needed(value: str, expected: str) -> None:
    assert sbatch_value(value, "job-name") == expected


@pytest.mark.parametrize("value", [*hostile("/tmp/x"), 42, True])
def test_shq_round_trips_through_bash(value: Any) -> None:
    out = subprocess.run(
        ["bash", "-c", f"printf %s {shq(value)}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == ("true" if value is True else str(value))


def test_shq_quotes_a_leading_equals_sign() -> None:
    assert shq("=mlx5_0:1") == "'=mlx5_0:1'"


def test_shq_refuses_an_unset_value() -> None:
    with pytest.raises(InputError, match="unset value"):
        shq(None)


def test_unknown_launcher_is_an_input_error() -> None:
    with pytest.raises(InputError, match="launcher"):
        render(make_settings(launcher="mpirun"))


# ---------------------------------------------------------------------------
# User templates and template errors


def test_user_template_by_path_can_include_builtin_partials(tmp_path: Path) -> None:
    user = tmp_path / "mine.j2"
    user.write_text(
        '#!/bin/bash\n{% include "_sbatch_header.j2" %}\necho {{ settings.name|shq }}\n'
    )
    text = render(make_settings(name="a b"), template=str(user))
    assert text.splitlines()[1] == '#SBATCH --job-name="a b"'
    assert text.endswith("echo 'a b'\n")


def test_user_template_dir_comes_first(tmp_path: Path) -> None:
    (tmp_path / "ddp.j2").write_text("#!/bin/bash\necho mine\n")
    assert (
        render_script(make_settings(), [tmp_path, *TEMPLATES])
        == "#!/bin/bash\necho mine\n"
    )


def test_template_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "broken.j2").write_text("#!/bin/bash\n\n{% if %}\n")
    with pytest.raises(InputError, match=r"broken\.j2:3: template syntax error"):
        render_script(make_settings(), [tmp_path], template="broken")


def test_undefined_variable_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "typo.j2").write_text(
        "#!/bin/bash\necho ok\necho {{ settings.nmae }}\n"
    )
    with pytest.raises(InputError, match=r"typo\.j2:3: template error: .*nmae"):
        render_script(make_settings(), [tmp_path], template="typo")


def test_missing_template_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="'nope.j2' not found"):
        render_script(make_settings(), [tmp_path], template="nope")


def test_render_imports_nothing_heavy() -> None:
    code = (
        "import sys, cluster_kit.render\n"
        "heavy = {'torch', 'paramiko', 'yaml', 'numpy'} & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert out.stdout.strip() == "[]"


def test_rendered_script_ends_with_one_newline() -> None:
    for settings in GOLDEN_CASES.values():
        text = render(settings)
        assert text.endswith("\n") and not text.endswith("\n\n")
        assert re.match(r"#!/bin/bash\n#SBATCH ", text)


# ---------------------------------------------------------------------------
# Containers (job key `container:`)

PYXIS = {"image": "nvcr.io#nvidia/pytorch:24.05-py3", "runtime": "pyxis",
         "mounts": ["/scratch:/scratch", "/datasets:/data:ro"], "workdir": "/scratch/alice/run1",
         "writable": False, "mount_home": False, "env": ["WANDB_API_KEY"]}
APPTAINER = {"image": "/shared/images/pytorch.sif", "runtime": "apptainer",
             "mounts": ["/scratch:/scratch"], "workdir": None, "writable": True,
             "mount_home": False, "env": []}
CONTAINER_CASES: dict[str, dict[str, Any]] = {
    "pyxis-srun-ib": make_settings(container=PYXIS, preflight=True),
    "apptainer-torchrun-roce": make_settings(launcher="torchrun", network=ROCE, container=APPTAINER),
}


@pytest.mark.parametrize("name", sorted(CONTAINER_CASES))
def test_container_script_matches_golden_and_passes_shellcheck(name: str, tmp_path: Path) -> None:
    text = render(CONTAINER_CASES[name], probe_source=PROBE, checks_source="QUJD\n")
    assert_golden(name, text)
    assert_shell_clean(text, tmp_path)


def srun_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("srun ")]


def test_pyxis_flags_ride_on_every_srun_step_and_keep_every_export() -> None:
    text = render(CONTAINER_CASES["pyxis-srun-ib"], probe_source=PROBE, checks_source="QUJD\n")
    steps = srun_lines(text)
    assert len(steps) == 2  # the probe step and the training step
    names = ("MASTER_ADDR,MASTER_PORT,NCCL_IB_HCA,NCCL_IB_TIMEOUT,NCCL_SOCKET_IFNAME,"
             "GLOO_SOCKET_IFNAME,OMP_NUM_THREADS,WANDB_API_KEY")
    for step in steps:
        assert "'--container-image=nvcr.io#nvidia/pytorch:24.05-py3'" in step
        assert "--container-mounts=/scratch:/scratch,/datasets:/data:ro" in step
        assert "--container-workdir=/scratch/alice/run1 --no-container-mount-home" in step
        assert f"--container-env={names}" in step
    # the batch script itself stays on the host: no container option in #SBATCH lines
    assert not [line for line in text.splitlines() if line.startswith("#SBATCH") and "container" in line]


def test_apptainer_wraps_each_task_and_exports_host_values() -> None:
    text = render(CONTAINER_CASES["apptainer-torchrun-roce"])
    assert "  apptainer exec --nv --bind /scratch:/scratch --no-home --writable-tmpfs " \
           "/shared/images/pytorch.sif bash -c " in text
    for name in ("MASTER_ADDR", "MASTER_PORT", "NCCL_IB_GID_INDEX", "NCCL_IB_TC", "NCCL_SOCKET_IFNAME"):
        assert f'export APPTAINERENV_{name}="${{{name}}}"' in text
    assert "--container-" not in text


def test_no_container_renders_exactly_as_before() -> None:
    # every golden case above has no container; this guards the None path itself
    for settings in GOLDEN_CASES.values():
        assert "container" not in render({**settings, "container": None})
