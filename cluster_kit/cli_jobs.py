"""Commands about jobs: submit, status, cancel, logs, bench."""
from __future__ import annotations

import json
import posixpath
import shlex
import sys
import time
from typing import Any

import click

from cluster_kit.app import App, pass_app
from cluster_kit.cli_nodes import (
    profile_option,
    refuse_on_failure,
    run_preflight_for,
    select_nodes,
)
from cluster_kit.errors import CheckFailed, exit_with

JOB_FILE = click.Path(exists=True, dir_okay=False)


def check_job_id(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """A JOB_ID argument as Slurm writes it; a usage error (exit 2) otherwise."""
    from cluster_kit import slurm

    try:
        return slurm.check_job_id(value)
    except ValueError as exc:
        raise click.BadParameter(f"{exc}; use the id sbatch printed, e.g. 1234 (1234_5 for an array task)")


job_id_arg = click.argument("job_id", callback=check_job_id)


def job_runner(app: App, profile_ref: str | None) -> Any:
    """The runner of `--profile` (its login host), or a local one."""
    if not profile_ref:
        return app.runner({})
    return app.runner(app.profile(profile_ref).data)


login_profile_option = profile_option(required=False, help="Profile whose login host runs Slurm's commands.")


def job_output_dir(job: Any) -> str | None:
    """The folder of the job's `output` file (sbatch does not create it), if any."""
    output = job.data.get("output") or ""
    folder = posixpath.dirname(output)
    if not folder or "%" in folder:
        return None
    workdir = job.data.get("workdir")
    return posixpath.join(workdir, folder) if workdir else folder


def submit_script(app: App, job: Any, script: str, test_only: bool, dry_run: bool) -> str | None:
    """sbatch the script (or print what would run); the job id, None otherwise."""
    from cluster_kit import slurm_runner

    if dry_run:
        click.echo(f"# {shlex.join(slurm_runner.sbatch_argv(test_only))} < script")
        click.echo(script, nl=False)
        return None
    result = sbatch_job(app, job, script, test_only)
    click.echo(result)
    return None if test_only else result


def sbatch_job(app: App, job: Any, script: str, test_only: bool = False) -> str:
    """Make the output folder, then sbatch: the job id (or Slurm's test-only verdict)."""
    from cluster_kit import slurm_runner

    runner = app.runner(job.profile.data)
    output_dir = job_output_dir(job)
    if output_dir and not test_only:
        runner.run(["mkdir", "-p", output_dir])
    return slurm_runner.submit(runner, script, test_only=test_only)


def state_reporter(job_id: str) -> Any:
    """An on_status callback that says when the job's state or reason changes.

    Progress, so on stderr and only on a terminal. A job Slurm cannot start as
    asked (PartitionNodeLimit, say) stays PENDING forever; the reason tells the
    waiting user why.
    """
    if not sys.stderr.isatty():
        return None
    last: list[tuple[str, str]] = []

    def report(status: Any) -> None:
        now = (status.state, status.reason)
        if not last or last[-1] != now:
            last.append(now)
            reason = f" ({status.reason})" if status.reason and status.reason != "None" else ""
            click.echo(f"job {job_id}: {status.state}{reason}", err=True)

    return report


@click.command()
@click.argument("job_file", type=JOB_FILE)
@click.option("--dry-run", is_flag=True, help="Print the sbatch command and script; submit nothing.")
@click.option("--test-only", is_flag=True, help="Ask Slurm whether the job could run (sbatch --test-only).")
@click.option("--no-preflight", is_flag=True, help="Skip the SSH preflight of the profile's nodes.")
@click.option("--wait", is_flag=True, help="Wait for the job; exit with its exit code.")
@pass_app
def submit(app: App, job_file: str, dry_run: bool, test_only: bool, no_preflight: bool, wait: bool) -> None:
    """Preflight, render and sbatch JOB_FILE; print the job id."""
    from cluster_kit import slurm_runner
    from cluster_kit.config import effective
    from cluster_kit.render import render_job

    job = app.job(job_file)
    script = render_job(effective(job), app.search.template_dirs())
    if not (dry_run or no_preflight):
        nodes = select_nodes(app, job.profile, None)
        report, _facts = run_preflight_for(app, job.profile, nodes, deep=False)
        refuse_on_failure(report)
    job_id = submit_script(app, job, script, test_only, dry_run)
    if wait and job_id:
        code = slurm_runner.wait(app.runner(job.profile.data), job_id, on_status=state_reporter(job_id))
        click.echo(f"job {job_id} finished with exit code {code}", err=True)
        exit_with(code)


@click.command()
@job_id_arg
@login_profile_option
@pass_app
def status(app: App, job_id: str, profile_ref: str | None) -> None:
    """The job's state (squeue, then sacct or scontrol once it ended)."""
    from cluster_kit import slurm_runner
    from cluster_kit.report import format_table

    info = slurm_runner.job_status(job_runner(app, profile_ref), job_id)
    click.echo(format_table(["FIELD", "VALUE"], [[k, str(v)] for k, v in info.items()]))


@click.command()
@job_id_arg
@login_profile_option
@pass_app
def cancel(app: App, job_id: str, profile_ref: str | None) -> None:
    """Cancel the job (scancel)."""
    from cluster_kit import slurm_runner

    slurm_runner.cancel(job_runner(app, profile_ref), job_id)
    click.echo(f"cancelled {job_id}")


def echo_output(runner: Any, job_id: str, offset: int) -> int:
    """Print the job's output from byte `offset` on; the offset after it."""
    from cluster_kit import slurm_runner

    chunk = slurm_runner.read_output(runner, job_id, offset)
    click.echo(chunk, nl=False)
    return offset + len(chunk.encode())


@click.command()
@job_id_arg
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@login_profile_option
@pass_app
def logs(app: App, job_id: str, follow: bool, profile_ref: str | None) -> None:
    """Print the job's output file."""
    from cluster_kit import slurm_runner

    runner = job_runner(app, profile_ref)
    offset = echo_output(runner, job_id, 0)
    if not follow:
        return
    while not slurm_runner.is_finished(runner, job_id):
        time.sleep(1.0)
        offset = echo_output(runner, job_id, offset)
    echo_output(runner, job_id, offset)  # what the job wrote while it ended


@click.group()
def bench() -> None:
    """Benchmarks that run as Slurm jobs."""


@bench.command("allreduce")
@click.argument("job_file", type=JOB_FILE)
@click.option("--max-bytes", default=None, help="Largest message (e.g. 64M, 4G).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_app
def bench_allreduce(app: App, job_file: str, max_bytes: str | None, as_json: bool) -> None:
    """Submit an all-reduce bandwidth sweep with JOB_FILE's resources; report algbw/busbw."""
    from cluster_kit import allreduce_report, slurm_runner
    from cluster_kit.bench import render_allreduce

    job = app.job(job_file)
    runner = app.runner(job.profile.data)
    job_id = sbatch_job(app, job, render_allreduce(app, job, max_bytes))
    click.echo(f"submitted all-reduce sweep as job {job_id}", err=True)
    code = slurm_runner.wait(runner, job_id, on_status=state_reporter(job_id))
    log = slurm_runner.read_output(runner, job_id, 0)
    expect = (job.profile.data.get("expect") or {}).get("allreduce_busbw_gbps")
    table, doc, passed = allreduce_report.summarise(allreduce_report.parse_sweep_log(log), expect)
    click.echo(json.dumps(doc, indent=2) if as_json else table)
    if code != 0 or not passed:
        raise CheckFailed(f"all-reduce sweep job {job_id} " +
                          (f"exited with {code}" if code else f"busbw below {expect} GB/s"),
                          fix=f"read the job's log: clusterkit logs {job_id}")

