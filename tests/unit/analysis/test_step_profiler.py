"""cluster_kit.ddp.StepProfiler and build_step's own profiling, on CPU torch."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cluster_kit import ddp
from cluster_kit.analysis.report import build_report
from cluster_kit.analysis.traces import load_folder


def train(steps: int, step_fn: object = None, profiler: object = None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    step = ddp.build_step(model, opt, torch.nn.functional.mse_loss, (x, y), enabled=False)
    for _ in range(steps):
        step(x, y)
        if profiler is not None:
            profiler.step()  # type: ignore[attr-defined]


def test_nothing_is_recorded_when_the_variable_is_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ddp.PROFILE_STEPS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with ddp.StepProfiler(out_dir=str(tmp_path)) as prof:
        assert not prof.enabled
        train(6, profiler=prof)
    assert prof.path is None and list(tmp_path.iterdir()) == []


def test_a_bounded_window_is_written_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # build_step's own profiler, if it started, would write here
    monkeypatch.setenv(ddp.PROFILE_STEPS_ENV, "3")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("SLURMD_NODENAME", "n9")
    monkeypatch.delenv(ddp.VARIANT_ENV, raising=False)
    with ddp.StepProfiler(out_dir=str(tmp_path)) as prof:
        train(20, profiler=prof)  # far more steps than wait + warm-up + 3
    assert [p.name for p in tmp_path.iterdir()] == ["trace-rank5@n9.json"]
    trace = load_folder(tmp_path)[0]
    steps = sorted(e.name for e in trace.events if e.name.startswith("ProfilerStep#"))
    # wait=2 and warmup=1 skip steps 0..2; steps 3..5 are recorded and nothing after.
    assert steps == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    assert (trace.rank, trace.host) == (5, "n9")


def test_build_step_profiles_by_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ddp.PROFILE_STEPS_ENV, "2")
    monkeypatch.setenv(ddp.PROFILE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(ddp.VARIANT_ENV, "bucket_cap_mb=5")
    monkeypatch.setenv("RANK", "0")
    train(8)
    traces = load_folder(tmp_path)
    assert [t.variant for t in traces] == ["bucket_cap_mb=5"]
    doc = build_report(traces)[0]
    assert doc["steps"] == 2 and doc["ranks"][0]["compute_ms"] > 0


def test_a_short_run_still_writes_what_it_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    with ddp.StepProfiler(steps=10, out_dir=str(tmp_path)) as prof:
        train(5, profiler=prof)  # 2 waited, 1 warm-up, 2 of 10 recorded
    names = {e.name for e in load_folder(tmp_path)[0].events if e.name.startswith("ProfilerStep#")}
    assert {"ProfilerStep#3", "ProfilerStep#4"} <= names


def test_profile_steps_and_variant_kwargs() -> None:
    assert ddp.profile_steps({}) == 0
    assert ddp.profile_steps({ddp.PROFILE_STEPS_ENV: " 20 "}) == 20
    assert ddp.profile_steps({ddp.PROFILE_STEPS_ENV: "999999"}) == ddp.MAX_PROFILE_STEPS
    with pytest.raises(ValueError, match="CLUSTERKIT_PROFILE_STEPS='lots' is not a number"):
        ddp.profile_steps({ddp.PROFILE_STEPS_ENV: "lots"})
    env = {ddp.VARIANT_ENV: "bucket_cap_mb=1,gradient_as_bucket_view,static_graph=false"}
    assert ddp.variant_kwargs(env) == {"bucket_cap_mb": 1, "gradient_as_bucket_view": True, "static_graph": False}
    assert ddp.variant_kwargs({ddp.VARIANT_ENV: "as-is"}) == {}
    assert ddp.variant_kwargs({ddp.VARIANT_ENV: "cuda_graphs=on"}) == {}


@pytest.mark.parametrize(("variant", "says"), [
    ("static_grpah", "unknown variant 'static_grpah'; valid: as-is, bucket_cap_mb=N"),
    ("bucket_cap_mb=big", "'bucket_cap_mb=big': bucket_cap_mb takes a number of MiB"),
])
def test_an_unknown_variant_word_is_refused_with_the_valid_ones(variant: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        ddp.variant_kwargs({ddp.VARIANT_ENV: variant})
