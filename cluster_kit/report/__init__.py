"""Reports for people: preflight, audit (table/JSON/Markdown/HTML), all-reduce, step time,
the job commands' text.

`__all__` is the room's surface: the modules other rooms import. html (the HTML
reports' one Jinja2 environment) serves audit and step_time.
"""

__all__ = ["allreduce", "audit", "jobs", "preflight", "step_time"]
