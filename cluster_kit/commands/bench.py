"""Benchmarks that run as Slurm jobs: bench allreduce (and --find-slow), and bench ddp (from commands/ddp.py)."""
from __future__ import annotations

import json
from typing import Any

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
@click.option("--find-slow", is_flag=True,
              help="Narrow a slow all-reduce down to its node(s): halving, then pairwise runs.")
@set_option
@pass_app
def bench_allreduce(app: App, job_file: str, max_bytes: str | None, as_json: bool, find_slow: bool,
                    sets: tuple[str, ...]) -> None:
    """Submit an all-reduce bandwidth sweep with JOB_FILE's resources; report algbw/busbw."""
    if find_slow:
        find_slow_nodes(app, job_file, max_bytes, as_json, sets)
        return
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


def run_sweep(app: App, job: Any, max_bytes: str | None, nodes: list[str] | None) -> tuple[float | None, str, str]:
    """(large-message busbw or None when the run failed, job id, the nodes it ran on) of one sweep."""
    from cluster_kit import lifecycle
    from cluster_kit.render.sweep import render_allreduce
    from cluster_kit.report import allreduce as allreduce_report
    from cluster_kit.slurm import jobs

    runner = app.runner(job.profile.data)
    job_id = sbatch_job(app, job, render_allreduce(app, job, max_bytes, nodes))
    result = lifecycle.wait(runner, job_id, on_status=state_reporter(job_id))
    ran_on = jobs.job_status(runner, job_id).nodes
    _, doc, _ = allreduce_report.summarise(allreduce_report.parse_sweep_log(jobs.read_output(runner, job_id, 0)), None)
    busbw = doc.get("large_message_busbw_gbps") if not result.exit_status and doc.get("checks_ok") else None
    return busbw, job_id, ran_on


def find_slow_nodes(app: App, job_file: str, max_bytes: str | None, as_json: bool,
                    sets: tuple[str, ...] = ()) -> None:
    """bench allreduce --find-slow: one run on the job's nodes, then halving and pairwise runs."""
    from cluster_kit.analysis.find_slow import narrow
    from cluster_kit.hostlist import expand
    from cluster_kit.report.allreduce import format_find_slow

    job = app.job(job_file, parse_sets(sets))
    expect = (job.profile.data.get("expect") or {}).get("allreduce_busbw_gbps")
    first_busbw, first_id, ran_on = run_sweep(app, job, max_bytes, None)
    if first_busbw is None:
        raise CheckFailed(f"the first all-reduce run (job {first_id}, all the job's nodes) failed: "
                          "there is no speed to narrow down", fix=f"read its log: clusterkit logs {first_id}")
    nodes = expand(ran_on) if ran_on else []
    if len(nodes) < 2:
        raise CheckFailed(f"the first all-reduce run (job {first_id}) ran on {ran_on or 'no node'}: "
                          "nothing to narrow down", fix="give the job file nodes: 3 or more")
    job_ids: list[str] = []

    def measure(group: list[str]) -> float | None:
        busbw: float | None = first_busbw
        if group == nodes and not job_ids:
            job_ids.append(first_id)
        else:
            busbw, job_id, _ = run_sweep(app, job, max_bytes, group)
            job_ids.append(job_id)
        click.echo(f"run {len(job_ids)}: {','.join(group)}: "
                   f"{'failed' if busbw is None else f'{busbw:.2f} GB/s'} (job {job_ids[-1]})", err=True)
        return busbw

    found = narrow(nodes, measure, expect)
    text, doc = format_find_slow(found, job_ids)
    click.echo(json.dumps(doc, indent=2) if as_json else text)
    if found.culprits:
        raise CheckFailed(f"slow all-reduce: {', '.join(found.culprits)}",
                          fix=f"check them: clusterkit preflight --deep --nodes {','.join(found.culprits)}")
