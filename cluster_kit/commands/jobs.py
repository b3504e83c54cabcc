"""Commands about jobs: submit, status, cancel, logs, diagnose."""
from __future__ import annotations

import json
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from cluster_kit.app import App, pass_app
from cluster_kit.commands.options import (
    parse_sets,
    profile_option,
    progress,
    set_option,
)
from cluster_kit.errors import ClusterRefused, exit_with

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


def job_runner(app: App, profile_ref: str | None, job_id: str | None = None) -> Any:
    """The runner of `--profile` (its login host); else of the profile the job's
    record names; else a local one."""
    if not profile_ref and job_id:
        from cluster_kit.lifecycle import records

        record = records.find(job_id)
        if record is not None and record.where != "local" and record.profile:
            profile_ref = record.profile
    if not profile_ref:
        return app.runner({})
    return app.runner(app.profile(profile_ref).data)


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
    seen: list[Any] = []
    report = state_reporter(job_id)

    def on_status(status: Any) -> None:
        seen.append(status)
        if report is not None:
            report(status)

    try:
        lifecycle.refuse_never_start(runner, job_id)
        if not wait:
            return
        result = lifecycle.wait(runner, job_id, on_status=on_status, launcher=job.data.get("launcher"),
                                on_restart=say_restart)
    except KeyboardInterrupt:
        current = seen[-1].job_id if seen else job_id  # a restart runs as a job of its own
        interrupted(current, seen[-1].phase if seen else None, cancel_hint(job, current))
        return
    click.echo(result.explanation, err=True)
    if doc is not None:
        # job_id stays the submitted job's: a restarted job ends as another (its attempts say which)
        click.echo(json.dumps({**doc, **result.as_dict(), "job_id": doc["job_id"]}, indent=2))
    exit_with(result.exit_status or 0)


def say_restart(line: str) -> None:
    """A supervised job restarted as a new job: one line on stderr."""
    from cluster_kit.text import printable

    click.echo(f"clusterkit: {printable(line)}", err=True)


def submit_document(job_id: str | None, route: Any, report: dict | None,
                    test_only: str | None = None, submitted: Any = None) -> dict[str, Any]:
    """`submit --json`: job id, the nodes routed around with their checks, the preflight;
    a sweep's array and each index's values; the dependency."""
    doc: dict[str, Any] = {"job_id": job_id, "excluded": dict(route.excluded) if route else {},
                           "preflight": report}
    if test_only is not None:
        doc["test_only"] = test_only
    if submitted is not None and submitted.array:
        doc["array"] = submitted.array
        doc["sweep"] = submitted.sweep_map()
    if submitted is not None and submitted.dependency:
        doc["dependency"] = submitted.dependency
    return doc


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
    doc = submit_document(job_id, done.route, done.report, done.test_only, done) if as_json else None
    if doc is not None and not (wait and job_id):
        click.echo(json.dumps(doc, indent=2))
    if job_id:
        follow_job(app, done.job, job_id, wait, doc if wait else None)


def status_document(status: Any, result: Any, chain: Any = None) -> dict[str, Any]:
    """`status --json`: Slurm's fields, each array task's, how the job ended and,
    for a supervised job, its chain's attempts."""
    from cluster_kit.lifecycle import chains

    doc = {name: str(value) if name == "exit_code" else value for name, value in status.items()}
    doc["job_id"] = status.job_id
    if status.tasks:
        doc["tasks"] = [dict(task.items()) | {"exit_code": str(task.exit_code) if task.exit_code else None}
                        for task in status.tasks]
    if result is not None:
        doc["outcome"] = result.as_dict()
    if chain is not None:
        doc["attempts"] = chains.attempt_summaries(chain)
        doc["chain"] = {"job_id": chain.chain_id, "current_job_id": chain.current_job_id,
                        "final": chain.final, "record": chain.path}
    return doc


def job_chain(runner: Any, job_id: str, status: Any) -> Any:
    """The chain of attempts of a supervised job (None for any other job), each of its
    restarts remembered so that a later command finds them after Slurm forgot them."""
    from cluster_kit import lifecycle

    if status.tasks:
        return None
    chain = lifecycle.find_chain(runner, job_id, status.stdout_path)
    if chain is not None:
        lifecycle.remember_chain(chain, lifecycle.where_key(runner))
    return chain


def attempt_rows(chain: Any) -> list[list[str]]:
    """One row per attempt: number, job, nodes, how it ended, the culprit and the nodes left out."""
    from cluster_kit.text import printable

    rows = []
    for attempt in chain.attempts:
        blamed = (attempt.get("culprit") or {}).get("evidence") or ""
        excluded = ",".join(map(str, attempt.get("excluded") or ()))
        culprit = "; ".join(part for part in (blamed, f"excluded {excluded}" if excluded else "") if part)
        job = str(attempt.get("step") or attempt.get("slurm_job_id"))  # `123.1`: a step of an allocation
        released = ",".join(map(str, attempt.get("released") or ()))
        culprit += f"; released {released}" if released else ""
        rows.append([str(attempt.get("attempt", "?")), job,
                     str(attempt.get("nodes") or "-"), str(attempt.get("ended")), culprit or "-"])
    return [[printable(cell) for cell in row] for row in rows]


@click.command()
@job_id_arg
@login_profile_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_app
def status(app: App, job_id: str, profile_ref: str | None, as_json: bool) -> None:
    """The job's state (squeue, then scontrol or sacct once it ended, then
    clusterkit's record once Slurm forgot it); how it ended."""
    from cluster_kit import lifecycle
    from cluster_kit.errors import printable
    from cluster_kit.lifecycle import chains
    from cluster_kit.text import format_table

    runner = job_runner(app, profile_ref, job_id)
    info = lifecycle.status_or_record(runner, job_id)
    result = lifecycle.job_outcome(runner, info, _launcher(job_id)) if info.finished else None
    chain = job_chain(runner, job_id, info)
    sweep = sweep_values(runner, job_id)
    if as_json:
        click.echo(json.dumps(with_sweep(status_document(info, result, chain), sweep), indent=2))
        return
    rows = [[k, str(v)] for k, v in info.items()]
    rows += [[f"task {t.job_id}", (f"{t.state} exit {t.exit_status}" if t.finished else t.state)
              + task_values_text(sweep, t.job_id)] for t in info.tasks]
    if sweep and not info.tasks:
        rows += [[f"task {job_id.split('_', 1)[0]}_{index}", describe(values)] for index, values in sweep.items()
                 if "_" not in job_id or job_id.endswith(f"_{index}")]
    click.echo(format_table(["FIELD", "VALUE"], rows))
    if info.source == "record":
        click.echo(f"Slurm no longer knows job {job_id}; shown from clusterkit's record", err=True)
    if result is not None:
        click.echo(result.explanation)
    if chain is not None:
        click.echo(format_table(["ATTEMPT", "JOB", "NODES", "ENDED", "CULPRIT"], attempt_rows(chain)))
        click.echo(printable(chains.progress(chain)))
        saved: list[str] = next((a["checkpoints"] for a in reversed(chain.attempts) if a.get("checkpoints")), [])
        for line in saved:  # the interval and why, the last save, anything set aside
            click.echo(printable(str(line)))


def sweep_values(runner: Any, job_id: str) -> dict[str, dict[str, Any]]:
    """{array index: {dotted key: value}} of a sweep's array job, from its record ({} for any other job)."""
    from cluster_kit.lifecycle import records, where_key

    record = records.find(job_id, where_key(runner))
    return {str(index): dict(values) for index, values in enumerate(record.sweep)} if record else {}


def task_index(task_id: str) -> str:
    """`12_3` -> `3` (a folded pending range `12_[4-9]` -> `[4-9]`)."""
    return task_id.partition("_")[2]


def task_values_text(sweep: dict[str, dict[str, Any]], task_id: str) -> str:
    values = sweep.get(task_index(task_id))
    return f" ({describe(values)})" if values else ""


def describe(values: dict[str, Any]) -> str:
    from cluster_kit.errors import printable
    from cluster_kit.render.array import describe as describe_values

    return printable(describe_values(values), keep_newlines=False)


def with_sweep(doc: dict[str, Any], sweep: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`status --json` of a sweep: `sweep` maps each array index to its values, and
    each task of `tasks` has its `values`."""
    if not sweep:
        return doc
    doc["sweep"] = sweep
    for task in doc.get("tasks", []):
        if task_index(str(task.get("job_id"))) in sweep:
            task["values"] = sweep[task_index(str(task["job_id"]))]
    if "_" in doc["job_id"]:
        doc["values"] = sweep.get(task_index(doc["job_id"]))
    return doc


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


def _launcher(job_id: str) -> str:
    from cluster_kit.lifecycle import records

    record = records.find(job_id)
    return record.launcher if record else "srun"


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


def output_files(runner: Any, job_id: str) -> dict[str, str]:
    """{job or task id: output path}: Slurm's, else the job's record."""
    from cluster_kit.lifecycle import records, where_key
    from cluster_kit.slurm import jobs

    paths = jobs.job_output_paths(runner, job_id)
    if paths:
        return paths
    record = records.find(job_id, where_key(runner))
    if record is not None and record.outputs:
        wanted = {k: v for k, v in record.outputs.items() if k == job_id}
        return wanted or dict(record.outputs)
    jobs.job_status(runner, job_id)  # a job Slurm does not know at all is said so
    raise ClusterRefused(f"Slurm {runner.where} no longer knows job {job_id}'s output file, "
                         "and clusterkit has no record of it",
                         fix="read the file the job's --output option names")


def echo_outputs(runner: Any, paths: dict[str, str], offsets: dict[str, int]) -> None:
    """Print each file from its offset on (a header per file when there are
    several, as tail does); advance the offsets."""
    from cluster_kit.slurm import jobs

    for task_id, path in paths.items():
        chunk = jobs.read_path(runner, path, offsets.get(task_id, 0))
        if chunk and len(paths) > 1:
            click.echo(f"==> {task_id}: {path} <==")
        click.echo(chunk, nl=False)
        offsets[task_id] = offsets.get(task_id, 0) + len(chunk.encode())


def chain_logs(runner: Any, chain: Any, follow: bool, launcher: str) -> None:
    """`logs` of a supervised job: every attempt's output; `-f` follows the chain's newest
    attempt, through its restarts, and exits with the chain's exit code."""
    from cluster_kit import lifecycle

    output = lifecycle.ChainOutput(runner)

    def echo(chain: Any, every: bool = False) -> None:
        click.echo(output.read(chain, every), nl=False)

    echo(chain, every=True)
    if not follow:
        return
    if chain.final is None:
        result = lifecycle.wait(runner, chain.current_job_id, poll=1.0, launcher=launcher, chain=chain,
                                on_status=lambda _s: echo(lifecycle.read_chain(runner, chain.folder) or chain),
                                on_restart=say_restart, cancel_never_start=False)
        chain = lifecycle.read_chain(runner, chain.folder) or chain
    else:
        result = None
    echo(chain)  # what the last attempt wrote while it ended
    if result is None:
        result = ended_chain_outcome(runner, chain, launcher)
    click.echo(result.explanation, err=True)
    # A job someone cancelled was stopped on purpose: only a failure is an error.
    exit_with(0 if result.state == "CANCELLED" else result.exit_status or 0)


def ended_chain_outcome(runner: Any, chain: Any, launcher: str) -> Any:
    """How an ended chain ended: its last job's outcome, else the record's alone."""
    from cluster_kit import lifecycle
    from cluster_kit.lifecycle import chains
    from cluster_kit.lifecycle.chain_diagnosis import chain_state

    try:
        status = lifecycle.status_or_record(runner, chain.current_job_id)
    except ClusterRefused:
        return lifecycle.Outcome(chain.current_job_id, chain_state(chain, None), chain.exit_code,
                                 f"job {chain.chain_id}: {chains.summary(chain)}")
    return lifecycle.chain_outcome(lifecycle.job_outcome(runner, status, launcher), chain)


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
    info = lifecycle.status_or_record(runner, job_id)
    chain = job_chain(runner, job_id, info)
    if chain is not None:
        chain_logs(runner, chain, follow, _launcher(job_id))
        return
    offsets: dict[str, int] = {}
    paths = output_files(runner, job_id)
    echo_outputs(runner, paths, offsets)
    if not any(offsets.values()) and info.phase == "pending":
        click.echo(f"{lifecycle.explain_status(info)}: no output yet", err=True)
    elif not any(offsets.values()) and info.finished and not follow:
        click.echo(f"{lifecycle.explain_status(info)}: it wrote no output", err=True)
    if not follow:
        return
    while not info.finished and info.source != "record":
        time.sleep(1.0)
        info = lifecycle.status_or_record(runner, job_id)
        paths = output_files(runner, job_id)
        echo_outputs(runner, paths, offsets)
    echo_outputs(runner, output_files(runner, job_id), offsets)  # what the job wrote while it ended
    if info.finished:
        result = lifecycle.job_outcome(runner, info, _launcher(job_id))
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
    from cluster_kit.lifecycle.diagnosis import diagnose as build
    from cluster_kit.text import printable

    doc = build(job_runner(app, profile_ref, job_id), job_id, _launcher(job_id))
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for line in diagnosis_lines(doc):
        click.echo(printable(line))


STACK_LINES = 6  # of a culprit rank's stack shown in diagnose's text


def diagnosis_lines(doc: dict[str, Any]) -> list[str]:
    """`diagnose`'s text: each attempt, its culprit and what came next; the chain's end; advice."""
    chain = "chain_id" in doc
    lines = []
    for attempt in doc["attempts"]:
        code = f" (exit code {attempt['exit_code']})" if chain and attempt.get("exit_code") is not None else ""
        found = (f", found after {attempt['detected_after_s']:g} s"
                 if isinstance(attempt.get("detected_after_s"), (int, float)) else "")
        step = f" step {attempt['step']}" if attempt.get("step") else ""
        lines.append(f"attempt {attempt['attempt']} (job {attempt['slurm_job_id']}{step}, nodes "
                     f"{attempt['nodes'] or '-'}): {attempt['ended']}{code}{found}")
        if attempt.get("explanation"):
            lines.append(f"  {attempt['explanation']}")
        if attempt.get("culprit"):
            lines.append(f"  culprit: {attempt['culprit']['evidence']}")
        if chain:
            lines += chain_attempt_lines(attempt)
    if chain:
        final = doc.get("final")
        end = (f"{final.get('why') or final.get('ended')} (exit code {final.get('exit_code')})" if final
               else "not over")
        lines.append(f"chain of job {doc['chain_id']}: {end}; Slurm state {doc['state']}")
    return lines + [f"advice: {line}" for line in doc["advice"]]


def chain_attempt_lines(attempt: dict[str, Any]) -> list[str]:
    """A supervised attempt's blamed ranks and hosts, excluded nodes, what came next, and
    the last lines of each culprit rank's stack."""
    lines = []
    if attempt.get("waited_s") is not None:
        lines.append(f"  waited {attempt['waited_s']:g} s to run after the attempt before it ended")
    culprit = attempt.get("culprit") or {}
    if culprit.get("ranks") or culprit.get("hosts"):
        ranks = ",".join(map(str, culprit.get("ranks") or ())) or "-"
        lines.append(f"  blamed: rank(s) {ranks} on {','.join(map(str, culprit.get('hosts') or ())) or '-'}")
    for rank in culprit.get("ranks") or ():
        stack = (attempt.get("stacks") or {}).get(str(rank))
        if stack:
            lines.append(f"  stack of rank {rank} (last lines):")
            lines += [f"    {line}" for line in [s for s in str(stack).splitlines() if s.strip()][-STACK_LINES:]]
    if attempt.get("excluded"):
        lines.append(f"  excluded from the next attempts: {','.join(map(str, attempt['excluded']))}")
    if attempt.get("released"):
        lines.append(f"  handed back to Slurm: {','.join(map(str, attempt['released']))}")
    lines += [f"  {line}" for line in attempt.get("checkpoints") or ()]
    if attempt.get("culprit", {}).get("kind") == "program":
        lines.append("  a program error: no node is blamed for it")
    if attempt.get("why"):
        after = f"; restarted as job {attempt['next_job_id']}" if attempt.get("next_job_id") else ""
        lines.append(f"  then: {attempt['why']}{after}")
    return lines
