"""`bench ddp` pieces without a cluster, and `clusterkit analyze` on recorded traces."""
from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_render import assert_shell_clean, make_settings, render

from cluster_kit.cli import cli
from cluster_kit.commands import bench_ddp
from cluster_kit.errors import InputError

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


def test_sweep_variants_start_with_the_job_as_it_is() -> None:
    variants = bench_ddp.sweep_variants(cuda_graphs=False)
    assert variants == ["as-is", "bucket_cap_mb=1", "bucket_cap_mb=5", "bucket_cap_mb=25", "bucket_cap_mb=100",
                        "gradient_as_bucket_view", "static_graph", "cuda_graphs=on"]
    assert bench_ddp.sweep_variants(cuda_graphs=True)[-1] == "cuda_graphs=off"
    assert bench_ddp.choose_variants(False, ("static_graph", "as-is")) == ["as-is", "static_graph"]
    with pytest.raises(InputError, match=r"--variant 'bucket=3' is not a DDP variant.*") as err:
        bench_ddp.choose_variants(False, ("bucket=3",))
    assert "bucket_cap_mb=100" in (err.value.fix or "")


def test_profiled_settings_export_the_window_and_folder() -> None:
    settings = make_settings(environment={"env": {"OMP_NUM_THREADS": "1"}})
    out = bench_ddp.profiled_settings(settings, 7, "logs/clusterkit-ddp-x")
    assert out["environment"]["env"] == {"OMP_NUM_THREADS": "1", "CLUSTERKIT_PROFILE_STEPS": "7",
                                         "CLUSTERKIT_PROFILE_DIR": "logs/clusterkit-ddp-x"}
    assert "CLUSTERKIT_PROFILE_STEPS" not in settings["environment"]["env"]  # not changed in place
    with pytest.raises(InputError, match="--steps 0"):
        bench_ddp.profiled_settings(settings, 0, "x")
    assert re.fullmatch(r"logs/clusterkit-ddp-\d{8}-\d{6}-[0-9a-f]{6}", bench_ddp.profile_dir("logs", None))
    assert bench_ddp.profile_dir(None, "/work").startswith("/work/clusterkit-ddp-")


BENCH = {"scratch": "/out/clusterkit-ddp-x/scratch", "launches": "/out/clusterkit-ddp-x/launches.tsv"}


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_sweep_script_runs_the_launch_once_per_variant(launcher: str, tmp_path: Path) -> None:
    settings = make_settings(launcher=launcher)
    plain = render(settings)
    swept = render(settings, extra={"ddp_variants": ["as-is", "bucket_cap_mb=1", "cuda_graphs=on"], "bench": BENCH})
    assert "clusterkit_launch" not in plain and "CLUSTERKIT_DDP_VARIANT" not in plain
    assert "CLUSTERKIT_CHECKPOINT_DIR" not in plain
    assert "for CLUSTERKIT_DDP_VARIANT in as-is bucket_cap_mb=1 cuda_graphs=on; do" in swept
    assert swept.count("clusterkit_launch") == 2  # defined once, called once per variant
    assert "export CLUSTERKIT_SCRATCH_DIR=/out/clusterkit-ddp-x/scratch/\"$1\"" in swept
    assert_shell_clean(swept, tmp_path)
    single = render(settings, extra={"ddp_variants": None, "bench": BENCH})
    assert "CLUSTERKIT_DDP_VARIANT" not in single and single.rstrip().endswith("clusterkit_bench_launch as-is")
    assert_shell_clean(single, tmp_path)


def bench_part(script: str, tmp_path: Path) -> Path:
    """The rendered script's launch loop, with a stand-in launch that acts like a resuming trainer.

    The stand-in resumes when it finds a checkpoint in CLUSTERKIT_CHECKPOINT_DIR
    (printing "skipped"), writes one, and fails under static_graph.
    """
    loop = script[script.index("clusterkit_bench_launch() {"):]
    stand_in = (
        'clusterkit_launch() {\n'
        '  if [ -e "$CLUSTERKIT_CHECKPOINT_DIR/ckpt" ]; then echo "$CLUSTERKIT_DDP_VARIANT skipped"; return 0; fi\n'
        '  echo "$CLUSTERKIT_DDP_VARIANT graphs=${CLUSTERKIT_CUDA_GRAPHS:-} scratch=$CLUSTERKIT_SCRATCH_DIR port=$MASTER_PORT"\n'
        '  : >"$CLUSTERKIT_CHECKPOINT_DIR/ckpt"\n'
        '  [ "$CLUSTERKIT_DDP_VARIANT" != static_graph ]\n'
        '}\n')
    path = tmp_path / "loop.sh"
    path.write_text("set -euo pipefail\nCLUSTERKIT_DDP_VARIANT=as-is\n" + stand_in + loop)
    return path


def test_sweep_loop_goes_on_after_a_failing_variant_in_fresh_scratch(tmp_path: Path) -> None:
    """The loop of the rendered script, run by bash: each launch its own checkpoints, its status recorded."""
    bench = {"scratch": str(tmp_path / "scratch"), "launches": str(tmp_path / "launches.tsv")}
    swept = render(make_settings(), extra={"ddp_variants": ["as-is", "static_graph", "cuda_graphs=on"],
                                           "bench": bench})
    env = {"PATH": "/usr/bin:/bin", "CLUSTERKIT_CUDA_GRAPHS": "0", "MASTER_PORT": "29500",
           "CLUSTERKIT_CHECKPOINT_DIR": str(tmp_path / "the-jobs-own")}
    (tmp_path / "the-jobs-own").mkdir()
    (tmp_path / "the-jobs-own" / "ckpt").write_text("a finished run")
    done = subprocess.run(["bash", str(bench_part(swept, tmp_path))], capture_output=True, text=True,
                          check=False, env=env)
    assert done.returncode == 0, done.stderr
    scratch = tmp_path / "scratch"
    # each launch on a port of its own: the last one's store may still hold its port
    assert done.stdout.splitlines() == [f"as-is graphs=0 scratch={scratch}/as-is port=29500",
                                        f"static_graph graphs=0 scratch={scratch}/static_graph port=29501",
                                        f"cuda_graphs=on graphs=1 scratch={scratch}/cuda_graphs=on port=29502"]
    assert done.stderr.strip() == "clusterkit: DDP variant static_graph exited with 1"
    assert (tmp_path / "launches.tsv").read_text() == "as-is\t0\nstatic_graph\t1\ncuda_graphs=on\t0\n"
    assert bench_ddp.parse_launches((tmp_path / "launches.tsv").read_text()) == {
        "as-is": 0, "static_graph": 1, "cuda_graphs=on": 0}
    assert sorted(p.parent.parent.name for p in scratch.glob("*/checkpoint/ckpt")) == [
        "as-is", "cuda_graphs=on", "static_graph"]
    assert (tmp_path / "the-jobs-own" / "ckpt").read_text() == "a finished run"


def test_single_bench_launch_keeps_the_jobs_exit_status(tmp_path: Path) -> None:
    bench = {"scratch": str(tmp_path / "scratch"), "launches": str(tmp_path / "launches.tsv")}
    single = render(make_settings(), extra={"ddp_variants": None, "bench": bench})
    script = bench_part(single, tmp_path)
    script.write_text(script.read_text().replace("CLUSTERKIT_DDP_VARIANT=as-is", "CLUSTERKIT_DDP_VARIANT=static_graph"))
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "MASTER_PORT": "29500"})
    assert done.returncode == 1  # the job fails as the launch did
    assert (tmp_path / "launches.tsv").read_text() == "as-is\t1\n"
    assert (tmp_path / "scratch" / "as-is" / "checkpoint" / "ckpt").exists()


def test_launches_file_lines() -> None:
    text = "as-is\t0\nbucket_cap_mb=1\t137\nbroken line\nstatic_graph\t1\nstatic_graph\t0\n"
    assert bench_ddp.parse_launches(text) == {"as-is": 0, "bucket_cap_mb=1": 137, "static_graph": 0}
    assert bench_ddp.bench_paths("/o/clusterkit-ddp-1") == {"scratch": "/o/clusterkit-ddp-1/scratch",
                                                           "launches": "/o/clusterkit-ddp-1/launches.tsv"}


def test_fetched_traces_keep_each_variants_problem(tmp_path: Path) -> None:
    """The job's folder read back as bench ddp does (find, cat): a cut-short trace fails its variant only."""
    from cluster_kit.analysis.report import SweepRun, build_report
    from cluster_kit.errors import CheckFailed
    from cluster_kit.slurm.runner import LocalRunner

    sweep = DATA / "gloo-sweep-loss"
    for rank in (0, 1):
        name = f"as-is.trace-rank{rank}@vm.json"
        (tmp_path / name).write_bytes(gzip.decompress((sweep / f"{name}.gz").read_bytes()))
    whole = gzip.decompress((sweep / "bucket_cap_mb=1.trace-rank0@vm.json.gz").read_bytes())
    (tmp_path / "bucket_cap_mb=1.trace-rank0@vm.json").write_bytes(whole[: len(whole) // 2])  # killed mid-write
    paths = bench_ddp.bench_paths(str(tmp_path))
    Path(paths["launches"]).write_text("as-is\t0\nbucket_cap_mb=1\t143\n")
    runner = LocalRunner()
    launches = bench_ddp.read_launches(runner, paths["launches"])
    traces, unreadable = bench_ddp.fetch_traces(runner, str(tmp_path), "5", launches)
    assert [t.variant for t in traces] == ["as-is", "as-is"]
    assert list(unreadable) == ["bucket_cap_mb=1"] and "bucket_cap_mb=1.trace-rank0@vm.json: not JSON" in \
        unreadable["bucket_cap_mb=1"]
    doc = build_report(traces, "5", run=SweepRun(["as-is", "bucket_cap_mb=1"], launches, unreadable))[0]
    failed = doc["sweep"][1]
    assert failed["variant"] == "bucket_cap_mb=1" and failed["step_ms"] is None and failed["exit_code"] == 143
    assert failed["error"].startswith("its launch exited with 143; ") and "not JSON" in failed["error"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckFailed, match=r"job 5 wrote no profiler traces into \S+/empty "
                                          r"\(launches: as-is exited 0, bucket_cap_mb=1 exited 143\)"):
        bench_ddp.fetch_traces(runner, str(empty), "5", launches)
    assert bench_ddp.read_launches(runner, str(empty / "launches.tsv")) == {}


def test_allreduce_json_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(InputError, match=r"--allreduce-json .*bad\.json: not JSON") as err:
        bench_ddp.read_allreduce_json(str(bad))
    assert "bench allreduce JOB.yaml --json" in (err.value.fix or "")
    bad.write_text('{"world_size": 4}')
    with pytest.raises(InputError, match='no "rows" list'):
        bench_ddp.read_allreduce_json(str(bad))
    with pytest.raises(InputError, match="cannot read it"):
        bench_ddp.read_allreduce_json(str(tmp_path / "missing.json"))


def run_cli(*args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(cli, list(args))
    return done.exit_code, done.stdout, done.stderr


def test_analyze_json_table_and_html(tmp_path: Path) -> None:
    code, out, _ = run_cli("analyze", str(DATA / "gloo-straggler"), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["straggler"]["rank"] == 2 and len(doc["ranks"]) == 4
    code, out, _ = run_cli("analyze", str(DATA / "gloo-straggler"))
    assert code == 0 and out.startswith("job -: 4 rank(s), 3 profiled step(s), CPU")
    assert re.search(r"^straggler: rank 2 \(vm\)", out, re.MULTILINE)
    page = tmp_path / "r.html"
    code, _, err = run_cli("analyze", str(DATA / "h200-eager"), "--format", "html", "-o", str(page))
    assert code == 0 and f"wrote {page}" in err
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.parametrize("args, expected", [
    (["analyze", "/nonexistent/traces"], r"clusterkit: error: /nonexistent/traces: no such folder"),
    (["analyze", str(DATA / "gloo-straggler"), "--json", "--format", "html"], r"--json and --format html disagree"),
])
def test_analyze_bad_input_exits_2(args: list[str], expected: str) -> None:
    code, _, err = run_cli(*args)
    assert code == 2 and re.search(expected, err), err
    assert "Traceback" not in err


def test_analyze_of_a_non_trace_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "trace-rank0.json").write_text('{"not": "a trace"}')
    code, _, err = run_cli("analyze", str(tmp_path))
    assert code == 2
    assert err.splitlines()[0] == f"clusterkit: error: {tmp_path}/trace-rank0.json: no traceEvents list: " \
                                  "not a PyTorch profiler trace"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_html_timeline_renders_in_chromium(tmp_path: Path) -> None:
    page = tmp_path / "step.html"
    assert run_cli("analyze", str(DATA / "gloo-straggler"), "--format", "html", "-o", str(page))[0] == 0
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(argv + ["--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert dom.count('<g data-rank="') == 4
    assert 'class="compute"' in dom and 'class="exposed_comm"' in dom
    assert "rank 2 (vm) computes" in dom
    shot = tmp_path / "step.png"
    subprocess.run(argv + [f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()],
                   capture_output=True, text=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
