"""The Jinja2 environment (StrictUndefined, the quoting filters) and rendering."""
from __future__ import annotations

import os
import posixpath
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from cluster_kit.config.launch import launch_shape
from cluster_kit.config.textfile import read_text_file
from cluster_kit.errors import InputError
from cluster_kit.render import container
from cluster_kit.render.quoting import oneline, sbatch_value, shjoin, shname, shq
from cluster_kit.render.settings import (
    LAUNCHERS,
    MASTER_PORT_BASE,
    MASTER_PORT_SPAN,
    nccl_environment,
    sbatch_directives,
)

# ----------------------------------------------------------------------------
# Preflight heredocs


@dataclass(frozen=True)
class Heredoc:
    """Text to place in a quoted heredoc, with a delimiter it does not contain."""

    delimiter: str
    body: str


def build_heredoc(text: str, base: str) -> Heredoc:
    """Pick `base`, `base_1`, ... so the delimiter occurs nowhere in the text."""
    if "\0" in text:
        raise InputError(f"the embedded {base} text contains a NUL byte")
    delimiter, n = base, 0
    while delimiter in text:
        n += 1
        delimiter = f"{base}_{n}"
    body = text if text.endswith("\n") else text + "\n"
    return Heredoc(delimiter, body)


def build_preflight(
    settings: Mapping[str, Any], probe_source: str | None, checks_source: str | None
) -> dict[str, Heredoc | None] | None:
    """The heredocs of the in-job preflight, or None when it does not run."""
    if not settings.get("preflight") or not probe_source:
        return None
    checks = (
        build_heredoc(checks_source, "CLUSTERKIT_CHECKS") if checks_source else None
    )
    return {"probe": build_heredoc(probe_source, "CLUSTERKIT_PROBE"), "checks": checks}


# ----------------------------------------------------------------------------
# Jinja2


def builtin_template_dir() -> Path:
    """The built-in templates: cluster_kit/templates in a wheel, templates/ in a checkout."""
    # imported here: config loads yaml, which importing render must not
    from cluster_kit.config.search import builtin_dir

    return builtin_dir("templates")


class GuardedLoader(jinja2.FileSystemLoader):
    """A FileSystemLoader that reads through `textfile.read_text_file`: a template that
    is a FIFO, a device, binary, not UTF-8 or over 1 MiB is an InputError naming it
    (and its line), never a hang or a traceback."""

    def get_source(self, environment: jinja2.Environment,
                   template: str) -> tuple[str, str, Callable[[], bool]]:
        pieces = jinja2.loaders.split_template_path(template)
        for searchpath in self.searchpath:
            filename = posixpath.join(searchpath, *pieces)
            if os.path.exists(filename) and not os.path.isdir(filename):
                break
        else:
            raise jinja2.TemplateNotFound(template)
        contents = read_text_file(filename, what="templates")
        mtime = os.path.getmtime(filename)

        def uptodate() -> bool:
            try:
                return os.path.getmtime(filename) == mtime
            except OSError:
                return False

        return contents, os.path.normpath(filename), uptodate


def make_environment(template_dirs: Sequence[Path]) -> jinja2.Environment:
    """A strict Jinja2 environment over the template search dirs, with the quoting filters."""
    env = jinja2.Environment(
        loader=GuardedLoader([str(d) for d in template_dirs]),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shq"] = shq
    env.filters["shjoin"] = shjoin
    env.filters["shname"] = shname
    env.filters["sbatch_value"] = sbatch_value
    env.filters["oneline"] = oneline
    return env


def build_context(
    settings: Mapping[str, Any],
    probe_source: str | None = None,
    checks_source: str | None = None,
) -> dict[str, Any]:
    """Everything a template sees besides the filters (see templates/README.md)."""
    if settings.get("launcher") not in LAUNCHERS:
        raise InputError(
            f"launcher: {settings.get('launcher')!r} is not one of {', '.join(LAUNCHERS)}"
        )
    environment = settings.get("environment") or {}
    master_port = settings.get("master_port")
    shape = launch_shape(settings)
    nccl_env = nccl_environment(settings.get("network") or {})
    return {
        "settings": settings,
        "directives": sbatch_directives(settings),
        "nccl_env": nccl_env,
        "container": container.template_context(settings, nccl_env),
        "launch": {
            "ntasks_per_node": shape.tasks_per_node,
            "nproc_per_node": shape.workers_per_node,
            "cpus_per_task": shape.cpus_per_task,
            "python": environment.get("python") or "python3",
            "master_port": int(master_port) if master_port is not None else None,
            "master_port_base": MASTER_PORT_BASE,
            "master_port_span": MASTER_PORT_SPAN,
        },
        "preflight": build_preflight(settings, probe_source, checks_source),
        "supervisor": _supervisor(settings),
    }


def _supervisor(settings: Mapping[str, Any]) -> dict[str, Any] | None:
    """The supervisor of a job with `resilience:`: its settings and its zip app as a heredoc."""
    from cluster_kit.render.resilience import supervisor_context

    context = supervisor_context(settings)
    if context is None:
        return None
    return {"settings": context["settings"], "bundle": build_heredoc(context["source"], "CLUSTERKIT_SUPERVISOR")}


def render_script(
    settings: Mapping[str, Any],
    template_dirs: Sequence[Path],
    template: str = "ddp",
    probe_source: str | None = None,
    checks_source: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Render the sbatch script for effective job settings; returns text, writes nothing.

    `extra` adds variables for templates that need more than a job's settings
    (the all-reduce sweep's embedded source, say).

    `template` is a name on the search dirs (`ddp` -> `ddp.j2`) or a path to a
    `.j2` file, whose own directory is searched first so it can include the
    built-in partials. Template errors raise InputError naming FILE:LINE.
    """
    # Imported here, not at the top: rendering needs only this part of config/.
    from cluster_kit.config.search import template_lookup

    dirs, name = template_lookup(template, template_dirs)
    env = make_environment(dirs)
    try:
        context = build_context(settings, probe_source, checks_source)
        return env.get_template(name).render({**context, **(extra or {})})
    except jinja2.TemplateNotFound as exc:
        searched = ", ".join(str(d) for d in dirs) or "(no directories)"
        raise InputError(
            f"template {exc.name!r} not found (searched {searched})",
            fix="check `template:` in the job file or the --profile-path/CLUSTERKIT_PATH dirs",
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        where = f"{exc.filename or exc.name}:{exc.lineno}"
        raise InputError(f"{where}: template syntax error: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise InputError(f"{_template_location(exc)}: template error: {exc}") from None
    except RecursionError:
        raise InputError(f"template {name}: nested too deeply to read",
                         fix="flatten the nesting of its expressions and blocks") from None


def render_job(settings: Mapping[str, Any], template_dirs: Sequence[Path], template: str | None = None,
               extra: Mapping[str, Any] | None = None) -> str:
    """A job's sbatch script from its effective settings, the in-job preflight
    embedded when `preflight` is on; `template` overrides the job's own."""
    sources = _embedded_sources(settings) if settings.get("preflight") else {}
    return render_script(settings, template_dirs, template or settings["template"], extra=extra, **sources)


def _embedded_sources(settings: Mapping[str, Any]) -> dict[str, str]:
    """Probe and checks embedded in a script that runs the in-job preflight."""
    from cluster_kit.checks.injob import checks_source
    from cluster_kit.fleet.preflight import probe_source

    environment = settings["environment"]
    checked = {"name": settings["profile_name"], "network": settings["network"], "expect": settings["expect"],
               "environment": {"python": environment["python"], "setup": environment["setup"]}}
    return {"probe_source": probe_source(), "checks_source": checks_source(checked)}


def _template_location(exc: BaseException) -> str:
    """FILE:LINE of the innermost template frame of a render-time error."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(".j2")
    ]
    if not frames:
        return "template"
    return f"{frames[-1].filename}:{frames[-1].lineno}"
