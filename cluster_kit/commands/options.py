"""What the commands share: --profile/--nodes options, node selection, output files."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from cluster_kit.app import App
from cluster_kit.errors import InputError

if TYPE_CHECKING:
    from cluster_kit.hostlist import NodeSet


def profile_option(f: Callable | None = None, *, required: bool = True,
                   help: str = "Profile name or path (default: $CLUSTERKIT_PROFILE).") -> Callable:
    """The --profile option (name or path, $CLUSTERKIT_PROFILE) of every command.

    `@profile_option` for commands that need a profile, or
    `@profile_option(required=False, help=...)` where it only names the login host.
    """
    option = click.option("--profile", "profile_ref", envvar="CLUSTERKIT_PROFILE", required=required,
                          help=help)
    return option(f) if f is not None else option


def set_option(f: Callable) -> Callable:
    """`--set KEY=VALUE` (repeatable): a key of the job file, the value read as YAML."""
    return click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                        help="Set a key of the job file (dotted: slurm.time, env.LR; the value is read "
                             "as YAML), validated like the file (repeatable).")(f)


def parse_sets(sets: tuple[str, ...]) -> list[Any]:
    """The `--set` options as overrides (InputError, exit 2, for one that is not KEY=VALUE)."""
    from cluster_kit.config.overrides import parse_set

    return [parse_set(text) for text in sets]


def nodes_option(f: Callable) -> Callable:
    return click.option("--nodes", "nodes_expr", metavar="HOSTLIST",
                        help="Slurm hostlist; default: the profile's nodes, else sinfo -p PARTITION.")(f)


def select_nodes(app: App, profile: Any, nodes_expr: str | None) -> list[str]:
    """The nodes to look at, each once: --nodes, else the profile's `nodes`, else sinfo."""
    from cluster_kit.hostlist import NodeSet
    from cluster_kit.slurm import jobs

    if nodes_expr is not None and not nodes_expr.strip():
        raise InputError("--nodes is empty", fix="give a Slurm hostlist such as gpu[001-004,010], "
                         "or leave --nodes out to use the profile's nodes")
    expr = nodes_expr or profile.data.get("nodes")
    if expr:
        try:
            nodes = NodeSet(expr)
        except ValueError as exc:
            raise InputError(f"--nodes {expr!r}: {exc}", fix="write a Slurm hostlist such as gpu[001-004,010]")
        if nodes_expr:
            warn_outside(nodes, profile)
        return list(nodes)
    partition = (profile.data.get("slurm") or {}).get("partition")
    return jobs.partition_nodes(app.runner(profile.data), partition)


def nodes_outside(nodes: NodeSet, profile_nodes: str | None) -> NodeSet:
    """The nodes that the profile's `nodes` hostlist does not list (none when it lists none)."""
    from cluster_kit.hostlist import NodeSet

    return nodes - NodeSet(profile_nodes) if profile_nodes else NodeSet()


def warn_outside(nodes: NodeSet, profile: Any) -> None:
    """Say on stderr when --nodes names nodes the profile does not list: they are
    checked against this profile's expectations, which may not be theirs."""
    outside = nodes_outside(nodes, profile.data.get("nodes"))
    if outside:
        one = len(outside) == 1
        click.echo(f"clusterkit: warning: --nodes {outside} {'is' if one else 'are'} not in "
                   f"profile {profile.name}'s nodes ({profile.data['nodes']}); checking "
                   f"{'it' if one else 'them'} against its expectations anyway", err=True)


def write_output(option: str, path: str, text: str, what: str, replace: bool = True) -> None:
    """Write a file the user named with `option`; InputError (exit 2) when it cannot be.

    With `replace` false an existing file is left as it is (its command's --force replaces it).
    """
    try:
        with open(path, "w" if replace else "x") as handle:
            handle.write(text)
    except FileExistsError:
        raise InputError(f"{option} {path}: the file exists; nothing was written",
                         fix=f"pass --force to replace it, or choose another {option}") from None
    except OSError as exc:
        raise InputError(f"{option} {path}: cannot write {what}: {exc.strerror or exc}",
                         fix="write it into an existing folder you can write to") from None


def progress(total: int) -> Callable[[Any], None] | None:
    """A per-node progress callback on stderr, only on a terminal."""
    if not sys.stderr.isatty():
        return None
    done = [0]

    def tick(_result: Any) -> None:
        done[0] += 1
        click.echo(f"\rprobed {done[0]}/{total}", err=True, nl=done[0] == total)

    return tick


def run_preflight_for(app: App, profile: Any, nodes: list[str], deep: bool) -> tuple[dict, dict]:
    """Preflight `nodes` of `profile`: the report and the facts of each node."""
    from cluster_kit.fleet.preflight import run_preflight

    return run_preflight(nodes, profile.data, app.fan_out(profile.data, deep), deep=deep,
                         on_result=progress(len(nodes)))
