"""Thin click commands: parse -> call the core -> echo. Registered on the group in cli.py.

`__all__` is the room's surface: the modules cli.py registers. options (shared options,
output files) and bench_ddp (bench ddp's profiling run) serve the commands only.
"""

__all__ = ["audit", "bench", "ddp", "init", "jobs", "local", "nodes"]
