"""`cuda_graphs:` in job files: `true` as before, or `{compile: ...}`; every refusal as
FILE:LINE with the fix, the effective settings, and what `clusterkit render` exports."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cluster_kit.cli import cli
from cluster_kit.config.effective import effective
from cluster_kit.config.load import load_job, validate_files
from cluster_kit.config.search import SearchPath
from cluster_kit.trainer import compile_options

NESTED = "records CUDA graphs of its own, which cannot be recorded inside build_step's graph of the whole step"


@pytest.fixture
def search(tmp_path: Path) -> SearchPath:
    return SearchPath.from_environment([], environ={}, cwd=tmp_path, home=tmp_path)


def job_file(tmp_path: Path, text: str) -> Path:
    """A job file (profile, script: lines 1-2, then `text` from line 3) and its profile."""
    (tmp_path / "p.yaml").write_text("slurm: {partition: gpu}\n")
    path = tmp_path / "job.yaml"
    path.write_text("profile: ./p.yaml\nscript: /bin/true\n" + text)
    return path


def settings(tmp_path: Path, search: SearchPath, text: str) -> dict[str, Any]:
    return dict(effective(load_job(job_file(tmp_path, text), search)))


def exports(tmp_path: Path, text: str) -> list[str]:
    """The CLUSTERKIT_CUDA_GRAPHS* lines of `clusterkit render`."""
    result = CliRunner().invoke(cli, ["render", str(job_file(tmp_path, text))])
    assert result.exit_code == 0, result.output
    return [line for line in result.output.splitlines() if line.startswith("export CLUSTERKIT_CUDA_GRAPHS")]


@pytest.mark.parametrize(("text", "graphs", "compiled"), [
    ("", False, None),
    ("cuda_graphs: false\n", False, None),
    ("cuda_graphs: true\n", True, None),
    ("cuda_graphs: {}\n", True, None),
    ("cuda_graphs: {compile: false}\n", True, None),
    ("cuda_graphs: {compile: true}\n", True, "1"),
    ("cuda_graphs:\n  compile: max-autotune-no-cudagraphs\n", True, "max-autotune-no-cudagraphs"),
    ("cuda_graphs:\n  compile:\n    fullgraph: true\n", True, '{"fullgraph":true}'),
    ("cuda_graphs:\n  compile: {mode: default}\n", True, "1"),
])
def test_effective_settings_and_exports(tmp_path: Path, search: SearchPath, text: str, graphs: bool,
                                        compiled: str | None) -> None:
    got = settings(tmp_path, search, text)
    assert (got["cuda_graphs"], got["cuda_graphs_compile"]) == (graphs, compiled)
    want = ["export CLUSTERKIT_CUDA_GRAPHS=1"] if graphs else []
    if compiled:
        want.append(f"export CLUSTERKIT_CUDA_GRAPHS_COMPILE={compiled!r}" if "{" in compiled
                    else f"export CLUSTERKIT_CUDA_GRAPHS_COMPILE={compiled}")
    assert exports(tmp_path, text) == want


@pytest.mark.parametrize(("text", "line", "message"), [
    ("cuda_graphs: maybe\n", 3,
     "cuda_graphs: expected true, false or a mapping such as {compile: true}, got a string ('maybe')"),
    ("cuda_graphs: {compile: reduce-overhead}\n", 3,
     (f"cuda_graphs.compile: mode 'reduce-overhead' {NESTED}; use 'max-autotune-no-cudagraphs' "
     "(Inductor's autotuned kernels without its CUDA graphs) or 'default'")),
    ("cuda_graphs:\n  compile:\n    mode: max-autotune\n", 5,
     (f"cuda_graphs.compile.mode: mode 'max-autotune' {NESTED}; use 'max-autotune-no-cudagraphs' "
     "(Inductor's autotuned kernels without its CUDA graphs) or 'default'")),
    ("cuda_graphs:\n  compile:\n    options:\n      triton.cudagraphs: true\n", 6,
     f"cuda_graphs.compile.options.triton.cudagraphs: triton.cudagraphs {NESTED}; leave it out"),
    ("cuda_graphs:\n  compile:\n    fulgraph: true\n", 5,
     ("unknown key 'fulgraph' in cuda_graphs.compile; did you mean 'fullgraph'? valid keys: mode, fullgraph, "
     "dynamic, options")),
    ("cuda_graphs:\n  compile: 3\n", 4,
     ("cuda_graphs.compile: expected true, false, one of default | max-autotune-no-cudagraphs or a mapping "
     "(mode, fullgraph, dynamic, options), got an integer (3)")),
    ("cuda_graphs:\n  compile:\n    mode: default\n    options: {max_autotune: true}\n", 6,
     ("cuda_graphs.compile.options: torch.compile takes mode or options, not both; move the mode's settings "
     "into options (e.g. max_autotune: true) or drop options")),
])
def test_refusals_name_the_line_and_the_fix(tmp_path: Path, search: SearchPath, text: str, line: int,
                                            message: str) -> None:
    path = job_file(tmp_path, text)
    assert validate_files([path], search) == [f"{path}:{line}: {message}"]


@pytest.mark.parametrize("value", [True, "default", "max-autotune-no-cudagraphs", {},
                                   {"fullgraph": True, "dynamic": False},
                                   {"options": {"coordinate_descent_tuning": True, "triton.max_tiles": 2}}])
def test_what_build_step_takes_goes_through_the_environment_unchanged(value: Any) -> None:
    options = compile_options.compile_options(value)
    exported = compile_options.env_value(options)
    assert exported is not None
    assert compile_options.options_from_env({compile_options.ENV_COMPILE: exported}) == options


@pytest.mark.parametrize(("value", "fragment"), [
    ("reduce-overhead", "use 'max-autotune-no-cudagraphs'"),
    ({"mode": "max-autotune"}, "mode: mode 'max-autotune' records CUDA graphs"),
    ({"options": {"triton.cudagraphs": True}}, "options.triton.cudagraphs: triton.cudagraphs records"),
    ({"mode": "default", "options": {"max_autotune": True}}, "give mode or options, not both"),
    ({"backend": "eager"}, "unknown key 'backend' (valid keys: mode, fullgraph, dynamic, options)"),
    ({"fullgraph": 1}, "fullgraph: expected True or False, got 1"),
    ({"options": ["x"]}, "options: expected a mapping of Inductor settings"),
    (1, "use True, False, 'default', 'max-autotune-no-cudagraphs' or a dict"),
])
def test_build_step_refuses_what_the_graph_cannot_hold(value: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match="compile") as caught:
        compile_options.compile_options(value)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(("text", "want"), [("", None), ("0", None), ("1", {}), ("default", {}),
                                            ('{"mode":"max-autotune-no-cudagraphs"}',
                                             {"mode": "max-autotune-no-cudagraphs"})])
def test_the_environment_variable_read_by_build_step(text: str, want: Any) -> None:
    assert compile_options.options_from_env({compile_options.ENV_COMPILE: text}) == want
    assert compile_options.options_from_env({}) is None


@pytest.mark.parametrize("text", ["reduce-overhead", "{not json", '{"mode": "max-autotune"}'])
def test_a_bad_environment_variable_names_itself_and_the_job_key(text: str) -> None:
    with pytest.raises(ValueError, match=r"CLUSTERKIT_CUDA_GRAPHS_COMPILE=.*cuda_graphs: \{compile: \.\.\.\}"):
        compile_options.options_from_env({compile_options.ENV_COMPILE: text})
