"""Commands that look at nodes: preflight (over SSH) and probe (this machine)."""
from __future__ import annotations

import json

import click

from cluster_kit.app import App, pass_app
from cluster_kit.commands.options import (
    nodes_option,
    profile_option,
    run_preflight_for,
    select_nodes,
)
from cluster_kit.errors import exit_with


@click.command()
@profile_option
@nodes_option
@click.option("--deep", is_flag=True, help="Also import torch with environment.python on each node.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_app
def preflight(app: App, profile_ref: str, nodes_expr: str | None, deep: bool, as_json: bool) -> None:
    """SSH to the nodes, run the probe, evaluate the checks."""
    from cluster_kit.fleet.preflight import exit_code
    from cluster_kit.report.preflight import preflight_table

    profile = app.profile(profile_ref)
    report, _facts = run_preflight_for(app, profile, select_nodes(app, profile, nodes_expr), deep)
    click.echo(json.dumps(report, indent=2) if as_json else preflight_table(report))
    exit_with(exit_code(report))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="The facts as one JSON document.")
@click.option("--deep", "deep_python", metavar="PYTHON", help="Also import torch with PYTHON.")
def probe(as_json: bool, deep_python: str | None) -> None:
    """Run the node probe on this machine and print its facts."""
    from cluster_kit.fleet.facts import flatten
    from cluster_kit.node import probe as node_probe
    from cluster_kit.text import format_table

    facts = node_probe.collect(deep_python=deep_python)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    click.echo(format_table(["FACT", "VALUE"], sorted(flatten(facts).items())))
