"""``build_step(..., compile=...)``: which torch.compile options, checked, and how a job passes them.

A job file's ``cuda_graphs: {compile: ...}`` reaches the trainer as one environment
variable, ``CLUSTERKIT_CUDA_GRAPHS_COMPILE``, that the job script exports
(:func:`env_value` writes it, :func:`options_from_env` reads it), so the job file's
validator (``config/specs.py``) and ``build_step`` share this module's rules.

The options are ``torch.compile``'s own keyword arguments, limited to those that
keep Inductor's kernels inside ``build_step``'s one CUDA graph: ``mode`` (only
the modes without CUDA graphs of their own), ``fullgraph``, ``dynamic`` and
``options`` (Inductor settings). Modes and settings that make Inductor record
CUDA graphs itself (``reduce-overhead``, ``max-autotune``,
``triton.cudagraphs``) are refused: its graphs cannot be recorded inside another
graph, and the whole step is captured already.

Imports only the stdlib: it runs in the trainer, and in the job file's validator,
where torch need not be.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

ENV_COMPILE = "CLUSTERKIT_CUDA_GRAPHS_COMPILE"
MODES = ("default", "max-autotune-no-cudagraphs")
# torch.compile's modes that record CUDA graphs of their own (cudagraph trees).
GRAPHING_MODES = ("reduce-overhead", "max-autotune")
KEYS = ("mode", "fullgraph", "dynamic", "options")
GRAPHING_OPTIONS = ("triton.cudagraphs", "triton.cudagraph_trees")
OPTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")

NESTED_GRAPHS = (
    "records CUDA graphs of its own, which cannot be recorded inside build_step's "
    "graph of the whole step"
)


def mode_problem(value: Any) -> str | None:
    """Why ``value`` is not a mode build_step compiles with; None if it is one."""
    if value in MODES:
        return None
    if value in GRAPHING_MODES:
        return (
            f"mode {value!r} {NESTED_GRAPHS}; use 'max-autotune-no-cudagraphs' "
            "(Inductor's autotuned kernels without its CUDA graphs) or 'default'"
        )
    return f"{value!r} is not one of {' | '.join(MODES)}"


def option_name_problem(name: Any) -> str | None:
    """Why ``name`` is not an Inductor setting build_step may pass; None if it may."""
    if not isinstance(name, str) or not OPTION_NAME.fullmatch(name):
        return (
            f"{name!r} is not an Inductor setting name; use a dotted name such as "
            "coordinate_descent_tuning or triton.unique_kernel_names"
        )
    if name in GRAPHING_OPTIONS:
        return f"{name} {NESTED_GRAPHS}; leave it out"
    return None


def option_value_problem(value: Any) -> str | None:
    """Why ``value`` cannot be an Inductor setting's value; None if it can."""
    if isinstance(value, (bool, int, float, str)):
        return None
    return f"expected true, false, a number or a string, got {type(value).__name__}"


def compile_options(value: Any) -> dict[str, Any] | None:
    """``build_step``'s ``compile`` argument as ``torch.compile`` keyword arguments, or None.

    False: not compiled (None). True or ``"default"``: torch.compile's defaults
    (``{}``). Another mode name: ``{"mode": name}``. A mapping: its keys (``mode``,
    ``fullgraph``, ``dynamic``, ``options``) as given. Anything else, and every mode
    or setting that records CUDA graphs itself, is refused with a ValueError that
    says what to write.
    """
    if value is False:
        return None
    if value is True or value == "default":
        return {}
    if isinstance(value, str):
        problem = mode_problem(value)
        if problem:
            raise ValueError(f"compile: {problem}")
        return {"mode": value}
    if isinstance(value, Mapping):
        return _checked_mapping(value)
    raise ValueError(
        f"compile={value!r}: use True, False, 'default', 'max-autotune-no-cudagraphs' "
        "or a dict of torch.compile arguments (mode, fullgraph, dynamic, options)"
    )


def _checked_mapping(value: Mapping[Any, Any]) -> dict[str, Any]:
    problems = [f"unknown key {key!r}" for key in value if key not in KEYS]
    if "mode" in value and (problem := mode_problem(value["mode"])):
        problems.append(f"mode: {problem}")
    for key in ("fullgraph", "dynamic"):
        if key in value and not isinstance(value[key], bool):
            problems.append(f"{key}: expected True or False, got {value[key]!r}")
    options = value.get("options", {})
    if not isinstance(options, Mapping):
        problems.append(f"options: expected a mapping of Inductor settings, got {options!r}")
        options = {}
    for name, setting in options.items():
        problem = option_name_problem(name) or option_value_problem(setting)
        if problem:
            problems.append(f"options.{name}: {problem}")
    if value.get("mode") is not None and options:
        problems.append("give mode or options, not both (torch.compile takes one of them)")
    if problems:
        raise ValueError(
            f"compile: {'; '.join(problems)} (valid keys: {', '.join(KEYS)})"
        )
    return {key: dict(v) if key == "options" else v for key, v in value.items()}


def env_value(options: Mapping[str, Any] | None) -> str | None:
    """What the job script exports as ``CLUSTERKIT_CUDA_GRAPHS_COMPILE``; None: nothing.

    ``1`` for torch.compile's defaults, the mode's name for a mode alone, else the
    options as compact JSON (keys sorted, so the same options render alike).
    """
    if options is None:
        return None
    if not options:
        return "1"
    if set(options) == {"mode"}:
        return "1" if options["mode"] == "default" else str(options["mode"])
    return json.dumps(dict(options), sort_keys=True, separators=(",", ":"))


def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The options ``CLUSTERKIT_CUDA_GRAPHS_COMPILE`` asks for; None when unset, empty or 0."""
    env = os.environ if environ is None else environ
    text = env.get(ENV_COMPILE, "").strip()
    if text in ("", "0"):
        return None
    if text == "1":
        return {}
    try:
        value: Any = json.loads(text) if text.startswith("{") else text
        return compile_options(value)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError too
        raise ValueError(
            f"{ENV_COMPILE}={text!r}: {exc}; the job file's cuda_graphs: {{compile: ...}} "
            "writes it (1, a mode name, or JSON of torch.compile arguments)"
        ) from None
