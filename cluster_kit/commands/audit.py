"""`clusterkit audit`: fleet facts, drift, baseline changes, drain/undrain."""
from __future__ import annotations

import json
import shlex
import sys
from typing import Any

import click

from cluster_kit.app import App, pass_app
from cluster_kit.commands.options import (
    nodes_option,
    profile_option,
    run_preflight_for,
    select_nodes,
    write_output,
)
from cluster_kit.errors import ClusterKitError, InputError, exit_with

BASELINE_MAX_BYTES = 64 * 1024 * 1024


def load_baseline(path: str) -> dict[str, Any]:
    """A baseline written by --save-baseline; InputError (exit 2) otherwise.

    Read as profiles are (regular files only, UTF-8, no control characters), with a
    larger limit for fleets of thousands of nodes and no line limit (JSON may be one line).
    """
    from cluster_kit.config.textfile import TextFileError, read_text_file
    from cluster_kit.fleet.audit import check_baseline

    fix = "pass a file written by `clusterkit audit --save-baseline FILE`"
    try:
        text = read_text_file(path, max_bytes=BASELINE_MAX_BYTES, max_line_chars=None, what="baselines")
    except TextFileError as exc:
        raise TextFileError(exc.path, exc.line, exc.problem, f"{exc.fix}; or {fix}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not a JSON baseline: {exc.msg} (column {exc.colno})",
                         fix=fix) from None
    except RecursionError:
        raise InputError(f"{path}:1: not a baseline: nested too deeply", fix=fix) from None
    return check_baseline(document, path)


def slurm_view(app: App, profile: Any) -> Any:
    """Slurm's state and reason of the partition's nodes; None where Slurm is out of reach."""
    from cluster_kit.slurm import jobs

    partition = (profile.data.get("slurm") or {}).get("partition")
    try:
        return jobs.node_states(app.runner(profile.data), partition)
    except ClusterKitError as exc:
        click.echo(f"clusterkit: note: no Slurm node view ({exc.message})", err=True)
        return None


def drain_commands(audit: dict[str, Any], slurm_nodes: Any, drain: bool, undrain: bool) -> list[list[str]]:
    """The scontrol commands for --drain (failing nodes) or --undrain (ours, passing again)."""
    from cluster_kit.fleet import audit as fleet

    if drain:
        return fleet.build_drain_commands(fleet.drain_plan(audit))
    if undrain:
        return fleet.build_undrain_commands(fleet.undrain_plan(audit, slurm_nodes))
    return []


def apply_commands(app: App, profile: Any, commands: list[list[str]], apply: bool, out: Any) -> None:
    """Print the commands; with --apply run them (through login.host when set).

    "applied:" is printed only once Slurm accepted the command, so a refusal
    midway leaves an accurate list of what changed.
    """
    from cluster_kit.slurm import runner as slurm_runner

    runner = app.runner(profile.data) if apply else None
    for argv in commands:
        if runner is not None:
            slurm_runner.run_checked(runner, argv)
        click.echo(("applied: " if apply else "") + shlex.join(argv), file=out)
    if not commands:
        click.echo("no node to drain or undrain", file=out)


def echo_report(text: str, output: str | None) -> None:
    if output:
        write_output("-o", output, text, "the report")
    else:
        click.echo(text.rstrip("\n"))


def check_writable(path: str | None, option: str) -> None:
    """InputError (exit 2) before any probing when `path` cannot be written later:
    its folder is missing or not writable, or it is a folder itself."""
    import os

    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    problem = None
    if not os.path.isdir(folder):
        problem = f"the folder {folder} does not exist"
    elif os.path.isdir(path):
        problem = "it is a folder"
    elif not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        problem = "it is not writable"
    if problem:
        raise InputError(f"{option} {path}: cannot write there: {problem}",
                         fix="name a file in an existing folder you can write to")


def warn_other_profile(before: dict[str, Any] | None, profile: Any, source: str | None) -> None:
    """Say on stderr when the baseline belongs to another profile."""
    from cluster_kit.fleet.audit import baseline_profile_warning

    warning = baseline_profile_warning(before, profile.name, source or "") if before else None
    if warning:
        click.echo(f"clusterkit: warning: {warning}", err=True)


@click.command()
@profile_option
@nodes_option
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown", "html"]), default="table")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the report here.")
@click.option("--save-baseline", type=click.Path(dir_okay=False), help="Save the fleet's facts to FILE.")
@click.option("--baseline", type=click.Path(readable=False), help="Report changes since FILE.")
@click.option("--drain", is_flag=True, help="Drain the failing nodes (prints the commands; --apply runs them).")
@click.option("--undrain", is_flag=True, help="Return nodes that clusterkit drained and that pass now.")
@click.option("--apply", is_flag=True, help="Run the drain/undrain commands.")
@pass_app
def audit(app: App, profile_ref: str, nodes_expr: str | None, fmt: str, output: str | None,
          save_baseline: str | None, baseline: str | None, drain: bool, undrain: bool, apply: bool) -> None:
    """Fleet facts, drift between nodes, changes since a baseline, drain/undrain."""
    from cluster_kit.fleet import audit as fleet
    from cluster_kit.fleet.preflight import exit_code
    from cluster_kit.report.audit import render

    if (drain and undrain) or (apply and not (drain or undrain)):
        raise InputError("use either --drain [--apply] or --undrain [--apply]",
                         fix="without --apply the scontrol commands are printed, not run")
    check_writable(output, "-o")
    check_writable(save_baseline, "--save-baseline")
    before = load_baseline(baseline) if baseline else None
    profile = app.profile(profile_ref)
    warn_other_profile(before, profile, baseline)
    report, facts = run_preflight_for(app, profile, select_nodes(app, profile, nodes_expr), deep=False)
    slurm_nodes = slurm_view(app, profile)
    document = fleet.build_audit(profile.name, report, facts, baseline=before, slurm_nodes=slurm_nodes)
    if save_baseline:
        write_output("--save-baseline", save_baseline, json.dumps(fleet.save_baseline(document), indent=1),
                     "the baseline")
    echo_report(render(document, fmt), output)
    if drain or undrain:
        keep_stdout_clean = fmt in ("json", "html") and not output
        apply_commands(app, profile, drain_commands(document, slurm_nodes, drain, undrain), apply,
                       sys.stderr if keep_stdout_clean else sys.stdout)
    exit_with(exit_code(report))
