"""Benchmarks that run as Slurm jobs: bench allreduce, and bench ddp (from commands/ddp.py)."""
from __future__ import annotations

import json

import click

from cluster_kit.app import App, pass_app
from cluster_kit.commands.ddp import bench_ddp
from cluster_kit.commands.jobs import JOB_FILE, sbatch_job, state_reporter
from cluster_kit.commands.options import parse_sets, set_option
from cluster_kit.errors import CheckFailed


@click.group()
def bench() -> None:
    """Benchmarks that run as Slurm jobs."""


bench.add_command(bench_ddp)  # it lives beside `analyze`, which reads the same traces


@bench.command("allreduce")
@click.argument("job_file", type=JOB_FILE)
@click.option("--max-bytes", default=None, help="Largest message (e.g. 64M, 4G).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@set_option
@pass_app
def bench_allreduce(app: App, job_file: str, max_bytes: str | None, as_json: bool, sets: tuple[str, ...]) -> None:
    """Submit an all-reduce bandwidth sweep with JOB_FILE's resources; report algbw/busbw."""
    from cluster_kit import lifecycle
    from cluster_kit.render.sweep import render_allreduce
    from cluster_kit.report import allreduce as allreduce_report
    from cluster_kit.slurm import jobs

    job = app.job(job_file, parse_sets(sets))
    runner = app.runner(job.profile.data)
    job_id = sbatch_job(app, job, render_allreduce(app, job, max_bytes))
    click.echo(f"submitted all-reduce sweep as job {job_id}", err=True)
    result = lifecycle.wait(runner, job_id, on_status=state_reporter(job_id))
    log = jobs.read_output(runner, job_id, 0)
    expect = (job.profile.data.get("expect") or {}).get("allreduce_busbw_gbps")
    table, doc, passed = allreduce_report.summarise(allreduce_report.parse_sweep_log(log), expect)
    click.echo(json.dumps(doc, indent=2) if as_json else table)
    if result.exit_status or not passed:
        raise CheckFailed(f"all-reduce sweep: {result.explanation}" if result.exit_status
                          else f"all-reduce sweep job {job_id} busbw below {expect} GB/s",
                          fix=f"read the job's log: clusterkit logs {job_id}")
