"""Effective job settings -> sbatch script text.

Pure but for reading templates (through `textfile.read_text_file`, as profiles
and jobs are read): nothing here reads job files, runs processes or writes
files. Beyond the standard library it imports only jinja2, schema.py,
textfile.py (which config.py has already loaded on the way here) and the pure
slurm.py, so `clusterkit render` stays fast.

Quoting rules the templates rely on:
- every user value in the shell body goes through the `shq` filter (POSIX
  single quotes, `shlex.quote` semantics) and every variable *name* through
  `shname`;
- every `#SBATCH` value goes through `sbatch_value`, which refuses anything
  that could end the line or be read by sbatch as a separator;
- embedded Python sources (preflight) go into quoted heredocs whose delimiter
  is chosen so that it never occurs in the source.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from cluster_kit import container
from cluster_kit.errors import InputError
from cluster_kit.launch import launch_shape
from cluster_kit.report import CONTROL_CHARS
from cluster_kit.schema import ENV_NAME_RE
from cluster_kit.slurm import SBATCH_OPTION_NAME, SBATCH_VALUE_KEYS
from cluster_kit.textfile import read_text_file

# Bare #SBATCH values need none of sbatch's quoting; anything else is quoted.
_SBATCH_BARE = re.compile(r"[A-Za-z0-9_.,:/%@+=^~-]+\Z")
# sbatch reads a line containing either word as a heterogeneous-job separator.
_HETJOB_WORDS = ("hetjob", "packjob")
# Linux hands out ephemeral ports from 32768 up; a derived port stays below.
LAUNCHERS = ("srun", "torchrun")
MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 10000

# Which effective-settings key each #SBATCH option comes from (for messages).
_SETTING_FOR_OPTION = {
    "job-name": "name",
    "nodes": "nodes",
    "ntasks-per-node": "ntasks_per_node",
    "gpus-per-node": "gpus_per_node",
    "cpus-per-task": "slurm.cpus_per_task",
    "mem": "slurm.mem",
    "time": "slurm.time",
    "partition": "slurm.partition",
    "account": "slurm.account",
    "qos": "slurm.qos",
    "constraint": "slurm.constraint",
    "nodelist": "slurm.nodelist",
    "exclude": "slurm.exclude",
    "exclusive": "slurm.exclusive",
    "output": "output",
    "chdir": "workdir",
}


# ---------------------------------------------------------------------------
# Quoting filters


def shq(value: Any) -> str:
    """Quote one value as a single POSIX shell word (`shlex.quote` semantics).

    Numbers and booleans are quoted as their text; None is refused because it
    always means a template forgot to test whether a setting is unset.
    """
    if value is None:
        raise InputError(
            "a template quoted an unset value",
            fix="guard optional settings with `{% if x is not none %}` in the template",
        )
    quoted = shlex.quote(_text(value))
    # A bare word starting with "=" is valid shell, but `export X==y` reads as
    # a typo to people and to shellcheck; single quotes change nothing else.
    return f"'{quoted}'" if quoted.startswith("=") else quoted


def shjoin(values: Sequence[Any]) -> str:
    """Quote each value with `shq` and join them with spaces (an argv)."""
    return " ".join(shq(value) for value in values)


def shname(name: Any) -> str:
    """Pass through a shell variable name, refusing anything that is not one."""
    text = str(name)
    if not ENV_NAME_RE.fullmatch(text):
        raise InputError(
            f"{text!r} is not a valid environment variable name",
            fix="use letters, digits and underscores, not starting with a digit",
        )
    return text


def sbatch_value(value: Any, option: str = "") -> str:
    """Render one `#SBATCH --option=VALUE` value, or refuse it.

    sbatch splits `#SBATCH` lines itself: whitespace separates words, `"` and
    `'` quote, `\\` escapes and an unquoted `#` starts a comment. Plain values
    are written bare; others are double-quoted with `\\` and `"` escaped.
    Control characters (newline, CR, NUL, ...) and the words `hetjob`/`packjob`
    cannot be made safe and raise InputError naming the setting.
    """
    text = _text(value)
    where = _describe_option(option)
    bad = next((ch for ch in text if ord(ch) < 0x20 or ord(ch) == 0x7F), None)
    if bad is not None:
        raise InputError(
            f"{where}: value {text!r} contains the control character {bad!r}; "
            "#SBATCH values must be one line",
            fix="remove the newline or control character from the value",
        )
    lowered = text.lower()
    for word in _HETJOB_WORDS:
        if word in lowered:
            raise InputError(
                f"{where}: value {text!r} contains {word!r}, which sbatch reads as a "
                "heterogeneous-job separator",
                fix=f"choose a value without {word!r}",
            )
    if _SBATCH_BARE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def oneline(value: Any) -> str:
    """Text safe inside a `#` comment line: control characters become spaces."""
    return CONTROL_CHARS.sub(" ", _text(value))


def _describe_option(option: str) -> str:
    if not option:
        return "#SBATCH value"
    setting = _SETTING_FOR_OPTION.get(option, f"slurm.sbatch.{option}")
    return f"{setting} (#SBATCH --{option})"


def _text(value: Any) -> str:
    """The text of a setting value: booleans as `true`/`false`, the rest as str()."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---------------------------------------------------------------------------
# Settings -> data the templates consume


def nccl_environment(network: Mapping[str, Any]) -> dict[str, str]:
    """Map a profile's (job-overridden) network settings to NCCL/GLOO variables.

    Order is fixed: the mapped keys as listed below, then `nccl_env` extras in
    the order given. An extra that names a mapped variable replaces its value.
    """
    env: dict[str, str] = {}
    if network.get("fabric") == "ethernet":
        env["NCCL_IB_DISABLE"] = "1"
    hcas = _hca_text(network.get("ib_hca"))
    if hcas:
        env["NCCL_IB_HCA"] = hcas
    for key, name in (
        ("gid_index", "NCCL_IB_GID_INDEX"),
        ("ib_timeout", "NCCL_IB_TIMEOUT"),
    ):
        if network.get(key) is not None:
            env[name] = _text(network[key])
    ifname = network.get("socket_ifname")
    if ifname:
        env["NCCL_SOCKET_IFNAME"] = str(ifname)
        env["GLOO_SOCKET_IFNAME"] = str(ifname)
    if network.get("debug"):
        env["NCCL_DEBUG"] = str(network["debug"])
    for name, value in (network.get("nccl_env") or {}).items():
        env[shname(name)] = _nccl_value(value)
    return env


def _hca_text(hcas: None | str | Sequence[str]) -> str:
    """`[mlx5_0:1, mlx5_3:1]` -> `=mlx5_0:1,mlx5_3:1` (`=` makes NCCL match exactly)."""
    if not hcas:
        return ""
    if isinstance(hcas, str):
        return hcas  # already in NCCL's own syntax (`^mlx5_1`, `=mlx5_0`, ...)
    return "=" + ",".join(str(hca) for hca in hcas)


def _nccl_value(value: Any) -> str:
    """NCCL reads booleans as 1/0."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def sbatch_directives(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The `#SBATCH` options of a job as (long option, value) pairs, in a fixed order.

    A flag option (`--exclusive`) has the value "". Values are raw text; the
    template passes each through `sbatch_value`.
    """
    slurm = settings.get("slurm") or {}
    shape = launch_shape(settings)
    pairs: list[tuple[str, Any]] = [
        ("job-name", settings.get("name")),
        ("nodes", settings.get("nodes")),
        ("ntasks-per-node", shape.tasks_per_node),
        ("gpus-per-node", settings.get("gpus_per_node")),
    ]
    # cpus-per-task is the shape's: a torchrun task holds the CPUs of all its workers
    pairs += [(key.replace("_", "-"), shape.cpus_per_task if key == "cpus_per_task" else slurm.get(key))
              for key in SBATCH_VALUE_KEYS]
    pairs.append(("exclusive", _flag(slurm.get("exclusive"))))
    pairs += [("output", settings.get("output")), ("chdir", settings.get("workdir"))]
    for option, value in (slurm.get("extra") or {}).items():
        pairs.append((_checked_option(option), _flag(value)))
    return [(option, _text(value)) for option, value in pairs if value is not None]


def _flag(value: Any) -> Any:
    """true -> "" (a bare flag), false/None -> None (left out), text as is."""
    if value is True:
        return ""
    if value is False:
        return None
    return value


def _checked_option(option: Any) -> str:
    text = str(option)
    if not SBATCH_OPTION_NAME.match(text):
        raise InputError(
            f"slurm.sbatch: {text!r} is not an sbatch long option name",
            fix="write the option without the leading -- in lower case, e.g. mail-type",
        )
    return text


# ---------------------------------------------------------------------------
# Containers

# Inside an image the probe needs the image's own python3; without one, say so.
_NEEDS_PYTHON3 = (
    'python3 -c "import json, ctypes, resource" 2>/dev/null || { echo "clusterkit: node $(hostname): '
    'the container image has no python3 with its standard library, which the in-job preflight runs '
    'the probe with; add it to the image (e.g. apt-get install -y python3) or set preflight: false" '
    '>&2; exit 1; }; '
)


def container_context(settings: Mapping[str, Any], nccl_env: Mapping[str, str]) -> dict[str, Any]:
    """The template's `container`: shell text to splice into srun lines ("" without one).

    `srun`: the pyxis flags, with a leading space; `exec`: Apptainer's `apptainer
    exec ... IMAGE ` prefix; `probe_guard`: the python3 test before the probe;
    `env_names`: the exported names the container must take from the host.
    """
    launch = container.launch(settings, nccl_env)
    if launch is None:
        return {"runtime": None, "image": None, "srun": "", "exec": "", "probe_guard": "",
                "env_names": []}
    return {
        "runtime": launch["runtime"],
        "image": launch["image"],
        "srun": "".join(" " + shq(flag) for flag in launch["srun_flags"]),
        "exec": "".join(shq(word) + " " for word in launch["exec"]),
        "probe_guard": _NEEDS_PYTHON3,
        "env_names": launch["env_names"],
    }


# ---------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------
# Jinja2


def builtin_template_dir() -> Path:
    """The built-in templates: cluster_kit/templates in a wheel, templates/ in a checkout."""
    # imported here: config loads yaml, which importing render must not
    from cluster_kit.config import builtin_dir

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
        "container": container_context(settings, nccl_env),
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
    }


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
    # Inside: config.py loads yaml, which this module keeps out of its imports.
    from cluster_kit.config import template_lookup

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
    from cluster_kit.injob import checks_source
    from cluster_kit.preflight import probe_source

    checked = {"name": settings["profile_name"], "network": settings["network"], "expect": settings["expect"]}
    return {"probe_source": probe_source(), "checks_source": checks_source(checked)}


def _template_location(exc: BaseException) -> str:
    """FILE:LINE of the innermost template frame of a render-time error."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(".j2")
    ]
    if not frames:
        return "template"
    return f"{frames[-1].filename}:{frames[-1].lineno}"
