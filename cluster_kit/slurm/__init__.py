"""Slurm: pure builders/parsers and fixes, the one runner (local or login node), job lifecycle.

`__all__` is the room's surface: the modules other rooms import.
"""

__all__ = ["builders", "jobs", "node_names", "outcome", "runner"]
