"""Job scripts as text: quoting, the Jinja2 environment, sbatch and sweep scripts (nothing written).

`__all__` is the room's surface: the modules other rooms import. quoting, settings,
container and resilience serve environment.
"""

__all__ = ["array", "environment", "sweep"]
