"""The `clusterkit` command line: each command parses, calls the core, echoes.

Heavy or networked modules (paramiko through remote.py) are imported inside the
commands that need them, so `clusterkit render` stays fast.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from cluster_kit import __version__
from cluster_kit.app import App, pass_app
from cluster_kit.cli_audit import audit
from cluster_kit.cli_ddp import analyze, bench_ddp
from cluster_kit.cli_init import init
from cluster_kit.cli_jobs import bench, cancel, logs, status, submit
from cluster_kit.cli_nodes import preflight, probe, write_output
from cluster_kit.errors import ValidationError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--profile-path", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False),
              help="Directory searched first for profiles and templates (repeatable).")
@click.option("--verbose", "-v", is_flag=True, help="Say more about what is done.")
@click.version_option(__version__, prog_name="clusterkit")
@click.pass_context
def cli(ctx: click.Context, profile_path: tuple[str, ...], verbose: bool) -> None:
    """Render, check and submit multi-node PyTorch jobs on Slurm."""
    ctx.obj = App(profile_path, verbose)


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(readable=False))
@click.option("--offline", is_flag=True,
              help="Touch no cluster: a job's script on the login host is not looked for.")
@pass_app
def validate(app: App, files: tuple[str, ...], offline: bool) -> None:
    """Check profiles and job files; print every problem as FILE:LINE: message.

    A job file's script must exist (on the login host, over SSH, when its profile
    has one) and its template must render.
    """
    from cluster_kit.config import validate_files

    problems = validate_files([Path(f) for f in files], app.search,
                              check_job=lambda job: validate_job(app, job, offline))
    if problems:
        raise ValidationError(problems)
    click.echo(f"{len(files)} file(s) valid")


def validate_job(app: App, job: Any, offline: bool) -> list[tuple[str, str]]:
    """app.job_problems, saying on stderr which script --offline left unchecked."""
    from cluster_kit.slurm_runner import LoginRefused

    host = (job.profile.data.get("login") or {}).get("host")
    if offline and host:
        click.echo(f"clusterkit: note: {job.where('script')}: script {job.data['script']} not looked "
                   f"for on {host} (--offline)", err=True)
    try:
        return app.job_problems(job, offline)
    except LoginRefused as exc:
        exc.fix = f"{exc.fix}; or check the files alone: clusterkit validate --offline"
        raise


@cli.group()
def profiles() -> None:
    """List and show cluster profiles on the search path."""


@profiles.command("list")
@pass_app
def profiles_list(app: App) -> None:
    """Every profile on the search path, first hit per name."""
    from cluster_kit.config import list_profiles
    from cluster_kit.report import format_table

    rows = [[name, str(path)] for name, path in list_profiles(app.search)]
    click.echo(format_table(["NAME", "PATH"], rows))


@profiles.command("show")
@click.argument("name")
@pass_app
def profiles_show(app: App, name: str) -> None:
    """Print one profile fully resolved (extends merged, defaults applied).

    Unset keys are left out, so what is printed is itself a valid profile.
    """
    import yaml

    from cluster_kit.config import without_unset

    profile = app.profile(name)
    click.echo(f"# {profile.path}")
    click.echo(yaml.dump(without_unset(profile.data), Dumper=_profile_dumper(), sort_keys=False).rstrip())


def _quote_colons(dumper: Any, value: str) -> Any:
    """Strings with a colon are quoted ("04:00:00"): plain YAML 1.1 reads some of them as numbers."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if ":" in value else None)


def _profile_dumper() -> Any:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(str, _quote_colons)
    return Dumper


@cli.command("schema")
@click.argument("kind", type=click.Choice(["profile", "job"]), default="profile")
def schema_command(kind: str) -> None:
    """Print the JSON Schema (draft 2020-12) of profiles or job files, for editors."""
    import json

    from cluster_kit.json_schema import build

    click.echo(json.dumps(build(kind), indent=2))


@cli.command()
@click.argument("job_file", type=click.Path(exists=True, readable=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the script here.")
@pass_app
def render(app: App, job_file: str, output: str | None) -> None:
    """Print (or write) the sbatch script of JOB_FILE; touches no cluster."""
    from cluster_kit.config import effective
    from cluster_kit.render import render_job

    script = render_job(effective(app.checked_job(job_file, offline=True)), app.search.template_dirs())
    if output:
        write_output("-o", output, script, "the script")
    else:
        click.echo(script, nl=False)


bench.add_command(bench_ddp)
for _command in (submit, status, cancel, logs, bench, preflight, probe, audit, init, analyze):
    cli.add_command(_command)


def main() -> None:
    """Console entry point: the one place where outcomes become exit codes.

    Commands raise (`ClusterKitError` and its family carry their SPEC exit code;
    `ExitStatus` a verdict already printed); nothing else calls `sys.exit`.
    """
    sys.exit(run_to_exit_code(lambda: cli.main(prog_name="clusterkit", standalone_mode=False)))


def run_to_exit_code(invoke: Callable[[], Any]) -> int:
    """Run `invoke` and map what it raised to one message and an exit code."""
    try:
        result = invoke()
    except click.ClickException as exc:  # ClusterKitError family, usage errors
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("clusterkit: interrupted", err=True)
        return 130
    except OSError as exc:  # a file the user named cannot be read or written
        click.echo(f"clusterkit: error: {exc.filename or ''}: {exc.strerror or exc}", err=True)
        return 2
    return result if isinstance(result, int) else 0
