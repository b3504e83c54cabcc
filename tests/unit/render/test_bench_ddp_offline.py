"""`bench ddp` pieces without a cluster, and `clusterkit analyze` on recorded traces."""
from __future__ import annotations

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


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_sweep_script_runs_the_launch_once_per_variant(launcher: str, tmp_path: Path) -> None:
    settings = make_settings(launcher=launcher)
    plain = render(settings)
    swept = render(settings, extra={"ddp_variants": ["as-is", "bucket_cap_mb=1", "cuda_graphs=on"]})
    assert "clusterkit_launch" not in plain and "CLUSTERKIT_DDP_VARIANT" not in plain
    assert "for CLUSTERKIT_DDP_VARIANT in as-is bucket_cap_mb=1 cuda_graphs=on; do" in swept
    assert swept.count("clusterkit_launch") == 2  # defined once, called once per variant
    assert_shell_clean(swept, tmp_path)


def test_sweep_loop_goes_on_after_a_failing_variant(tmp_path: Path) -> None:
    """The loop of the rendered script, run by bash with a stand-in launch."""
    swept = render(make_settings(), extra={"ddp_variants": ["as-is", "static_graph", "cuda_graphs=on"]})
    loop = swept[swept.index('graphs_as_job='):]
    script = tmp_path / "loop.sh"
    script.write_text("set -euo pipefail\nclusterkit_launch() {\n  echo \"$CLUSTERKIT_DDP_VARIANT "
                      "graphs=$CLUSTERKIT_CUDA_GRAPHS\"\n  [ \"$CLUSTERKIT_DDP_VARIANT\" != static_graph ]\n}\n"
                      + loop)
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "CLUSTERKIT_CUDA_GRAPHS": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["as-is graphs=0", "static_graph graphs=0", "cuda_graphs=on graphs=1"]
    assert done.stderr.strip() == "clusterkit: DDP variant static_graph exited with 1"


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
