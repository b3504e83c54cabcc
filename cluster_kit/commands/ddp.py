"""Commands about a DDP step's time: `bench ddp` (profile a job) and `analyze` (traces)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cluster_kit.app import App, pass_app
from cluster_kit.commands.options import parse_sets, set_option, write_output
from cluster_kit.errors import CheckFailed, InputError

FORMATS = ("table", "json", "html")


def format_options(f: Any) -> Any:
    f = click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the report here.")(f)
    f = click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
                     help="table (default), json or html (one self-contained page).")(f)
    return click.option("--json", "as_json", is_flag=True, help="Same as --format json.")(f)


def pick_format(as_json: bool, fmt: str | None) -> str:
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} disagree; give one of them")
    return "json" if as_json else fmt or "table"


def emit(doc: dict[str, Any], results: list[Any], fmt: str, output: str | None) -> None:
    """Print (or write) the report in the chosen format."""
    from cluster_kit.analysis import report
    from cluster_kit.report import step_time

    if fmt == "json":
        text = json.dumps(doc, indent=2) + "\n"
    elif fmt == "html":
        text = step_time.render_html(doc, results)
    else:
        text = report.format_report(doc) + "\n"
    if not output:
        click.echo(text, nl=False)
        return
    write_output("-o", output, text, "the report")
    click.echo(f"wrote {output}", err=True)


def analysed(traces: list[Any], job_id: str | None, allreduce_rows: list[Any] | None,
             run: Any = None, done: Any = None) -> tuple[dict[str, Any], list[Any]]:
    """The report, with a bad trace turned into one error line.

    Traces the user pointed at (`analyze`) are bad input; those of a job
    clusterkit ran (`bench ddp`, `job_id` set) mean the job failed.
    """
    from cluster_kit.analysis.report import build_report
    from cluster_kit.analysis.traces import TraceError

    try:
        return build_report(traces, job_id, allreduce_rows, run, done)
    except TraceError as exc:
        if job_id is not None:
            raise CheckFailed(str(exc), fix=f"read the job's log: clusterkit logs {job_id}") from None
        raise InputError(str(exc), fix="point at a folder of torch.profiler Chrome traces, one per rank") from None


@click.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--allreduce-json", metavar="FILE", help="A `bench allreduce --json` result to set beside the collectives.")
@format_options
def analyze(folder: str, allreduce_json: str | None, as_json: bool, fmt: str | None, output: str | None) -> None:
    """Where each rank's step time goes, from PyTorch profiler traces in FOLDER."""
    from cluster_kit.analysis.pool import analyse_files
    from cluster_kit.analysis.traces import TraceError, folder_traces
    from cluster_kit.commands.bench_ddp import read_allreduce_json

    fmt = pick_format(as_json, fmt)
    rows = read_allreduce_json(allreduce_json) if allreduce_json else None
    try:
        traces, done = analyse_files(folder_traces(Path(folder)))
    except TraceError as exc:
        raise InputError(str(exc), fix="point at a folder of torch.profiler Chrome traces, one per rank") from None
    doc, results = analysed(traces, None, rows, done=done)
    emit(doc, results, fmt, output)


@click.command("ddp")
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--steps", type=int, default=20, show_default=True, help="Training steps to record per rank.")
@click.option("--sweep", is_flag=True, help="Run the DDP variants side by side in the job; compare step times.")
@click.option("--variant", "variants", multiple=True, metavar="NAME",
              help="With --sweep: only these variants (repeatable), e.g. bucket_cap_mb=100.")
@click.option("--allreduce-json", metavar="FILE", help="A `bench allreduce --json` result to set beside the collectives.")
@format_options
@set_option
@pass_app
def bench_ddp(app: App, job_file: str, steps: int, sweep: bool, variants: tuple[str, ...],
              allreduce_json: str | None, as_json: bool, fmt: str | None, output: str | None,
              sets: tuple[str, ...]) -> None:
    """Submit JOB_FILE with step profiling on; report where each rank's step time goes."""
    from cluster_kit import lifecycle
    from cluster_kit.analysis.report import SweepRun
    from cluster_kit.commands import bench_ddp as core
    from cluster_kit.commands.jobs import job_output_dir, sbatch_job, state_reporter
    from cluster_kit.config.effective import effective
    from cluster_kit.render.environment import render_job
    fmt = pick_format(as_json, fmt)
    if variants and not sweep:
        raise click.UsageError("--variant picks variants of --sweep; add --sweep")
    rows = core.read_allreduce_json(allreduce_json) if allreduce_json else None
    job = app.checked_job(job_file, overrides=parse_sets(sets))
    settings = effective(job, supervised=False)
    chosen = core.choose_variants(bool(settings["cuda_graphs"]), variants) if sweep else None
    trace_dir = core.profile_dir(job_output_dir(job), settings["workdir"])
    bench = core.bench_paths(trace_dir)
    script = render_job(core.profiled_settings(settings, steps, trace_dir), app.search.template_dirs(),
                        extra={"ddp_variants": chosen, "bench": bench})
    runner = app.runner(job.profile.data)
    runner.run(["mkdir", "-p", trace_dir])
    job_id = sbatch_job(app, job, script, settings)
    click.echo(f"submitted {job.data['name']} with {steps} profiled steps as job {job_id}; "
               f"traces go to {trace_dir}; each launch writes its checkpoints (CLUSTERKIT_CHECKPOINT_DIR) "
               f"and other output (CLUSTERKIT_SCRATCH_DIR) into {bench['scratch']}/<variant>, "
               "not the job's own folders", err=True)
    result = lifecycle.wait(runner, job_id, on_status=state_reporter(job_id))
    code = result.exit_status
    launches = core.read_launches(runner, bench["launches"])
    traces, unreadable = core.fetch_traces(runner, trace_dir, job_id, launches)
    if unreadable and not chosen:
        raise CheckFailed(next(iter(unreadable.values())), fix=f"read the job's log: clusterkit logs {job_id}")
    run = SweepRun(chosen, launches, unreadable) if chosen else None
    doc, results = analysed(traces, job_id, rows, run)
    emit(doc, results, fmt, output)
    if code:
        raise CheckFailed(result.explanation, fix=f"read the job's log: clusterkit logs {job_id}")
