"""Pure helpers of the job commands: the cancel hint printed on Ctrl-C, `submit --json`."""
from __future__ import annotations

from pathlib import Path

from cluster_kit.commands.jobs import cancel_hint
from cluster_kit.config.load import load_job
from cluster_kit.config.search import SearchPath
from cluster_kit.fleet import routing
from cluster_kit.report.jobs import submit_document


def job_with(tmp_path: Path, profile: str) -> object:
    (tmp_path / "far.yaml").write_text(profile)
    (tmp_path / "job.yaml").write_text("profile: ./far.yaml\nscript: train.py\nnodes: 1\n")
    return load_job(tmp_path / "job.yaml", SearchPath.from_environment([], environ={}, cwd=tmp_path))


def test_cancel_hint_names_the_profile_only_when_slurm_runs_on_a_login_host(tmp_path: Path) -> None:
    local = job_with(tmp_path, "slurm: {partition: debug}\n")
    assert cancel_hint(local, "42") == "clusterkit cancel 42"
    remote = job_with(tmp_path, "login: {host: login01}\nslurm: {partition: debug}\n")
    assert cancel_hint(remote, "42") == f"clusterkit cancel 42 --profile {(tmp_path / 'far.yaml').resolve()}"


def test_submit_document_has_the_spec_keys() -> None:
    route = routing.Route({"gpu017": ["rdma.port_state"]}, ["gpu017"], 63, None)
    doc = submit_document("123", route, {"profile": "p", "nodes": [], "summary": {}})
    assert doc == {"job_id": "123", "excluded": {"gpu017": ["rdma.port_state"]},
                   "preflight": {"profile": "p", "nodes": [], "summary": {}}}
    assert submit_document("7", None, None) == {"job_id": "7", "excluded": {}, "preflight": None}
