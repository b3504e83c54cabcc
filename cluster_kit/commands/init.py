"""`clusterkit init --from-node HOST`: probe live nodes, write the profile they imply."""
from __future__ import annotations

import datetime
import os
import shlex
from pathlib import Path
from typing import Any

import click

from cluster_kit.app import App, pass_app
from cluster_kit.commands.options import write_output
from cluster_kit.errors import CheckFailed, InputError


def probe_nodes(nodes: list[str], fan_out: Any) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """Facts of each node that answered, and (node, problem, fix) for each that did not."""
    from cluster_kit.commands.options import progress
    from cluster_kit.fleet.preflight import (
        build_probe_command,
        node_findings,
        probe_source,
    )

    results = fan_out(nodes, build_probe_command("python3"), stdin=probe_source().encode(),
                      on_result=progress(len(nodes)))
    facts, failed = {}, []
    for result in results:
        _status, findings, node_facts = node_findings(result, {}, deep=False)
        if node_facts is None:
            finding = findings[0]
            failed.append((result.host, f"{finding.status}: {finding.message}", init_fix(finding.fix)))
        else:
            facts[result.host] = node_facts
    return facts, failed


def init_fix(fix: str) -> str:
    """A fix worded for a profile's users, said for `init`, which has no profile yet."""
    from cluster_kit.fleet.preflight import AUTH_FIX, REACH_FIX
    from cluster_kit.ssh import ACCEPT_NEW_IN_PROFILE

    said_for_init = {
        ACCEPT_NEW_IN_PROFILE: ("rerun init with --accept-new (it records a new host's key on first use; "
                                "a changed key is still refused)"),
        AUTH_FIX: "check User and IdentityFile of the node in the ssh_config (--ssh-config, default ~/.ssh/config), "
                  "or ssh-agent",
        REACH_FIX: ("check that the node is up and sshd answers (HostName, ProxyJump and ConnectTimeout of the "
                    "node in the ssh_config)"),
    }
    for profile_words, init_words in said_for_init.items():
        fix = fix.replace(profile_words, init_words)
    return fix


def node_list(host: str, nodes_expr: str | None) -> list[str]:
    """HOST first, then the --nodes hostlist, each once."""
    from cluster_kit import hostlist

    if nodes_expr is not None and not nodes_expr.strip():
        raise InputError("--nodes is empty", fix="give a Slurm hostlist such as gpu[001-004], or leave it out")
    try:
        more = hostlist.NodeSet(nodes_expr) if nodes_expr else hostlist.NodeSet()
    except ValueError as exc:
        raise InputError(f"--nodes {nodes_expr!r}: {exc}", fix="write a Slurm hostlist such as gpu[001-004,010]")
    return list(dict.fromkeys([host, *more]))


def header(command: str, nodes: list[str], outliers: list[str]) -> list[str]:
    """The comment block on top of the written profile."""
    today = datetime.date.today().isoformat()
    lines = [f"Written by `{command}` on {today}", f"from the probe of {', '.join(nodes)}.",
             "Each value's comment says where it came from; check it with:",
             "  clusterkit preflight --profile THIS_FILE"]
    if outliers:
        lines += ["", "Nodes that differ from the majority (preflight will say so):"]
        lines += [f"  {line}" for line in outliers]
    return lines + [""]


def check_written(text: str, data: dict[str, Any]) -> None:
    """The YAML text reads back as `data` and passes the profile spec."""
    import yaml

    from cluster_kit.config import spec, specs

    problems = spec.check(data, specs.PROFILE)
    if yaml.safe_load(text) != data or problems:
        shown = "; ".join(message for _, message in problems) or "the YAML does not read back"
        raise InputError(f"the derived profile is not valid: {shown}",
                         fix="report this with the output of `clusterkit probe --json` on the node")


@click.command("init")
@click.option("--from-node", "host", required=True, metavar="HOST",
              help="The node to learn from (ties between nodes go its way).")
@click.option("--nodes", "nodes_expr", metavar="HOSTLIST",
              help="More nodes to probe (Slurm hostlist); the majority of all wins.")
@click.option("--ssh-config", type=click.Path(exists=True, dir_okay=False),
              help="ssh_config to resolve the nodes through (default ~/.ssh/config).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the profile here (default: stdout).")
@click.option("--force", is_flag=True, help="Replace an existing -o file.")
@click.option("--accept-new", is_flag=True,
              help="Record the host key of a node not in known_hosts yet (as OpenSSH's "
                   "StrictHostKeyChecking=accept-new); a changed key is still refused.")
@pass_app
def init(app: App, host: str, nodes_expr: str | None, ssh_config: str | None, output: str | None,
         force: bool, accept_new: bool) -> None:
    """Probe live nodes over SSH and write the cluster profile they imply."""
    from cluster_kit.config.init_profile import (
        derive,
        profile_name,
        render_profile,
        ssh_section,
    )
    from cluster_kit.ssh import SshSettings, resolve

    if output and os.path.exists(output) and not force:
        raise InputError(f"-o {output}: the file exists; nothing was written",
                         fix="pass --force to replace it, or choose another -o")
    nodes = node_list(host, nodes_expr)
    config_file = os.path.abspath(ssh_config) if ssh_config else None
    ssh = {"config_file": config_file} if config_file else {}
    if accept_new:
        ssh["host_key_policy"] = "accept-new"
    facts, failed = probe_nodes(nodes, app.fan_out({"ssh": ssh}))
    for node, problem, fix in failed:
        click.echo(f"clusterkit: {node}: {problem}\n  fix: {fix}", err=True)
    if host not in facts:
        raise CheckFailed(f"{host} could not be probed, so there is nothing to learn from; nothing was written",
                          fix=failed[0][2] if failed else None)
    endpoint, options = resolve(host, SshSettings.from_profile(ssh))
    derived = derive(facts, ssh_section(endpoint, options, config_file, host),
                     profile_name(Path(output).stem if output else host))
    command = shlex.join(["clusterkit", "init", "--from-node", host]
                         + (["--nodes", nodes_expr] if nodes_expr else [])
                         + (["--ssh-config", ssh_config] if ssh_config else [])
                         + (["--accept-new"] if accept_new else [])
                         + (["-o", output] if output else []))
    text = render_profile(derived, header(command, list(facts), derived.outliers))
    check_written(text, derived.data())
    for line in derived.outliers:
        click.echo(f"outlier: {line}", err=True)
    if output:
        write_output("-o", output, text, "the profile", replace=force)
        click.echo(f"wrote {output} from {len(facts)} node(s); check it with: clusterkit preflight --profile {output}")
    else:
        click.echo(text, nl=False)
    if failed:
        raise CheckFailed(f"{len(failed)} node(s) could not be probed and were left out: "
                          + ", ".join(node for node, _, _ in failed),
                          fix="fix them, or leave them out of --nodes")
