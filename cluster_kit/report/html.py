"""The one Jinja2 environment of the HTML reports (audit, step time): autoescape on.

Every value of those pages came from a node or a trace, so every one is escaped;
JSON for tools travels through `tojson` (`<`, `>`, `&` and `'` escaped) in the
compact form below.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2

from cluster_kit.hostlist import NodeSet
from cluster_kit.render.environment import builtin_template_dir


def html_environment() -> jinja2.Environment:
    """Jinja2 over the built-in templates with autoescape on and compact JSON."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(builtin_template_dir())),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["count_nodes"] = lambda hostlist: len(NodeSet(hostlist))
    env.policies["json.dumps_kwargs"] = {"sort_keys": False, "separators": (",", ":")}
    return env


def render_page(template: str, context: Mapping[str, Any]) -> str:
    """A built-in HTML template (`audit.html.j2`) rendered with `context`."""
    return html_environment().get_template(template).render(context)
