"""Commands about jobs: submit, status, cancel, logs, diagnose."""
from __future__ import annotations

import functools
import json
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from cluster_kit.app import App, pass_app
from cluster_kit.commands.options import (
    parse_sets,
    profile_option,
    progress,
    set_option,
)
from cluster_kit.errors import exit_with

if TYPE_CHECKING:
    from cluster_kit.config.documents import Job
    from cluster_kit.config.effective import Effective

# Directories and unreadable files pass click, so that the loader names them with the fix.
JOB_FILE = click.Path(exists=True, readable=False)


def check_job_id(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """A JOB_ID argument as Slurm writes it; a usage error (exit 2) otherwise."""
    from cluster_kit.slurm import builders as slurm

    try:
        return slurm.check_job_id(value)
    except ValueError as exc:
        raise click.BadParameter(f"{exc}; use the id sbatch printed, e.g. 1234 (1234_5 for an array task)")


job_id_arg = click.argument("job_id", callback=check_job_id)


def job_runner(app: App, profile_ref: str | None, job_id: str) -> Any:
    """The runner of `--profile` (its login host); else of the profile the job's
    record names; else a local one."""
    return app.job_runner(profile_ref, job_id)


login_profile_option = profile_option(
    required=False, help="Profile whose login host runs Slurm's commands (default: the one the job was submitted with).")


def job_output_dir(job: Any) -> str | None:
    """The folder of the job's `output` file (sbatch does not create it), if any."""
    from cluster_kit.lifecycle import output_dir

    return output_dir(job.data)


def sbatch_job(app: App, job: Job, script: str, settings: Effective | None = None) -> str:
    """Submit a script rendered from the job (a benchmark's, never supervised): its job id, with a record."""
    from cluster_kit import lifecycle
    from cluster_kit.config.effective import effective

    return lifecycle.submit(app.runner(job.profile.data), job, settings or effective(job, supervised=False), script)


def state_reporter(job_id: str) -> Any:
    """An on_status callback that says when the job's state or reason changes.

    Progress, so on stderr and only on a terminal. The reason tells the waiting
    user why a job pends; one that can never clear ends the wait (exit 3).
    """
    from cluster_kit.lifecycle import state_changes

    if not sys.stderr.isatty():
        return None
    return state_changes(lambda line: click.echo(line, err=True))


def cancel_hint(job: Any, job_id: str) -> str:
    """`clusterkit cancel N`, with the `--profile` that reaches the job's login host."""
    if not (job.profile.data.get("login") or {}).get("host"):
        return f"clusterkit cancel {job_id}"
    ref = str(job.data.get("profile") or job.profile.path)
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        ref = str(job.profile.path.resolve())
    return f"clusterkit cancel {job_id} --profile {shlex.quote(ref)}"


def interrupted(job_id: str, phase: str | None, hint: str) -> None:
    """Ctrl-C while following a job: say it is still there and how to stop it (exit 130)."""
    where = "still queued (PENDING)" if phase == "pending" else "still running"
    click.echo(f"job {job_id} is {where}; stop it with: {hint}", err=True)
    exit_with(130)


def follow_job(app: App, job: Any, job_id: str, wait: bool, doc: dict[str, Any] | None = None) -> None:
    """After sbatch: a job Slurm can never start is cancelled (exit 3); with
    --wait, follow it and exit with its exit code, saying how it ended (and
    printing `doc`, the --json document, with its end). Ctrl-C: exit 130."""
    from cluster_kit import lifecycle

    runner = app.runner(job.profile.data)
    hint = functools.partial(cancel_hint, job)
    try:
        lifecycle.refuse_never_start(runner, job_id)
    except KeyboardInterrupt:
        interrupted(job_id, None, hint(job_id))
    if not wait:
        return
    how = lifecycle.Following(launcher=job.data.get("launcher"))
    result = follow_to_the_end(job_id, lifecycle.follow(runner, job_id, how), hint)
    click.echo(result.explanation, err=True)
    if doc is not None:
        # job_id stays the submitted job's: a restarted job ends as another (its attempts say which)
        click.echo(json.dumps({**doc, **result.as_dict(), "job_id": doc["job_id"]}, indent=2))
    exit_with(result.exit_status or 0)


def follow_to_the_end(job_id: str, events: Iterator[Any], hint: Callable[[str], str]) -> Any:
    """Print a followed job's events as they come (state changes on a terminal, restarts,
    output); its outcome. Ctrl-C: say the job is still there and how to stop it (exit 130)."""
    from cluster_kit import lifecycle

    report = state_reporter(job_id)
    last: Any = None
    try:
        for event in events:
            if isinstance(event, lifecycle.Polled):
                last = event.status
                if report is not None:
                    report(event.status)
            elif isinstance(event, lifecycle.Restarted):
                say_restart(event.line)
            elif isinstance(event, lifecycle.Wrote):
                click.echo(event.text, nl=False)
            elif isinstance(event, lifecycle.Ended):
                return event.outcome
    except KeyboardInterrupt:
        current = last.job_id if last is not None else job_id  # a restart runs as a job of its own
        interrupted(current, last.phase if last is not None else None, hint(current))
    raise AssertionError("a followed job ends with Ended")


def say_restart(line: str) -> None:
    """A supervised job restarted: one line on stderr."""
    from cluster_kit.text import printable

    click.echo(f"clusterkit: {printable(line)}", err=True)


def sweep_axes(sweeps: tuple[str, ...]) -> dict[str, list[Any]]:
    """`--sweep KEY=V1,V2` options as {key: values}; a key given twice is a usage error."""
    from cluster_kit.config.overrides import parse_sweep

    axes: dict[str, list[Any]] = {}
    for text in sweeps:
        key, values = parse_sweep(text)
        if key in axes:
            raise click.UsageError(f"--sweep {key} is given twice; list all its values in one --sweep")
        axes[key] = values
    return axes


@click.command()
@click.argument("job_file", type=JOB_FILE)
@click.option("--dry-run", is_flag=True, help="Print the sbatch command and script; submit nothing.")
@click.option("--test-only", is_flag=True, help="Ask Slurm whether the job could run (sbatch --test-only).")
@click.option("--no-preflight", is_flag=True, help="Skip the SSH preflight of the job's candidate nodes.")
@click.option("--strict", is_flag=True,
              help="Refuse the job when any candidate node fails preflight (default: --exclude it).")
@click.option("--wait", is_flag=True, help="Wait for the job; exit with its exit code.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON document on stdout: job id, excluded nodes, preflight report "
                   "(with --wait: printed once the job ended, with its state and exit code).")
@set_option
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
              help="Run the job once per value (the product of several --sweep) as ONE array job; "
                   "each task gets its values as --set would, its own MASTER_PORT and output file. "
                   "Values holding commas: one YAML list, KEY='[\"a,b\", c]'.")
@click.option("--max-parallel", type=click.IntRange(min=1), metavar="N",
              help="With --sweep: at most N array tasks at a time (--array=0-K%N).")
@click.option("--after", "after", multiple=True, metavar="JOBID[:ok|any|notok]",
              help="Start once job JOBID ended: ok (default) when it completed, any however it ended, "
                   "notok when it failed (sbatch --dependency).")
@pass_app
def submit(app: App, job_file: str, dry_run: bool, test_only: bool, no_preflight: bool,
           strict: bool, wait: bool, as_json: bool, sets: tuple[str, ...], sweeps: tuple[str, ...],
           max_parallel: int | None, after: tuple[str, ...]) -> None:
    """Preflight the job's nodes, render and sbatch JOB_FILE; print the job id.

    Nodes failing preflight, and nodes Slurm could give the job that were not
    checked, are excluded while enough healthy ones remain.
    """
    from cluster_kit.config.overrides import sweep_points
    from cluster_kit.lifecycle import SubmitRequest, submit_job
    from cluster_kit.report import jobs as text
    from cluster_kit.slurm import jobs

    if as_json and dry_run:
        raise click.UsageError("--json and --dry-run do not mix: --dry-run prints the script")
    if max_parallel is not None and not sweeps:
        raise click.UsageError("--max-parallel limits the tasks of a --sweep; add --sweep")
    request = SubmitRequest(job_file, overrides=parse_sets(sets), preflight=not no_preflight, strict=strict,
                            dry_run=dry_run, test_only=test_only,
                            sweep=sweep_points(sweep_axes(sweeps)) if sweeps else (),
                            max_parallel=max_parallel, after=after)
    done = submit_job(app, request, notify=lambda line: click.echo(line, err=True), progress=progress)
    if dry_run:
        click.echo(f"# {shlex.join(jobs.sbatch_argv(test_only))} < script")
        click.echo(done.script, nl=False)
        return
    if not as_json:
        click.echo(done.test_only if test_only else done.job_id)
    job_id = done.job_id
    doc = text.submit_document(job_id, done.route, done.report, done.test_only, done) if as_json else None
    if doc is not None and not (wait and job_id):
        click.echo(json.dumps(doc, indent=2))
    if job_id:
        follow_job(app, done.job, job_id, wait, doc if wait else None)


@click.command()
@job_id_arg
@login_profile_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_app
def status(app: App, job_id: str, profile_ref: str | None, as_json: bool) -> None:
    """The job's state (squeue, then scontrol or sacct once it ended, then
    clusterkit's record once Slurm forgot it); how it ended."""
    from cluster_kit import lifecycle
    from cluster_kit.lifecycle import chains
    from cluster_kit.report import jobs as text

    runner = job_runner(app, profile_ref, job_id)
    seen = lifecycle.look(runner, job_id)
    info, chain = seen.status, seen.chain
    result = lifecycle.job_outcome(runner, info, launcher_of(seen)) if info.finished else None
    sweep = sweep_values(runner, job_id)
    if as_json:
        doc = text.status_document(info, result, chain, chains.attempt_summaries(chain) if chain else ())
        click.echo(json.dumps(text.with_sweep(doc, sweep), indent=2))
        return
    click.echo(text.status_table(info, sweep))
    if info.source == "record":
        click.echo(f"Slurm no longer knows job {job_id}; shown from clusterkit's record", err=True)
    if result is not None:
        click.echo(result.explanation)
    if chain is not None:
        click.echo("\n".join(text.chain_lines(chain, chains.progress(chain))))


def launcher_of(seen: Any) -> str:
    """How the job launched its ranks (its record's `launcher`; srun when unknown)."""
    return seen.record.launcher if seen.record is not None else "srun"


def sweep_values(runner: Any, job_id: str) -> dict[str, dict[str, Any]]:
    """{array index: {dotted key: value}} of a sweep's array job, from its record ({} for any other job)."""
    from cluster_kit.lifecycle import records, where_key

    record = records.find(job_id, where_key(runner))
    return {str(index): dict(values) for index, values in enumerate(record.sweep)} if record else {}


RECENT_S = 24 * 3600  # `jobs` without --all: jobs not known to have ended, and those of the last day


def record_state(app: App, record: Any) -> str:
    """How the record's job stands: how it ended as last seen, else Slurm's state now
    (UNKNOWN when neither Slurm nor the record says)."""
    from cluster_kit import lifecycle
    from cluster_kit.errors import ClusterKitError
    from cluster_kit.lifecycle import FORGOTTEN

    if record.ended:
        return str(record.ended.get("state") or FORGOTTEN)
    try:
        runner = app.runner(app.profile(record.profile).data if record.where != "local" and record.profile else {})
        return str(lifecycle.status_or_record(runner, record.job_id).state)
    except ClusterKitError:
        return FORGOTTEN


@click.command("jobs")
@click.option("--all", "show_all", is_flag=True,
              help="Every job record (default: jobs not known to have ended, and those submitted in the last day).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout: each job with its record.")
@pass_app
def jobs_command(app: App, show_all: bool, as_json: bool) -> None:
    """The jobs clusterkit submitted (its job records), newest first, with their state."""
    import dataclasses
    import datetime

    from cluster_kit.errors import printable
    from cluster_kit.lifecycle import records
    from cluster_kit.text import format_table

    now = time.time()
    found = [r for r in records.all_records()
             if show_all or not r.ended or now - r.submitted_at < RECENT_S]
    states = [record_state(app, record) for record in found]
    if as_json:
        folder = records.records_dir()
        docs = [{**dataclasses.asdict(r), "state": state, "record": str(records.record_path(r.job_id, r.where, folder))}
                for r, state in zip(found, states)]
        click.echo(json.dumps({"jobs": docs}, indent=2))
        return
    rows = []
    for record, state in zip(found, states):
        when = datetime.datetime.fromtimestamp(record.submitted_at).strftime("%Y-%m-%d %H:%M")
        what = f"array {record.array}: {len(record.sweep)} tasks" if record.sweep else ""
        if record.dependency:
            what = f"{what}, after {record.dependency}".lstrip(", ")
        rows.append([record.job_id, printable(record.name, keep_newlines=False), state, when, record.where,
                     printable(what, keep_newlines=False) or "-"])
    click.echo(format_table(["JOB", "NAME", "STATE", "SUBMITTED", "WHERE", "NOTE"], rows))


@click.command()
@click.argument("job_ids", nargs=-1, required=True, callback=lambda ctx, param, values: [
    check_job_id(ctx, param, value) for value in values])
@login_profile_option
@pass_app
def cancel(app: App, job_ids: list[str], profile_ref: str | None) -> None:
    """Cancel one or more jobs (scancel); a job of a supervised chain cancels the chain."""
    from cluster_kit import lifecycle

    for job_id in job_ids:
        for cancelled_id, cancelled, role in lifecycle.cancel(job_runner(app, profile_ref, job_id), job_id):
            chain = {"chain": f" (the chain of job {job_id} ran as it)",
                     "standby": f" (the standby job of job {job_id}'s chain)"}.get(role, "")
            if cancelled:
                click.echo(f"cancelled {cancelled_id}{chain}")
            elif not role or role == "chain":
                click.echo(f"job {cancelled_id} had already ended")


@click.command()
@job_id_arg
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing until the job ends; then say how it ended and exit with its exit code.")
@login_profile_option
@pass_app
def logs(app: App, job_id: str, follow: bool, profile_ref: str | None) -> None:
    """Print the job's output file (every task's, for an array job; every attempt's,
    for a job with `resilience:`)."""
    from cluster_kit import lifecycle

    runner = job_runner(app, profile_ref, job_id)
    seen = lifecycle.look(runner, job_id)
    output = lifecycle.Output(runner, job_id)
    text = seen.read(output)
    click.echo(text, nl=False)
    if not text and seen.chain is None and seen.status.phase == "pending":
        click.echo(f"{lifecycle.explain_status(seen.status)}: no output yet", err=True)
    elif not text and seen.chain is None and seen.status.finished and not follow:
        click.echo(f"{lifecycle.explain_status(seen.status)}: it wrote no output", err=True)
    if not follow:
        return
    how = lifecycle.Following(poll=1.0, launcher=launcher_of(seen), output=output, cancel_never_start=False)
    result = follow_to_the_end(job_id, lifecycle.follow(runner, job_id, how), lambda current: f"clusterkit cancel {current}")
    if result.state != lifecycle.FORGOTTEN:
        click.echo(result.explanation, err=True)
    # A job someone cancelled was stopped on purpose: only a failure is an error.
    exit_with(0 if result.state == "CANCELLED" else result.exit_status or 0)


@click.command()
@job_id_arg
@login_profile_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_app
def diagnose(app: App, job_id: str, profile_ref: str | None, as_json: bool) -> None:
    """How the job ended (or that it runs), who is to blame, and what to do next;
    every attempt, for a job with `resilience:`."""
    from cluster_kit.lifecycle import records
    from cluster_kit.lifecycle.diagnosis import diagnose as build
    from cluster_kit.report.jobs import diagnosis_lines
    from cluster_kit.text import printable

    record = records.find(job_id)
    doc = build(job_runner(app, profile_ref, job_id), job_id, record.launcher if record else "srun")
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for line in diagnosis_lines(doc):
        click.echo(printable(line))
