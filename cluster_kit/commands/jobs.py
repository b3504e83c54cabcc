"""Commands about jobs: submit, status, cancel, logs."""
from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex
import sys
import time
from typing import Any

import click

from cluster_kit.app import App, pass_app
from cluster_kit.commands.options import profile_option, run_preflight_for
from cluster_kit.errors import CheckFailed, ClusterRefused, exit_with

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


def submit_script(app: App, job: Any, script: str, test_only: bool, dry_run: bool,
                  echo: bool = True) -> str | None:
    """sbatch the script (or print what would run): the job id, or Slurm's
    --test-only verdict; None for a dry run."""
    from cluster_kit.slurm import jobs

    if dry_run:
        click.echo(f"# {shlex.join(jobs.sbatch_argv(test_only))} < script")
        click.echo(script, nl=False)
        return None
    result = sbatch_job(app, job, script, test_only)
    if echo:
        click.echo(result)
    return result


def sbatch_job(app: App, job: Any, script: str, test_only: bool = False) -> str:
    """Make the output folder, then sbatch: the job id (or Slurm's test-only verdict)."""
    from cluster_kit.slurm import jobs

    runner = app.runner(job.profile.data)
    output_dir = job_output_dir(job)
    if output_dir and not test_only:
        runner.run(["mkdir", "-p", output_dir])
    return jobs.submit(runner, script, test_only=test_only)


def state_reporter(job_id: str) -> Any:
    """An on_status callback that says when the job's state or reason changes.

    Progress, so on stderr and only on a terminal. The reason tells the waiting
    user why a job pends; one that can never clear ends the wait (exit 3).
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


def expand_setting(value: str | None) -> list[str]:
    """A validated hostlist setting (slurm.nodelist/exclude) as node names."""
    from cluster_kit import hostlist

    return hostlist.expand(value) if value else []


def job_candidates(app: App, job: Any, settings: dict[str, Any]) -> Any:
    """The nodes Slurm could give the job (routing.candidate_nodes on sinfo's view)."""
    from cluster_kit.fleet import routing
    from cluster_kit.slurm import jobs

    slurm_settings = settings["slurm"]
    runner = app.runner(job.profile.data)
    rows = jobs.node_states(runner, slurm_settings["partition"])
    if not rows:
        raise ClusterRefused(f"sinfo lists no nodes for partition {slurm_settings['partition']!r} "
                             f"{runner.where}", fix="check slurm.partition against `sinfo -s`")
    pool = expand_setting(job.profile.data.get("nodes")) or [row.node for row in rows]
    candidates = routing.candidate_nodes(pool, rows, expand_setting(slurm_settings["nodelist"]),
                                         expand_setting(slurm_settings["exclude"]))
    if app.verbose:
        for node, why in candidates.left_out.items():
            app.log(f"not a candidate for the job: {node} ({why})")
    if not candidates.nodes:
        left = ", ".join(f"{node} ({why})" for node, why in candidates.left_out.items())
        raise CheckFailed(f"no node Slurm could give this job: {left or 'the partition is empty'}",
                          fix="resume or undrain nodes (clusterkit audit --undrain --apply), or check "
                              "nodes, slurm.partition, slurm.nodelist and slurm.exclude")
    return candidates


def preflight_and_route(app: App, job: Any, settings: dict[str, Any], strict: bool) -> tuple[Any, dict]:
    """Preflight the job's candidates; the route around failing ones and the report.

    Raises CheckFailed (exit 1, nothing submitted) when the route is refused.
    """
    from cluster_kit.fleet import routing
    from cluster_kit.report.preflight import preflight_table

    candidates = job_candidates(app, job, settings)
    # The job's own expectations: a job with gpus_per_node: 0 demands no GPUs of its nodes.
    checked = dataclasses.replace(job.profile, data={**job.profile.data, "expect": settings["expect"]})
    report, _facts = run_preflight_for(app, checked, candidates.nodes, deep=False)
    route = routing.plan_route(candidates, report, int(settings["nodes"]), strict,
                               expand_setting(settings["slurm"]["exclude"]))
    if route.refusal:
        raise CheckFailed(f"preflight failed; not submitting: {route.refusal}\n" + preflight_table(report),
                          fix=routing.refusal_fix(route, candidates))
    return route, report


def report_excluded(route: Any, report: dict) -> None:
    """One stderr line per node routed around, with its failing checks."""
    entries = {entry["node"]: entry for entry in report.get("nodes", [])}
    for node in route.excluded:
        checks = [f"{c['id']}: {c.get('message', '')}".rstrip(": ")
                  for c in entries[node].get("checks", []) if c.get("status") in ("fail", "unreachable")]
        click.echo(f"clusterkit: excluding {node} (--exclude): {'; '.join(checks)}", err=True)


def cancel_hint(job: Any, job_id: str) -> str:
    """`clusterkit cancel N`, with the `--profile` that reaches the job's login host."""
    if not (job.profile.data.get("login") or {}).get("host"):
        return f"clusterkit cancel {job_id}"
    ref = str(job.data.get("profile") or job.profile.path)
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        ref = str(job.profile.path.resolve())
    return f"clusterkit cancel {job_id} --profile {shlex.quote(ref)}"


def follow_job(app: App, job: Any, job_id: str, wait: bool) -> None:
    """After sbatch: exit 3 if Slurm can never start the job (cancelled under
    --wait); with --wait, exit with its exit code. Ctrl-C: exit 130, naming the job."""
    from cluster_kit.slurm import jobs

    runner = app.runner(job.profile.data)
    hint = cancel_hint(job, job_id)
    try:
        refused = jobs.never_start_refusal(runner, jobs.settle(runner, job_id))
        if refused is not None and wait:
            jobs.cancel(runner, job_id)
            raise ClusterRefused(f"{refused.message}; cancelled it", fix=refused.fix)
        if refused is not None:
            raise ClusterRefused(refused.message, fix=f"{refused.fix}; the job stays queued until you cancel it: {hint}")
        if not wait:
            return
        code = jobs.wait(runner, job_id, on_status=state_reporter(job_id), cancel_never_start=True)
    except KeyboardInterrupt:
        click.echo(f"job {job_id} is still running; stop it with: {hint}", err=True)
        exit_with(130)
    click.echo(f"job {job_id} finished with exit code {code}", err=True)
    exit_with(code)


def submit_document(job_id: str | None, route: Any, report: dict | None,
                    test_only: str | None = None) -> dict[str, Any]:
    """`submit --json`: job id, the nodes routed around with their checks, the preflight."""
    doc: dict[str, Any] = {"job_id": job_id, "excluded": dict(route.excluded) if route else {},
                           "preflight": report}
    if test_only is not None:
        doc["test_only"] = test_only
    return doc


@click.command()
@click.argument("job_file", type=JOB_FILE)
@click.option("--dry-run", is_flag=True, help="Print the sbatch command and script; submit nothing.")
@click.option("--test-only", is_flag=True, help="Ask Slurm whether the job could run (sbatch --test-only).")
@click.option("--no-preflight", is_flag=True, help="Skip the SSH preflight of the job's candidate nodes.")
@click.option("--strict", is_flag=True,
              help="Refuse the job when any candidate node fails preflight (default: --exclude it).")
@click.option("--wait", is_flag=True, help="Wait for the job; exit with its exit code.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON document on stdout: job id, excluded nodes, preflight report.")
@pass_app
def submit(app: App, job_file: str, dry_run: bool, test_only: bool, no_preflight: bool,
           strict: bool, wait: bool, as_json: bool) -> None:
    """Preflight the job's nodes, render and sbatch JOB_FILE; print the job id.

    Nodes failing preflight are excluded while enough healthy ones remain.
    """
    from cluster_kit.config.effective import effective
    from cluster_kit.render.environment import render_job

    if as_json and dry_run:
        raise click.UsageError("--json and --dry-run do not mix: --dry-run prints the script")
    job = app.checked_job(job_file, offline=dry_run)
    settings = effective(job)
    script = render_job(settings, app.search.template_dirs())  # bad input fails before any node is contacted
    route, report = None, None
    if not (dry_run or no_preflight):
        route, report = preflight_and_route(app, job, settings, strict)
        if route.excluded:
            settings["slurm"]["exclude"] = route.exclude_expr
            script = render_job(settings, app.search.template_dirs())
            report_excluded(route, report)
    result = submit_script(app, job, script, test_only, dry_run, echo=not as_json)
    job_id = None if (test_only or dry_run) else result
    if as_json:
        click.echo(json.dumps(submit_document(job_id, route, report, result if test_only else None), indent=2))
    if job_id:
        follow_job(app, job, job_id, wait)


@click.command()
@job_id_arg
@login_profile_option
@pass_app
def status(app: App, job_id: str, profile_ref: str | None) -> None:
    """The job's state (squeue, then sacct or scontrol once it ended)."""
    from cluster_kit.report.text import format_table
    from cluster_kit.slurm import jobs

    info = jobs.job_status(job_runner(app, profile_ref), job_id)
    click.echo(format_table(["FIELD", "VALUE"], [[k, str(v)] for k, v in info.items()]))


@click.command()
@job_id_arg
@login_profile_option
@pass_app
def cancel(app: App, job_id: str, profile_ref: str | None) -> None:
    """Cancel the job (scancel)."""
    from cluster_kit.slurm import jobs

    jobs.cancel(job_runner(app, profile_ref), job_id)
    click.echo(f"cancelled {job_id}")


def echo_output(runner: Any, job_id: str, offset: int) -> int:
    """Print the job's output from byte `offset` on; the offset after it."""
    from cluster_kit.slurm import jobs

    chunk = jobs.read_output(runner, job_id, offset)
    click.echo(chunk, nl=False)
    return offset + len(chunk.encode())


@click.command()
@job_id_arg
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@login_profile_option
@pass_app
def logs(app: App, job_id: str, follow: bool, profile_ref: str | None) -> None:
    """Print the job's output file."""
    from cluster_kit.slurm import jobs

    runner = job_runner(app, profile_ref)
    offset = echo_output(runner, job_id, 0)
    if not follow:
        return
    while not jobs.is_finished(runner, job_id):
        time.sleep(1.0)
        offset = echo_output(runner, job_id, offset)
    echo_output(runner, job_id, offset)  # what the job wrote while it ended
