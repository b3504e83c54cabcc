"""The `clusterkit` command line: the click group and the one funnel from
exceptions to exit codes. The commands live in cluster_kit/commands/.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from cluster_kit import __version__
from cluster_kit.app import App
from cluster_kit.commands.audit import audit
from cluster_kit.commands.bench import bench
from cluster_kit.commands.ddp import analyze
from cluster_kit.commands.init import init
from cluster_kit.commands.jobs import (
    cancel,
    diagnose,
    jobs_command,
    logs,
    status,
    submit,
)
from cluster_kit.commands.local import profiles, render, schema_command, validate
from cluster_kit.commands.nodes import preflight, probe


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


for _command in (profiles, render, schema_command, validate, submit, status, cancel, logs, diagnose, jobs_command,
                 bench, preflight,
                 probe, audit, init, analyze):
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
    except click.Abort as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            click.echo("clusterkit: interrupted", err=True)
            return 130
        click.echo("Aborted!", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("clusterkit: interrupted", err=True)
        return 130
    except OSError as exc:  # a file the user named cannot be read or written
        click.echo(f"clusterkit: error: {exc.filename or ''}: {exc.strerror or exc}", err=True)
        return 2
    return result if isinstance(result, int) else 0
