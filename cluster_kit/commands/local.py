"""Commands that touch no cluster: validate, profiles list/show, render."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cluster_kit.app import App, pass_app
from cluster_kit.commands.options import parse_sets, set_option, write_output
from cluster_kit.errors import ValidationError


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(readable=False))
@click.option("--offline", is_flag=True,
              help="Touch no cluster: a job's script on the login host is not looked for.")
@set_option
@pass_app
def validate(app: App, files: tuple[str, ...], offline: bool, sets: tuple[str, ...]) -> None:
    """Check profiles and job files; print every problem as FILE:LINE: message.

    A job file's script must exist (on the login host, over SSH, when its profile
    has one) and its template must render.
    """
    from cluster_kit.config.load import validate_files

    problems = validate_files([Path(f) for f in files], app.search,
                              check_job=lambda job: validate_job(app, job, offline), overrides=parse_sets(sets))
    if problems:
        raise ValidationError(problems)
    click.echo(f"{len(files)} file(s) valid")


def validate_job(app: App, job: Any, offline: bool) -> list[tuple[str, str]]:
    """app.job_problems, saying on stderr which script --offline left unchecked."""
    from cluster_kit.slurm.runner import LoginRefused

    host = (job.profile.data.get("login") or {}).get("host")
    if offline and host:
        click.echo(f"clusterkit: note: {job.where('script')}: script {job.data['script']} not looked "
                   f"for on {host} (--offline)", err=True)
    try:
        return app.job_problems(job, offline)
    except LoginRefused as exc:
        exc.fix = f"{exc.fix}; or check the files alone: clusterkit validate --offline"
        raise


@click.group()
def profiles() -> None:
    """List and show cluster profiles on the search path."""


@profiles.command("list")
@pass_app
def profiles_list(app: App) -> None:
    """Every profile on the search path, first hit per name."""
    from cluster_kit.config.search import list_profiles
    from cluster_kit.text import format_table

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

    from cluster_kit.config.load import without_unset

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


@click.command("schema")
@click.argument("kind", type=click.Choice(["profile", "job"]), default="profile")
def schema_command(kind: str) -> None:
    """Print the JSON Schema (draft 2020-12) of profiles or job files, for editors."""
    import json

    from cluster_kit.config.json_schema import build

    click.echo(json.dumps(build(kind), indent=2))


@click.command()
@click.argument("job_file", type=click.Path(exists=True, readable=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the script here.")
@set_option
@pass_app
def render(app: App, job_file: str, output: str | None, sets: tuple[str, ...]) -> None:
    """Print (or write) the sbatch script of JOB_FILE; touches no cluster."""
    from cluster_kit.config.effective import effective
    from cluster_kit.render.environment import render_job

    job = app.checked_job(job_file, offline=True, overrides=parse_sets(sets))
    script = render_job(effective(job), app.search.template_dirs())
    if output:
        write_output("-o", output, script, "the script")
    else:
        click.echo(script, nl=False)

