"""Scripts that run on nodes: standard library (and torch for the sweep) only; they import
nothing from cluster_kit, since they run where clusterkit is not installed.

`__all__` is the room's surface: the modules other rooms import (`clusterkit probe`
runs the probe here). Both scripts also travel as text: the probe over SSH and in job
scripts (fleet.preflight), allreduce_sweep.py in the sweep's job script (render.sweep).
"""

__all__ = ["probe"]
