"""The fleet: preflight over SSH, flat facts, audit (drift, baselines, drain plans), routing.

`__all__` is the room's surface: the modules other rooms import.
"""

__all__ = ["audit", "facts", "preflight", "routing"]
